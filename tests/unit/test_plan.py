"""Nomad plan results explained in words. The results are written in the shape Nomad 1.6
returns from PUT /v1/job/:job_id/plan (JobPlanResponse with AllocMetric per failed group)."""

from __future__ import annotations

from nomadtf.plan import describe_plan, explain_placement_failure, requested_devices
from nomadtf.render import render_job
from nomadtf.spec import load_spec
from tests.helpers import EXAMPLES

GPU_JOB = render_job(load_spec(EXAMPLES / "gpu" / "job.json"))["Job"]


def alloc_metric(**fields):
    """An AllocMetric as Nomad 1.6 serialises it: every field present, most of them null."""
    metric = {
        "NodesEvaluated": 3,
        "NodesFiltered": 0,
        "NodesInPool": 3,
        "NodesAvailable": {"dc1": 3},
        "ClassFiltered": None,
        "ConstraintFiltered": None,
        "NodesExhausted": 0,
        "ClassExhausted": None,
        "DimensionExhausted": None,
        "QuotaExhausted": None,
        "ResourcesExhausted": None,
        "Scores": None,
        "ScoreMetaData": None,
        "AllocationTime": 48211,
        "CoalescedFailures": 0,
    }
    metric.update(fields)
    return metric


def plan_result(diff_type, updates, failed=None):
    return {
        "Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": None},
        "CreatedEvals": None,
        "Diff": {"Fields": None, "ID": "digits-gpu", "Objects": None, "TaskGroups": [], "Type": diff_type},
        "FailedTGAllocs": failed,
        "JobModifyIndex": 0,
        "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
        "Warnings": "",
        "Index": 0,
    }


def tg_updates(place=0, ignore=0, stop=0):
    return {
        "Ignore": ignore, "Place": place, "Migrate": 0, "Stop": stop, "InPlaceUpdate": 0,
        "DestructiveUpdate": 0, "Canary": 0, "Preemptions": 0,
    }  # fmt: skip


def test_a_new_job_that_fits_lists_what_is_placed():
    result = plan_result(
        "Added", {"chief": tg_updates(place=1), "worker": tg_updates(place=2), "ps": tg_updates(place=1)}
    )
    summary = describe_plan(result, GPU_JOB)
    assert summary.changes and not summary.failures
    assert summary.lines == ["job diff: added", "  chief: place 1", "  ps: place 1", "  worker: place 2"]


def test_an_unchanged_job_has_no_changes():
    summary = describe_plan(plan_result("None", {"worker": tg_updates(ignore=2)}), GPU_JOB)
    assert not summary.changes and not summary.failures
    assert summary.lines == ["job diff: none", "  worker: ignore 2"]


def test_no_gpu_on_any_node_names_the_device_asked_for():
    failed = {
        "worker": alloc_metric(
            NodesExhausted=3,
            DimensionExhausted={"devices: no devices match request": 3},
            CoalescedFailures=1,
        )
    }
    summary = describe_plan(plan_result("Added", {"worker": tg_updates(place=2)}, failed), GPU_JOB)
    assert summary.failures
    assert summary.lines[-1] == (
        "worker: cannot be placed: not enough free nvidia/gpu x2: on 3 of 3 nodes the matching devices are fewer than asked "
        "or in use by other allocations "
        "(devices: no devices match request); 2 allocations affected"
    )


def test_a_node_without_the_device_plugin_is_filtered():
    line = explain_placement_failure(
        "chief", alloc_metric(NodesFiltered=3, ConstraintFiltered={"missing devices": 3}), ["nvidia/gpu x1"]
    )
    assert line == "chief: cannot be placed: no node offers nvidia/gpu x1: 3 of 3 nodes have no matching device (missing devices)"


def test_constraint_filtered_and_memory_exhausted_are_both_reported():
    metric = alloc_metric(
        NodesEvaluated=5,
        NodesAvailable={"dc1": 3, "dc2": 2},
        NodesFiltered=2,
        ConstraintFiltered={"${attr.kernel.name} = linux": 2},
        NodesExhausted=3,
        DimensionExhausted={"memory": 3},
    )
    line = explain_placement_failure("ps", metric)
    assert line.startswith("ps: cannot be placed: ")
    assert "2 of 5 nodes filtered by constraint ${attr.kernel.name} = linux" in line
    assert "3 of 5 nodes have too little memory" in line


def test_distinct_hosts_and_node_class_filters_are_named():
    metric = alloc_metric(
        NodesFiltered=3, ConstraintFiltered={"distinct_hosts": 2}, ClassFiltered={"cpu-small": 1}
    )
    line = explain_placement_failure("ps", metric)
    assert "2 of 3 nodes filtered by constraint distinct_hosts" in line
    assert "1 nodes of class cpu-small filtered" in line


def test_no_ready_client_says_so():
    line = explain_placement_failure(
        "worker", alloc_metric(NodesEvaluated=0, NodesInPool=0, NodesAvailable={"dc1": 0})
    )
    assert line == "worker: cannot be placed: no client node is ready in the job's datacenters"


def test_quota_exhaustion_is_reported():
    line = explain_placement_failure(
        "worker", alloc_metric(QuotaExhausted=["memory exhausted (4096 needed > 2048 limit)"])
    )
    assert "quota exhausted: memory exhausted (4096 needed > 2048 limit)" in line


def test_requested_devices_per_group_from_the_rendered_job():
    assert requested_devices(GPU_JOB) == {"chief": ["nvidia/gpu x1"], "worker": ["nvidia/gpu x2"], "ps": []}
    assert requested_devices(None) == {}
