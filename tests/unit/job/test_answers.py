"""Nomad's JSON -> the read-only views everything above the adapter reads (job/answers.py)."""

from __future__ import annotations

from nomadtf.job.answers import (
    Allocation,
    AllocMetric,
    Evaluation,
    Job,
    JobStub,
    JobWrite,
    Node,
    PlanResult,
    ScalingEvent,
    TaskEvent,
    held_by_job,
)
from nomadtf.job.capacity import Resources

# As GET /v1/allocation/:id answers (trimmed to what nomadtf reads, plus keys it ignores).
FULL = {
    "ID": "0b5c6d7e-1111-2222-3333-444455556666",
    "Name": "digits.worker[1]",
    "Namespace": "team-a",
    "JobID": "digits",
    "JobType": "batch",
    "JobVersion": 3,
    "TaskGroup": "worker",
    "NodeID": "9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff",
    "NodeName": "",
    "ClientStatus": "failed",
    "DesiredStatus": "run",
    "CreateIndex": 41,
    "ModifyIndex": 57,
    "CreateTime": 1_700_000_000_000_000_000,
    "ModifyTime": 1_700_000_060_000_000_000,
    "DeploymentStatus": None,
    "TaskStates": {
        "worker": {
            "State": "dead",
            "Failed": True,
            "Restarts": 2,
            "Events": [
                {"Type": "Started", "Time": 10, "DisplayMessage": "Task started by client"},
                {"Type": "Terminated", "Time": 20, "ExitCode": 3, "DisplayMessage": "Exit Code: 3"},
                {"Type": "Driver Failure", "Time": 30, "DriverError": "Failed to pull `x`: not found"},
            ],
        },
        "log-shipper": {"State": "dead", "Restarts": 1, "Events": None},
    },
    "AllocatedResources": {
        "Tasks": {
            "worker": {
                "Cpu": {"CpuShares": 1000},
                "Memory": {"MemoryMB": 2048},
                "Devices": [{"Vendor": "nvidia", "Type": "gpu", "Name": "Tesla-V100", "DeviceIDs": ["GPU-0", "GPU-1"]}],
            },
            "log-shipper": {"Cpu": {"CpuShares": 100}, "Memory": {"MemoryMB": 64}, "Devices": None},
        },
        "Shared": {
            "Ports": [{"Label": "tf", "Value": 23456, "HostIP": "198.18.0.11"}, {"Label": "health", "Value": 23457}],
            "Networks": [{"ReservedPorts": [{"Label": "static", "Value": 8470}], "DynamicPorts": None}],
        },
    },
}


def test_an_allocation_reads_every_field_nomadtf_uses():
    alloc = Allocation.from_api(FULL)
    assert (alloc.id, alloc.name, alloc.namespace, alloc.job_id, alloc.job_type, alloc.job_version) == (
        FULL["ID"], "digits.worker[1]", "team-a", "digits", "batch", 3)  # fmt: skip
    assert (alloc.client_status, alloc.desired_status, alloc.create_index) == ("failed", "run", 41)
    assert alloc.slot == ("worker", 1) and alloc.key == ("team-a", "digits")
    assert alloc.restarts == 3 and alloc.task_states["worker"].state == "dead"
    assert alloc.short_node == "9f8e7d6c"  # no node name in the answer: the id's head
    assert alloc.resources == Resources(1100, 2112, {"nvidia/gpu/Tesla-V100": 2})
    assert alloc.port_address("tf") == "198.18.0.11:23456"
    assert alloc.port_address("health") == "127.0.0.1:23457"  # no host IP: the local stack's
    assert alloc.port_address("nope") is None
    assert alloc.reserved_ports == {23456, 23457, 8470}
    assert not alloc.holds_resources


def test_events_come_task_by_task_with_their_codes_and_messages():
    events = list(Allocation.from_api(FULL).events())
    assert [(task, e.type) for task, e in events] == [("worker", "Started"), ("worker", "Terminated"), ("worker", "Driver Failure")]
    terminated = events[1][1]
    assert (terminated.time, terminated.exit_code, terminated.text) == (20, 3, "Exit Code: 3")
    assert events[2][1].driver_error.startswith("Failed to pull") and events[2][1].text == "Driver Failure"  # no message: its type


def test_a_stub_without_the_keys_nomad_may_leave_out_reads_as_their_zero_values():
    alloc = Allocation.from_api({"ID": "a1", "Name": "j.chief[0]", "ClientStatus": "pending"})
    assert alloc.namespace == "default" and alloc.desired_status == "run"  # Nomad's defaults
    assert alloc.task_states == {} and alloc.ports == () and alloc.resources == Resources()
    assert alloc.holds_resources and alloc.restarts == 0 and list(alloc.events()) == []
    assert Allocation.from_api({"Name": "odd-name", "TaskGroup": "ps"}).slot == ("ps", 0)
    assert TaskEvent.from_api({"Type": "Killed", "ExitCode": None}).exit_code == 0


def test_only_allocations_that_hold_their_node_s_resources_count_for_their_job():
    allocs = [
        Allocation(namespace="a", job_id="j", client_status="running", resources=Resources(1000, 100)),
        Allocation(namespace="a", job_id="j", client_status="unknown", resources=Resources(500, 50)),
        Allocation(namespace="a", job_id="j", client_status="complete", resources=Resources(9000, 900)),
        Allocation(namespace="b", job_id="j", client_status="pending", resources=Resources(1, 1, {"nvidia/gpu": 1})),
    ]
    assert held_by_job(allocs) == {("a", "j"): Resources(1500, 150), ("b", "j"): Resources(1, 1, {"nvidia/gpu": 1})}


def test_an_evaluation_says_whether_it_ended_and_why_groups_were_not_placed():
    blocked = Evaluation.from_api({"ID": "e1", "Status": "blocked", "FailedTGAllocs": {"worker": {"NodesEvaluated": 3}}})
    assert not blocked.ended and blocked.failed_groups == {"worker": AllocMetric(nodes_evaluated=3)}
    failed = Evaluation.from_api({"ID": "e2", "Status": "failed", "StatusDescription": "maximum attempts reached"})
    assert failed.ended and failed.status_description == "maximum attempts reached" and failed.failed_groups == {}


# As GET /v1/nodes?resources=true lists one (trimmed; Nomad 1.6).
NODE = {
    "ID": "9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff",
    "Name": "client-2",
    "Datacenter": "dc2",
    "NodePool": "gpus",
    "Status": "ready",
    "SchedulingEligibility": "eligible",
    "Drain": False,
    "NodeResources": {
        "Cpu": {"CpuShares": 8000},
        "Memory": {"MemoryMB": 16000},
        "Devices": [{"Vendor": "nvidia", "Type": "gpu", "Name": "Tesla-V100",
                     "Instances": [{"ID": "GPU-0", "Healthy": True}, {"ID": "GPU-1", "Healthy": False}, {"ID": "GPU-2", "Healthy": True}]}],
    },
    "ReservedResources": {"Cpu": {"CpuShares": 500}, "Memory": {"MemoryMB": 1000}},
}  # fmt: skip


def test_a_node_offers_its_resources_less_the_reserved_and_only_healthy_devices():
    node = Node.from_api(NODE)
    assert (node.id, node.name, node.datacenter, node.node_pool) == (NODE["ID"], "client-2", "dc2", "gpus")
    assert node.offers == Resources(7500, 15000, {"nvidia/gpu/Tesla-V100": 2})
    assert node.usable


def test_a_node_that_is_down_draining_or_ineligible_is_not_usable():
    assert not Node.from_api({**NODE, "Status": "down"}).usable
    assert not Node.from_api({**NODE, "Drain": True}).usable
    assert not Node.from_api({**NODE, "SchedulingEligibility": "ineligible"}).usable


def test_a_bare_node_reads_as_nomads_defaults_and_never_offers_below_zero():
    node = Node.from_api({"ID": "0123456789abcdef", "ReservedResources": {"Cpu": {"CpuShares": 100}}})
    assert (node.name, node.node_pool, node.eligibility, node.drain, node.usable) == ("01234567", "default", "eligible", False, False)
    assert node.offers == Resources(0, 0, {})


def test_a_listed_job_sums_its_groups_outcomes_and_tells_its_run():
    stub = JobStub.from_api({
        "ID": "digits", "Namespace": "team-a", "Status": "dead", "Stop": True, "JobModifyIndex": 88,
        "Meta": {"nomadtf.run": "r-1f3a", "nomadtf.version": "0.9"},
        "JobSummary": {"Summary": {"chief": {"Complete": 1, "Failed": 0}, "worker": {"Complete": 1, "Failed": 2, "Lost": 1}}},
    })  # fmt: skip
    assert (stub.key, stub.status, stub.stop, stub.job_modify_index, stub.run_id) == (("team-a", "digits"), "dead", True, 88, "r-1f3a")
    assert stub.ran == {"complete": 2, "failed": 2, "lost": 1}


def test_a_listed_job_without_meta_is_told_from_one_with_empty_meta():
    bare = JobStub.from_api({"ID": "web"})
    assert (bare.meta, bare.run_id, bare.namespace, bare.ran) == (None, "", "default", {"complete": 0, "failed": 0, "lost": 0})
    assert JobStub.from_api({"ID": "web", "Meta": {}}).meta == {}


def test_a_whole_job_reads_its_state_as_attributes_and_keeps_its_document():
    document = {
        "ID": "digits", "Namespace": "team-a", "Status": "running", "Stop": False, "Version": 3, "SubmitTime": 1_700_000_000_000_000_000,
        "JobModifyIndex": 412, "Priority": 70, "Meta": {"nomadtf.run": "r-1f3a", "nomadtf.version": "0.9"},
        "TaskGroups": [{"Name": "chief", "Count": 1}],
    }  # fmt: skip
    job = Job.from_api(document)
    assert (job.key, job.status, job.stop, job.version, job.submit_time, job.modify_index, job.priority) == (
        ("team-a", "digits"), "running", False, 3, 1_700_000_000_000_000_000, 412, 70)
    assert (job.run_id, job.ours, job.dead) == ("r-1f3a", True, False)
    assert job.document is document  # what suspension.py reads and rewrites, untouched
    assert job == Job.from_api({**document, "TaskGroups": []})  # a view compares by its state, not its document


def test_a_bare_job_reads_as_nomads_defaults_and_is_not_ours():
    job = Job.from_api({"ID": "web", "Status": "dead"})
    assert (job.namespace, job.version, job.modify_index, job.priority, job.meta) == ("default", 0, 0, 50, {})
    assert (job.run_id, job.ours, job.dead) == ("", False, True)


def test_a_write_s_answer_names_its_evaluation_and_the_job_s_new_index():
    assert JobWrite.from_api({"EvalID": "e1", "JobModifyIndex": 9, "EvalCreateIndex": 9}) == JobWrite("e1", 9)
    assert JobWrite.from_api(None) == JobWrite("", 0)  # a stop of a purged job answers nothing to read


def test_a_scaling_event_keeps_the_scaler_s_words_and_tells_a_count_from_none():
    event = ScalingEvent.from_api({"Message": "nomadtf admission: admitted run r-1", "Time": 5, "Count": 0,
                                   "Meta": {"nomadtf.run": "r-1", "nomadtf.admission": "admitted", "tries": 2}})  # fmt: skip
    assert (event.message, event.time, event.count) == ("nomadtf admission: admitted run r-1", 5, 0)
    assert event.meta == {"nomadtf.run": "r-1", "nomadtf.admission": "admitted", "tries": "2"}  # a neighbour's non-string: text
    assert ScalingEvent.from_api({"Message": "an error"}) == ScalingEvent("an error", 0, None, {})


# As POST /v1/job/:id/plan answers one that cannot place its workers (trimmed; Nomad 1.6).
PLAN = {
    "Annotations": {"DesiredTGUpdates": {"worker": {"Place": 2, "Ignore": 0}, "chief": {"Place": 1}}, "PreemptedAllocs": None},
    "Diff": {"Type": "Added", "TaskGroups": []},
    "FailedTGAllocs": {"worker": {
        "NodesEvaluated": 3, "NodesFiltered": 1, "NodesAvailable": {"dc1": 2, "dc2": 1}, "NodesExhausted": 2,
        "ConstraintFiltered": {"missing devices": 1}, "ClassFiltered": None, "DimensionExhausted": {"memory": 2},
        "QuotaExhausted": ["memory exhausted"], "CoalescedFailures": 1,
    }},
}  # fmt: skip


def test_a_plan_reads_its_diff_updates_and_why_each_group_failed():
    plan = PlanResult.from_api(PLAN)
    assert (plan.diff_type, plan.updates) == ("Added", {"worker": {"Place": 2, "Ignore": 0}, "chief": {"Place": 1}})
    assert plan.failed_groups == {"worker": AllocMetric(
        nodes_evaluated=3, nodes_available=3, nodes_filtered=1, nodes_exhausted=2, constraint_filtered={"missing devices": 1},
        dimension_exhausted={"memory": 2}, quota_exhausted=("memory exhausted",), coalesced_failures=1)}  # fmt: skip


def test_a_plan_that_places_everything_has_no_failed_group_and_an_empty_one_no_diff():
    assert PlanResult.from_api({"Diff": {"Type": "None"}, "FailedTGAllocs": None}).failed_groups == {}
    assert PlanResult.from_api({}) == PlanResult("None", {}, {})
