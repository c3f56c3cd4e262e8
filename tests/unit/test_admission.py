"""The pure pieces of admission.py: what a queued run says, and when a placement is whole.
The waiting, the lock and gang admission are tested on the real stack (tests/stack/test_queueing.py)."""

from __future__ import annotations

import time

from nomadtf import wire
from nomadtf.admission import (
    QueuedLine,
    QueueStatus,
    _all_placed,
    _ClusterView,
    identity,
    queue_overview,
    queue_status,
)
from nomadtf.capacity import NodeCapacity, Resources
from nomadtf.plan import NOT_NOW, Placement
from nomadtf.queue import Entry, QueuedRun

GPU = "nvidia/gpu/Tesla-V100-SXM2-16GB"


def status(**fields):
    base = dict(
        label="team-a/digits", run_id="3f2a9c1e", place=1, length=2, since=time.mktime((2026, 1, 1, 10, 5, 12, 0, 0, -1)),
        needs=Resources(3380, 1800), capacity=Resources(5200, 24105, {GPU: 6}), free=Resources(1820, 22305, {GPU: 6}),
        holders=[("team-b/digits", Resources(3380, 1800))],
    )  # fmt: skip
    base.update(fields)
    return QueueStatus(**base)


def test_the_head_says_what_it_needs_what_is_free_who_holds_it_and_since_when():
    assert status().describe() == (
        "team-a/digits run 3f2a9c1e does not fit now: needs cpu 3380 MHz, memory 1800 MB; "
        "free cpu 1820 of 5200 MHz, memory 22305 of 24105 MB; held by team-b/digits (cpu 3380 MHz, memory 1800 MB); "
        "place 1 of 2 in the queue since 10:05:12"
    )


def test_a_run_behind_others_counts_them_and_names_only_devices_it_asks_for():
    text = status(place=3, length=3, needs=Resources(100, 100, {"nvidia/gpu": 2}), free=Resources(1820, 22305, {GPU: 1})).describe()
    assert "waits behind 2 run(s) ahead of it" in text and "place 3 of 3" in text
    assert "nvidia/gpu 1 of 6" in text
    assert GPU not in status().describe()  # a job without GPUs is not told about them


def _waiting(view: _ClusterView) -> str:
    """What team-b's run (3380 MHz in all) says at the head of the queue, from `view`."""
    job = {"Job": {"ID": "digits", "Namespace": "team-b", "Meta": {"nomadtf.run": "3f2a9c1e"}, "TaskGroups": [
        {"Name": "chief", "Count": 1, "Tasks": [{"Name": "chief", "Resources": {"CPU": 3380, "MemoryMB": 1800}}]}]}}  # fmt: skip
    ticket = wire.queue_ticket("team-b", "digits", "3f2a9c1e")
    entry = Entry("team-b", ticket, 50, 0.0, key=wire.kv_queue_entry("team-b", ticket), order=1)
    return queue_status(job, entry, [entry], Placement(NOT_NOW), view).describe()


def _running(job, ns, cpu):
    return {"Namespace": ns, "JobID": job, "NodeID": "n1", "ClientStatus": "running",
            "AllocatedResources": {"Tasks": {"t": {"Cpu": {"CpuShares": cpu}, "Memory": {"MemoryMB": 100}}}}}  # fmt: skip


def test_what_the_token_cannot_see_is_said_without_names():
    node = [NodeCapacity("n1", "n1", Resources(5200, 24105))]
    # team-a's job holds 3380 MHz. A token that may read team-a's allocations names it ...
    seen = _waiting(_ClusterView(node, [_running("secret-project", "team-a", 3380)], 1))
    assert "held by team-a/secret-project (cpu 3380 MHz" in seen and "cannot read" not in seen and "free cpu 1820 of 5200 MHz" in seen
    # ... team-b's token is answered only its own allocations: the plan says no room, what it
    # sees says there is, so the rest is held by someone it cannot read, never named.
    hidden = _waiting(_ClusterView(node, [_running("small", "team-b", 100)], 1))
    assert "team-a" not in hidden and "secret-project" not in hidden, hidden
    assert "held by team-b/small" in hidden and "the rest is held by jobs your token cannot read" in hidden, hidden


def test_a_token_without_node_read_is_told_so_not_zero_of_zero():
    text = _waiting(_ClusterView([], [_running("small", "team-b", 100)], 1, nodes_readable=False))
    assert "the node totals are not readable with this token" in text and "0 of 0" not in text, text
    assert "cannot read" not in text  # without the totals nothing can be said about hidden holders


def test_status_lists_a_queued_run_with_what_it_needs_and_lacks_now():
    record = QueuedRun("team-a", "digits", "3f2a9c1e", "t", time.mktime((2026, 1, 1, 10, 5, 12, 0, 0, -1)), attended=False)
    line = QueuedLine(record, 2, 3, 50, Resources(3380, 1800, {"nvidia/gpu": 2}))
    assert line.describe() == (
        "queued: run 3f2a9c1e at place 2 of 3 since 10:05:12, priority 50, needs cpu 3380 MHz, memory 1800 MB, nvidia/gpu x2"
        " (for the admission service)"
    )
    short = line.with_free(Resources(1820, 22305, {GPU: 1})).describe()
    assert "; short of cpu 1560 MHz, nvidia/gpu x1 now (for the admission service)" in short, short
    assert "short of" not in line.with_free(Resources(9000, 99999, {GPU: 8})).describe()


def test_admission_status_names_only_the_namespaces_the_token_may_use():
    entries = [Entry(ns, f"t{i}", prio, 0.0, attended=att, key=f"k{i}", order=i)
               for i, (ns, prio, att) in enumerate([("team-a", 50, True), ("team-b", 90, False)])]  # fmt: skip
    assert queue_overview(entries, {"team-a"}) == [
        "  1. another namespace, priority 90, for the admission service",
        "  2. namespace team-a, priority 50, followed by its submitter",
    ]
    assert "team-b" in queue_overview(entries, {"team-a", "team-b"})[0]


def test_a_placement_is_whole_when_every_group_of_that_version_has_its_count():
    counts = {"chief": 1, "worker": 2}
    allocs = [{"JobVersion": 3, "TaskGroup": "chief"}, {"JobVersion": 3, "TaskGroup": "worker"}]
    assert not _all_placed(allocs, 3, counts)
    assert not _all_placed([*allocs, {"JobVersion": 2, "TaskGroup": "worker"}], 3, counts)  # an older attempt's
    assert not _all_placed([*allocs, {"JobVersion": 3, "TaskGroup": "worker", "DesiredStatus": "stop"}], 3, counts)
    assert _all_placed([*allocs, {"JobVersion": 3, "TaskGroup": "worker", "ClientStatus": "complete"}], 3, counts)


def test_identity_reads_namespace_job_and_run_of_a_rendered_job():
    job = {"Job": {"ID": "digits", "Namespace": "team-a", "Meta": {"nomadtf.run": "3f2a9c1e"}}}
    assert identity(job) == ("team-a", "digits", "3f2a9c1e")
    assert identity({"Job": {"ID": "x"}}) == ("default", "x", "")
