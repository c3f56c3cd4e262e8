"""The pure pieces of admission.py: what a queued run says, and when a placement is whole.
The waiting, the lock and gang admission are tested on the real stack (tests/stack/test_queueing.py)."""

from __future__ import annotations

import time

from nomadtf.admission import QueueStatus, _all_placed, identity
from nomadtf.capacity import Resources

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


def test_what_the_token_cannot_see_is_said_without_names():
    text = status(holders=[], hidden=True).describe()
    assert "team-b" not in text and "held by jobs your token cannot read" in text


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
