"""Nomad plan results explained in words. The results are written in the shape Nomad 1.6
returns from PUT /v1/job/:job_id/plan (JobPlanResponse with AllocMetric per failed group)
and read through the views the Nomad adapter builds (job/answers.py: PlanResult, AllocMetric)."""

from __future__ import annotations

from nomadtf.job.answers import AllocMetric, PlanResult
from nomadtf.job.capacity import NodeCapacity, Resources
from nomadtf.job.plan import (
    FITS,
    NEVER,
    NOT_NOW,
    classify,
    describe_plan,
    requested_devices,
)
from nomadtf.job.plan import explain_placement_failure as explain_metric
from nomadtf.job.render import render_job
from nomadtf.job.spec import load_spec, parse_spec
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


def explain_placement_failure(group, metric, *args, **kwargs):
    """plan.explain_placement_failure of an AllocMetric's JSON, read as the adapter reads it."""
    return explain_metric(group, AllocMetric.from_api(metric), *args, **kwargs)


def plan_result(diff_type, updates, failed=None):
    return PlanResult.from_api({
        "Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": None},
        "CreatedEvals": None,
        "Diff": {"Fields": None, "ID": "digits-gpu", "Objects": None, "TaskGroups": [], "Type": diff_type},
        "FailedTGAllocs": failed,
        "JobModifyIndex": 0,
        "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
        "Warnings": "",
        "Index": 0,
    })


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


# ---- distinct_hosts and node_class, as Nomad 1.6.1 reports them ---------------------------


def distinct_hosts_metric(filtered: int, exhausted: int = 0, nodes: int = 3) -> dict:
    """The AllocMetric Nomad 1.6.1 returns for the allocation of a distinct_hosts group that
    found no node left (read from the several-client stack's plan endpoint)."""
    return alloc_metric(
        NodesEvaluated=nodes,
        NodesFiltered=filtered,
        NodesInPool=nodes,
        NodesAvailable={"dc1": nodes},
        # Nomad counts every filtered node under its class too (the stack's clients have one each).
        ClassFiltered={f"nomadtf-client-{i}": 1 for i in range(1, filtered + 1)},
        ConstraintFiltered={"distinct_hosts": filtered},
        NodesExhausted=exhausted,
        DimensionExhausted={"memory": exhausted} if exhausted else None,
        AllocationTime=61234,
    )


def test_more_distinct_hosts_than_eligible_nodes_is_said_in_words():
    line = explain_placement_failure("worker", distinct_hosts_metric(3), wanted=4)
    assert line == "worker: cannot be placed: distinct_hosts asks for 4 different nodes, only 3 are eligible"


def test_a_node_that_passed_distinct_hosts_but_is_full_counts_as_eligible():
    line = explain_placement_failure("worker", distinct_hosts_metric(2, exhausted=1), wanted=4)
    assert line.startswith("worker: cannot be placed: distinct_hosts asks for 4 different nodes, only 3 are eligible; ")
    assert "1 of 3 nodes have too little memory" in line


def test_the_plan_takes_the_count_from_the_rendered_job():
    spec = {"name": "place", "entrypoint": {"script": "train.py"}, "roles": {"chief": {}, "worker": {"count": 4, "distinct_hosts": True}, "ps": {}}}
    rendered = render_job(parse_spec(spec))["Job"]
    result = PlanResult.from_api({
        "Diff": {"Type": "Added"},
        "Annotations": {"DesiredTGUpdates": {"worker": {"Place": 4}}},
        "FailedTGAllocs": {"worker": distinct_hosts_metric(3)},
    })
    summary = describe_plan(result, rendered)
    assert summary.failures
    assert "worker: cannot be placed: distinct_hosts asks for 4 different nodes, only 3 are eligible" in summary.lines


def test_node_class_with_distinct_hosts_as_nomad_reports_it():
    """Worker count 3, node_class naming one client of three, distinct_hosts: the metric
    Nomad 1.6.1's plan returned on the several-client stack."""
    metric = {
        **distinct_hosts_metric(1),
        "ClassFiltered": {"nomadtf-client-3": 1, "nomadtf-client-2": 1, "nomadtf-client-1": 1},
        "NodesFiltered": 3,
        "ConstraintFiltered": {"computed class ineligible": 2, "distinct_hosts": 1},
        "CoalescedFailures": 1,
    }
    line = explain_placement_failure("worker", metric, wanted=3)
    assert line == (
        "worker: cannot be placed: 2 of 3 nodes do not meet the group's constraints (node_class, constraints); "
        "distinct_hosts asks for 3 different nodes, only 1 is eligible; 2 allocations affected"
    )


# ---- never or not now --------------------------------------------------------------------


def _nodes(*cpus, gpus=0):
    return [NodeCapacity(f"n{i}", f"n{i}", Resources(cpu, 24000, {"nvidia/gpu/Tesla-V100-SXM2-16GB": gpus})) for i, cpu in enumerate(cpus)]


def _job(**groups):
    """A rendered job's shape: group -> (count, cpu, gpus per task)."""
    task_groups = []
    for name, (count, cpu, gpus) in groups.items():
        resources = {"CPU": cpu, "MemoryMB": 500, "Devices": [{"Name": "nvidia/gpu", "Count": gpus}] if gpus else None}
        task_groups.append({"Name": name, "Count": count, "Tasks": [{"Name": name, "Resources": resources}]})
    return {"Job": {"ID": "j", "Datacenters": ["*"], "TaskGroups": task_groups}}


def _cpu_exhausted(group, nodes=1):
    return {group: alloc_metric(NodesEvaluated=nodes, NodesExhausted=nodes, DimensionExhausted={"cpu": nodes}, NodesAvailable={"dc1": nodes})}


def test_a_plan_that_places_everything_fits():
    assert classify(plan_result("Added", {"w": tg_updates(place=1)}), _job(w=(1, 100, 0)), _nodes(5200)).verdict == FITS


def test_capacity_in_use_is_not_now():
    placement = classify(plan_result("Added", {}, _cpu_exhausted("chief")), _job(chief=(1, 3380, 0)), _nodes(5200))
    assert placement.verdict == NOT_NOW and not placement.why_never
    assert placement.reasons == ["chief: cannot be placed: 1 of 1 nodes have too little cpu"]


def test_more_than_any_node_has_is_never_and_says_so():
    placement = classify(plan_result("Added", {}, _cpu_exhausted("chief")), _job(chief=(1, 9000, 0)), _nodes(5200, 5200))
    assert placement.verdict == NEVER
    assert placement.why_never == "a chief allocation asks cpu 9000 MHz; the largest node offers 5200 MHz"
    assert placement.failure_text().startswith("the job cannot be placed:\n  chief: cannot be placed: ")


def test_the_whole_job_beyond_the_cluster_is_never_though_each_task_fits_a_node():
    # The issue's two teams: 65 % each fits (not now); one job of 120 % never does.
    assert classify(plan_result("Added", {}, _cpu_exhausted("worker")), _job(chief=(1, 3000, 0), worker=(1, 3000, 0)), _nodes(5200)).verdict == NEVER
    gpus = classify(plan_result("Added", {}, {"worker": alloc_metric(NodesEvaluated=1, NodesExhausted=1, DimensionExhausted={"devices: no devices match request": 1})}),
                    _job(worker=(2, 100, 6)), _nodes(5200, gpus=6))  # fmt: skip
    assert gpus.verdict == NEVER and gpus.why_never == "the whole job asks nvidia/gpu x12; the 1 node(s) it may use offer x6 in all"


def test_constraints_nothing_satisfies_and_no_ready_node_are_never():
    filtered = {"chief": alloc_metric(NodesEvaluated=3, NodesFiltered=3, ConstraintFiltered={"missing devices": 3})}
    placement = classify(plan_result("Added", {}, filtered), _job(chief=(1, 100, 1)), _nodes(5200, 5200, 5200))
    assert placement.verdict == NEVER and placement.why_never.startswith("chief: no node meets its constraints")
    nobody = {"chief": alloc_metric(NodesEvaluated=0)}
    assert classify(plan_result("Added", {}, nobody), _job(chief=(1, 100, 0)), []).verdict == NEVER


def test_some_nodes_filtered_others_busy_is_not_now():
    metric = alloc_metric(NodesEvaluated=3, NodesFiltered=2, ConstraintFiltered={"distinct_hosts": 2}, NodesExhausted=1, DimensionExhausted={"cpu": 1})
    placement = classify(plan_result("Added", {}, {"worker": metric}), _job(worker=(3, 1000, 0)), _nodes(5200, 5200, 5200))
    assert placement.verdict == NOT_NOW


def test_plan_says_never_or_not_now_after_the_reasons():
    never = classify(plan_result("Added", {}, _cpu_exhausted("chief")), _job(chief=(1, 9000, 0)), _nodes(5200))
    lines = describe_plan(plan_result("Added", {}, _cpu_exhausted("chief")), None, never).lines
    assert lines[-1] == "it can never fit: a chief allocation asks cpu 9000 MHz; the largest node offers 5200 MHz"
    later = classify(plan_result("Added", {}, _cpu_exhausted("chief")), _job(chief=(1, 3000, 0)), _nodes(5200))
    assert describe_plan(plan_result("Added", {}, _cpu_exhausted("chief")), None, later).lines[-1].startswith("it does not fit now")


def test_a_docker_driver_without_bind_mounts_is_named_with_the_job_json_field_that_needs_them():
    metric = alloc_metric(NodesEvaluated=3, NodesFiltered=3, ConstraintFiltered={"${attr.driver.docker.volumes.enabled} = true": 3})
    why = explain_placement_failure("chief", metric)
    assert "3 of 3 nodes have a docker driver that allows no bind mounts, which driver.volumes are: remove driver.volumes" in why


def test_clients_without_the_namespace_s_host_volume_are_named_with_what_the_operator_declares():
    metric = alloc_metric(NodesEvaluated=3, NodesFiltered=3, ConstraintFiltered={"missing compatible host volumes": 3})
    why = explain_placement_failure("chief", metric)
    assert "3 of 3 nodes do not declare the host volumes a docker task mounts (nomadtf-<namespace>" in why
    assert 'client { host_volume "<name>" { path = ... } }' in why


def test_nodes_without_the_driver_are_said_to_lack_it():
    metric = alloc_metric(NodesEvaluated=2, NodesFiltered=2, ConstraintFiltered={"missing drivers": 2})
    assert "2 of 3 nodes have no healthy driver of the kind driver.name asks for" in explain_placement_failure("chief", metric)
