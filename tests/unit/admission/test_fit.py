"""Whether a whole run fits now, and whether it ever could (nomadtf/admission/fit.py), on
node stubs and allocations shaped as Nomad lists them (GET /v1/nodes?resources=true,
GET /v1/allocations?resources=true). Pure."""

from __future__ import annotations

import copy

from nomadtf.admission import fit
from nomadtf.admission.fit import RunAsk
from nomadtf.job.answers import Allocation, Node

NOW = 1_800_000_000.0
GPU = "nvidia/gpu/Tesla-V100"


def node(node_id: str, cpu: int = 4000, memory: int = 8000, *, dc: str = "dc1", pool: str = "default", status: str = "ready",
         eligibility: str = "eligible", drain: bool = False, gpus: int = 0, reserved_cpu: int = 0, reserved_memory: int = 0,
         **extra) -> Node:  # fmt: skip
    devices = [{"Vendor": "nvidia", "Type": "gpu", "Name": "Tesla-V100",
                "Instances": [{"ID": f"GPU-{node_id}-{i}", "Healthy": True} for i in range(gpus)]}] if gpus else []  # fmt: skip
    return Node.from_api({
        "ID": node_id, "Name": node_id, "Datacenter": dc, "NodePool": pool, "Status": status,
        "SchedulingEligibility": eligibility, "Drain": drain,
        "NodeResources": {"Cpu": {"CpuShares": cpu}, "Memory": {"MemoryMB": memory}, "Devices": devices},
        "ReservedResources": {"Cpu": {"CpuShares": reserved_cpu}, "Memory": {"MemoryMB": reserved_memory}},
        **extra,
    })  # fmt: skip


def alloc(node_id: str, cpu: int = 1000, memory: int = 1000, *, job: str = "other", job_type: str = "batch", group: str = "g",
          namespace: str = "default", status: str = "running", gpus: int = 0, ports: tuple[int, ...] = ()) -> Allocation:  # fmt: skip
    devices = [{"Vendor": "nvidia", "Type": "gpu", "Name": "Tesla-V100", "DeviceIDs": [f"GPU-{node_id}-{i}" for i in range(gpus)]}] if gpus else []
    return Allocation.from_api({
        "NodeID": node_id, "Namespace": namespace, "JobID": job, "JobType": job_type, "TaskGroup": group, "ClientStatus": status,
        "AllocatedResources": {
            "Tasks": {"t": {"Cpu": {"CpuShares": cpu}, "Memory": {"MemoryMB": memory}, "Devices": devices}},
            "Shared": {"Ports": [{"Label": f"p{p}", "Value": p} for p in ports]},
        },
    })  # fmt: skip


def group(name: str, count: int = 1, cpu: int = 1000, memory: int = 500, *, gpus: int = 0, ports: tuple[int, ...] = (),
          distinct: bool = False) -> dict:  # fmt: skip
    resources = {"CPU": cpu, "MemoryMB": memory, "Devices": [{"Name": "nvidia/gpu", "Count": gpus}] if gpus else None}
    out = {"Name": name, "Count": count, "Tasks": [{"Name": name, "Resources": resources}]}
    if ports:
        out["Networks"] = [{"ReservedPorts": [{"Label": f"p{p}", "Value": p} for p in ports]}]
    if distinct:
        out["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    return out


def ask(*groups: dict, datacenters=("*",), pool: str | None = None, distinct: bool = False, job_id: str = "digits") -> RunAsk:
    job = {"ID": job_id, "Namespace": "team-a", "Datacenters": list(datacenters), "TaskGroups": list(groups)}
    if pool:
        job["NodePool"] = pool
    if distinct:
        job["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    return RunAsk.of(job)


def free(rooms: list[fit.Room]) -> dict[str, tuple[int, int]]:
    return {r.node_id: (r.cpu, r.memory) for r in rooms}


def placed_on(rooms: list[fit.Room], job_id: str = "digits") -> dict[str, set[str]]:
    return {r.node_id: r.jobs[("team-a", job_id)] for r in rooms if ("team-a", job_id) in r.jobs}


# ---- RunAsk ------------------------------------------------------------------------------


def test_a_run_asks_one_slot_per_allocation_with_its_ports_and_rules():
    run = ask(group("chief", 1, 2000, ports=(2222,)), group("worker", 2, 1000, distinct=True), pool="gpu", datacenters=("eu-*",))
    assert [(s.group, s.resources.cpu, s.ports, s.distinct) for s in run.slots] == [
        ("chief", 2000, frozenset({2222}), False), ("worker", 1000, frozenset(), True), ("worker", 1000, frozenset(), True),
    ]  # fmt: skip
    assert (run.namespace, run.job_id, run.datacenters, run.pool, run.job_distinct) == ("team-a", "digits", ("eu-*",), "gpu", False)
    assert run.needs.cpu == 4000


def test_distinct_hosts_set_to_false_does_not_count():
    job = {"ID": "j", "TaskGroups": [{**group("w", 2), "Constraints": [{"Operand": "distinct_hosts", "RTarget": "false"}]}]}
    assert not any(s.distinct for s in RunAsk.of(job).slots)


# ---- node_rooms --------------------------------------------------------------------------


def test_node_rooms_subtract_what_the_operator_reserved_and_what_holding_allocations_hold():
    rooms = fit.node_rooms(
        [node("a", 4000, 8000, reserved_cpu=200, reserved_memory=512, gpus=2), node("b")],
        [alloc("a", 1000, 1000, gpus=1, ports=(8080,)), alloc("a", 500, 500, status="pending", job="two", group="w")],
    )
    a = next(r for r in rooms if r.node_id == "a")
    assert (a.cpu, a.memory, a.devices) == (4000 - 200 - 1500, 8000 - 512 - 1500, {GPU: 1})
    assert a.ports == {8080}
    assert a.jobs == {("default", "other"): {"g"}, ("default", "two"): {"w"}}
    assert free(rooms)["b"] == (4000, 8000)


def test_allocations_that_ended_or_sit_on_unknown_nodes_hold_nothing():
    rooms = fit.node_rooms([node("a")], [alloc("a", status="complete"), alloc("a", status="failed"), alloc("gone", 3000)])
    assert free(rooms) == {"a": (4000, 8000)} and rooms[0].jobs == {}


def test_an_unusable_node_is_a_room_that_may_not_take_a_run_now():
    rooms = fit.node_rooms([node("a"), node("b", drain=True), node("c", eligibility="ineligible"), node("d", status="down")], [])
    assert {r.node_id: r.usable for r in rooms} == {"a": True, "b": False, "c": False, "d": False}


# ---- place -------------------------------------------------------------------------------


def test_place_packs_first_fit_largest_first_and_takes_from_the_rooms():
    rooms = fit.node_rooms([node("a", 4000), node("b", 4000)], [])
    assert fit.place(ask(group("chief", 1, 1000), group("worker", 2, 2000)), rooms)
    # The workers first (largest), both on a (first fit); the chief, listed first, is left for b.
    assert free(rooms) == {"a": (0, 7000), "b": (3000, 7500)}
    assert placed_on(rooms) == {"a": {"worker"}, "b": {"chief"}}


def test_rooms_filled_by_one_run_refuse_the_next():
    rooms = fit.node_rooms([node("a", 4000)], [])
    assert fit.place(ask(group("w", 1, 3000), job_id="first"), rooms)
    assert not fit.place(ask(group("w", 1, 2000), job_id="second"), rooms)


def test_a_run_that_does_not_fit_leaves_the_rooms_as_they_were():
    rooms = fit.node_rooms([node("a", 4000, gpus=2), node("b", 4000)], [alloc("b", 1000, ports=(9000,))])
    before = copy.deepcopy(rooms)
    # The GPU worker and the first two chiefs would fit; the third chief does not.
    assert not fit.place(ask(group("worker", 1, 500, gpus=2, ports=(7000,)), group("chief", 3, 2000)), rooms)
    assert rooms == before


def test_place_keeps_to_the_job_s_datacenters():
    rooms = fit.node_rooms([node("a", dc="us-east"), node("b", dc="eu-west")], [])
    assert fit.place(ask(group("w", 2, 1000), datacenters=("eu-*",)), rooms)
    assert placed_on(rooms) == {"b": {"w"}}
    assert not fit.place(ask(group("w", 1, 1000), datacenters=("ap-*",), job_id="far"), rooms)


def test_place_keeps_to_the_job_s_node_pool_and_all_means_any():
    rooms = fit.node_rooms([node("a", pool="default"), node("b", pool="gpu")], [])
    assert fit.place(ask(group("w", 1, 1000), pool="gpu"), rooms)
    assert placed_on(rooms) == {"b": {"w"}}
    assert not fit.place(ask(group("w", 1, 1000), pool="tpu", job_id="tpu"), rooms)
    rooms = fit.node_rooms([node("a", pool="x"), node("b", pool="y")], [])
    assert fit.place(ask(group("w", 2, 4000), pool="all"), rooms)


def test_a_run_without_a_pool_goes_only_to_the_default_pool():
    rooms = fit.node_rooms([node("a", pool="gpu"), node("b")], [])
    assert fit.place(ask(group("w", 1, 1000)), rooms)
    assert placed_on(rooms) == {"b": {"w"}}


def test_place_skips_nodes_that_may_not_take_a_run_now_unless_told():
    rooms = fit.node_rooms([node("a", drain=True), node("b", status="down")], [])
    assert not fit.place(ask(group("w", 1, 100)), rooms)
    assert fit.place(ask(group("w", 1, 100)), rooms, usable_only=False)


def test_group_distinct_hosts_puts_each_allocation_of_the_group_on_its_own_node():
    rooms = fit.node_rooms([node("a", 8000), node("b", 8000)], [])
    assert not fit.place(ask(group("worker", 3, 100, distinct=True)), rooms)
    assert fit.place(ask(group("worker", 2, 100, distinct=True), group("chief", 1, 100)), rooms)
    assert placed_on(rooms) == {"a": {"worker", "chief"}, "b": {"worker"}}  # only the group's own allocations are kept apart


def test_job_distinct_hosts_keeps_every_allocation_of_the_job_apart():
    rooms = fit.node_rooms([node("a", 8000), node("b", 8000)], [])
    assert not fit.place(ask(group("worker", 2, 100), group("chief", 1, 100), distinct=True), rooms)
    assert fit.place(ask(group("worker", 1, 100), group("chief", 1, 100), distinct=True), rooms)
    assert sorted(map(sorted, placed_on(rooms).values())) == [["chief"], ["worker"]]


def test_distinct_hosts_counts_the_job_s_allocations_already_on_a_node():
    rooms = fit.node_rooms([node("a", 8000), node("b", 8000)], [alloc("a", 100, job="digits", namespace="team-a", group="worker")])
    assert fit.place(ask(group("worker", 1, 100, distinct=True)), rooms)
    assert placed_on(rooms)["b"] == {"worker"}


def test_two_slots_that_want_one_static_port_never_share_a_node():
    rooms = fit.node_rooms([node("a", 8000)], [])
    assert not fit.place(ask(group("ps", 2, 100, ports=(2222,))), rooms)
    rooms = fit.node_rooms([node("a", 8000), node("b", 8000)], [])
    assert fit.place(ask(group("ps", 2, 100, ports=(2222,))), rooms)
    assert set(placed_on(rooms)) == {"a", "b"}


def test_a_static_port_another_allocation_holds_blocks_the_node():
    rooms = fit.node_rooms([node("a", 8000), node("b", 8000)], [alloc("a", 100, ports=(2222,))])
    assert fit.place(ask(group("ps", 1, 100, ports=(2222,))), rooms)
    assert set(placed_on(rooms)) == {"b"}
    rooms = fit.node_rooms([node("a", 8000)], [alloc("a", 100, ports=(2222,))])
    assert not fit.place(ask(group("ps", 1, 100, ports=(2222,))), rooms)


def test_devices_are_taken_from_the_nodes_that_offer_them():
    rooms = fit.node_rooms([node("cpu-only", 8000), node("gpu", 8000, gpus=4)], [alloc("gpu", 100, gpus=1)])
    assert fit.place(ask(group("worker", 1, 100, gpus=3)), rooms)
    assert placed_on(rooms) == {"gpu": {"worker"}}
    assert next(r for r in rooms if r.node_id == "gpu").devices == {GPU: 0}
    assert not fit.place(ask(group("worker", 1, 100, gpus=1), job_id="more"), rooms)


# ---- never -------------------------------------------------------------------------------


def test_a_cluster_held_only_by_batch_runs_is_not_never():
    stubs = [node("a", 4000), node("b", 4000)]
    allocs = [alloc("a", 3900, job_type="batch"), alloc("b", 3900, job_type="batch")]
    run = ask(group("w", 2, 3500))
    assert not fit.place(run, fit.node_rooms(stubs, allocs))  # not now
    assert fit.never(run, stubs, allocs, now=NOW) == ""  # but some day


def test_service_and_system_allocations_holding_too_much_is_never():
    stubs = [node("a", 4000), node("b", 4000)]
    allocs = [alloc("a", 3500, job_type="service"), alloc("b", 3500, job_type="system")]
    why = fit.never(ask(group("w", 1, 1000)), stubs, allocs, now=NOW)
    assert why == "a w allocation asks cpu 1000 MHz; the most any node has beside long-running jobs is 500 MHz"


def test_the_whole_run_beside_long_running_jobs_is_never_though_each_allocation_fits():
    stubs = [node("a", 4000), node("b", 4000)]
    allocs = [alloc("a", 2000, job_type="service"), alloc("b", 2000, job_type="sysbatch")]
    why = fit.never(ask(group("w", 3, 1500)), stubs, allocs, now=NOW)
    assert why.startswith("the whole run asks cpu 4500 MHz") and "2 node(s)" in why


def test_one_allocation_larger_than_any_node_is_never():
    why = fit.never(ask(group("chief", 1, 100, memory=16000)), [node("a", memory=8000), node("b", memory=8000)], [], now=NOW)
    assert why == "a chief allocation asks memory 16000 MB; the most any node has beside long-running jobs is 8000 MB"


def test_distinct_hosts_asking_more_nodes_than_there_are_is_never():
    why = fit.never(ask(group("worker", 3, 100, distinct=True)), [node("a"), node("b")], [], now=NOW)
    assert why == "3 allocations must each have a node of their own (distinct_hosts or a static port); 2 node(s) can take the job"


def test_static_ports_asking_more_nodes_than_there_are_is_never():
    assert "must each have a node of their own" in fit.never(ask(group("ps", 2, 100, ports=(2222,))), [node("a")], [], now=NOW)


def test_no_node_in_the_job_s_datacenters_is_never():
    why = fit.never(ask(group("w", 1, 100), datacenters=("eu-*",)), [node("a", dc="us-east")], [], now=NOW)
    assert why == "no client node in datacenters eu-* of node pool default"
    assert fit.never(ask(group("w", 1, 100), pool="gpu"), [node("a")], [], now=NOW).startswith("no client node")


def test_a_drained_or_ineligible_node_still_counts_for_never():
    run = ask(group("w", 1, 3000))
    assert fit.never(run, [node("a", drain=True, eligibility="ineligible", StatusUpdatedAt=int(NOW) - 60)], [], now=NOW) == ""
    assert fit.never(run, [node("a", eligibility="ineligible", StatusUpdatedAt=int(NOW) - 60)], [], now=NOW) == ""


def test_a_node_drained_long_ago_still_counts_for_never():
    # Draining is an operator's step, undone as easily: no grace period runs out on it.
    assert fit.never(ask(group("w", 1, 3000)), [node("a", drain=True, StatusUpdatedAt=int(NOW) - 86400)], [], now=NOW) == ""


def test_a_node_down_for_less_than_the_grace_period_still_counts():
    recently = node("a", status="down")
    assert fit.never(ask(group("w", 1, 3000)), [recently], [], now=NOW, down_since={"a": NOW - fit.DOWN_GRACE_S + 30}) == ""


def test_a_node_down_longer_than_the_grace_period_does_not_count():
    gone, since = node("a", status="down"), {"a": NOW - fit.DOWN_GRACE_S - 30}
    assert fit.never(ask(group("w", 1, 3000)), [gone], [], now=NOW, down_since=since).startswith("no client node")
    assert fit.never(ask(group("w", 1, 3000)), [gone, node("b")], [], now=NOW, down_since=since) == ""
    assert fit.never(ask(group("w", 2, 3000, distinct=True)), [gone, node("b")], [], now=NOW, down_since=since) != ""


def test_a_node_away_with_no_time_seen_counts_as_coming_back():
    # Nomad's node list says no time of the last status change: nobody watched it go.
    assert fit.never(ask(group("w", 1, 3000)), [node("a", status="down")], [], now=NOW) == ""


# ---- reservations ------------------------------------------------------------------------


def test_a_reservation_holds_back_what_the_run_waits_for_on_the_node_it_will_use():
    nodes = [node("n1", 4000, 8000), node("n2", 4000, 8000)]
    allocs = [alloc("n1", 3000, 1000, job="long-batch"), alloc("n2", 1000, 1000, job="web", job_type="service")]
    rooms = fit.node_rooms(nodes, allocs)
    waiting = ask(group("chief", 1, 3500))
    assert not fit.place(waiting, copy.deepcopy(rooms))  # n1 has 1000 free now, n2 3000
    assert fit.reserve(waiting, rooms, fit.later_rooms(nodes, allocs))
    # Once the batch run ends n1 has 4000: the run is packed there, and n1's room now is
    # held below zero; n2 (where the service job stays) keeps what it has for backfill.
    assert free(rooms) == {"n1": (1000 - 3500, 7000 - 500), "n2": (3000, 7000)}
    assert not fit.place(ask(group("small", 1, 500), job_id="small"), [r for r in rooms if r.node_id == "n1"])
    assert fit.place(ask(group("small", 1, 500), job_id="small"), rooms)


def test_a_run_that_cannot_fit_even_when_batch_work_ends_reserves_nothing():
    nodes = [node("n1", 2000, 8000)]
    rooms = fit.node_rooms(nodes, [])
    assert not fit.reserve(ask(group("chief", 1, 3000)), rooms, fit.later_rooms(nodes, []))
    assert free(rooms) == {"n1": (2000, 8000)}


def test_a_reservation_takes_gpus_below_zero_when_none_is_free_now():
    nodes = [node("n1", 8000, 16000, gpus=2)]
    allocs = [alloc("n1", 1000, 1000, gpus=2, job="trainer")]
    rooms = fit.node_rooms(nodes, allocs)
    assert fit.reserve(ask(group("chief", 1, 1000, gpus=1)), rooms, fit.later_rooms(nodes, allocs))
    assert rooms[0].devices == {GPU: -1}
    assert not fit.place(ask(group("other", 1, 100, gpus=1), job_id="other"), rooms)


def test_two_reservations_never_count_on_the_same_room():
    """Each is placed in the same picture of the nodes once batch work ends, in turn: the
    second goes to the node the first left, and backfill finds neither room free."""
    nodes = [node("n1", 4000, 8000), node("n2", 4000, 8000)]
    allocs = [alloc("n1", 3500, 1000, job="long-1"), alloc("n2", 3500, 1000, job="long-2")]
    rooms = fit.node_rooms(nodes, allocs)
    later = fit.later_rooms(nodes, allocs)
    assert fit.reserve(ask(group("r1", 1, 3000), job_id="r1"), rooms, later)
    assert fit.reserve(ask(group("r2", 1, 3000), job_id="r2"), rooms, later)
    assert sorted(r.cpu for r in rooms) == [500 - 3000, 500 - 3000]
    assert not fit.place(ask(group("small", 1, 400), job_id="small"), rooms)
