"""Never, not now, or fits (nomadtf/job/plan.py classify, nomadtf/client/placement.py): a token
that may not read nodes is never told a wrong "never" by size; a cluster whose nodes are
all drained is "not now" (they come back). Pure, with a stand-in for the Nomad API."""

from __future__ import annotations

import pytest

from nomadtf.client import placement
from nomadtf.errors import NomadError
from nomadtf.job import plan
from nomadtf.job.answers import Node, PlanResult
from nomadtf.job.capacity import NodeCapacity, Resources


def metric(**fields) -> dict:
    return {"NodesEvaluated": 0, "NodesFiltered": 0, "NodesExhausted": 0, "NodesAvailable": {"dc1": 1}, **fields}


def result(**failed) -> PlanResult:
    return PlanResult.from_api({"Diff": {"Type": "Added"}, "FailedTGAllocs": failed or None})


def job(cpu: int = 1000, count: int = 1) -> dict:
    groups = [{"Name": "chief", "Count": count, "Tasks": [{"Name": "chief", "Resources": {"CPU": cpu, "MemoryMB": 500}}]}]
    return {"Job": {"ID": "digits", "Datacenters": ["*"], "TaskGroups": groups}}


def node_stub(node_id: str, cpu: int = 4000, **extra) -> dict:
    return {"ID": node_id, "Name": node_id, "Datacenter": "dc1", "NodePool": "default", "Status": "ready", "SchedulingEligibility": "eligible",
            "Drain": False, "NodeResources": {"Cpu": {"CpuShares": cpu}, "Memory": {"MemoryMB": 8000}, "Devices": []}, **extra}  # fmt: skip


CPU_EXHAUSTED = metric(NodesEvaluated=1, NodesExhausted=1, DimensionExhausted={"cpu": 1})
NONE_EVALUATED = metric(NodesEvaluated=0)
ALL_FILTERED = metric(NodesEvaluated=3, NodesFiltered=3, ConstraintFiltered={"${meta.rack} = r9": 3})


class FakeNomad:
    """GET /v1/nodes?resources=true as a token with or without node:read sees it."""

    def __init__(self, stubs: list[dict] | None = None, status: int | None = None):
        self.stubs, self.status, self.calls = stubs or [], status, 0

    def nodes(self) -> list[Node]:
        self.calls += 1
        if self.status:
            raise NomadError(f"GET /v1/nodes: {self.status}", status=self.status)
        return [Node.from_api(stub) for stub in self.stubs]


# ---- plan.classify with nodes=None (no node:read) -----------------------------------------------


def test_without_node_read_a_job_larger_than_any_node_is_not_now_not_never():
    placement = plan.classify(result(chief=CPU_EXHAUSTED), job(cpu=90_000), None)
    assert placement.verdict == plan.NOT_NOW and placement.why_never == ""
    assert placement.reasons == ["chief: cannot be placed: 1 of 1 nodes have too little cpu"]


def test_without_node_read_no_node_evaluated_is_not_now():
    assert plan.classify(result(chief=NONE_EVALUATED), job(), None).verdict == plan.NOT_NOW


def test_with_node_read_and_no_node_at_all_no_node_evaluated_is_never():
    placement = plan.classify(result(chief=NONE_EVALUATED), job(), [])
    assert placement.verdict == plan.NEVER and placement.why_never == "chief: no client node is ready in the job's datacenters"


def test_without_node_read_constraints_no_node_meets_are_still_never():
    placement = plan.classify(result(chief=ALL_FILTERED), job(), None)
    assert placement.verdict == plan.NEVER and placement.why_never.startswith("chief: no node meets its constraints")


def test_with_node_read_a_job_larger_than_any_node_is_never_by_size():
    nodes = [NodeCapacity("a", "a", Resources(4000, 8000))]
    placement = plan.classify(result(chief=CPU_EXHAUSTED), job(cpu=90_000), nodes)
    assert placement.verdict == plan.NEVER and placement.why_never == "a chief allocation asks cpu 90000 MHz; the largest node offers 4000 MHz"


# ---- placement.classify: what the token may read -------------------------------------------


def test_a_plan_that_places_everything_fits_without_reading_the_nodes():
    api = FakeNomad(status=403)
    assert placement.classify(api, result(), job()).verdict == plan.FITS
    assert api.calls == 0


def test_a_token_without_node_read_is_never_told_never_by_size():
    api = FakeNomad(status=403)
    assert placement.classify(api, result(chief=CPU_EXHAUSTED), job(cpu=90_000)).verdict == plan.NOT_NOW
    assert placement.classify(api, result(chief=NONE_EVALUATED), job()).verdict == plan.NOT_NOW
    assert api.calls == 2


def test_a_token_without_node_read_is_still_told_never_by_feasibility():
    placement_ = placement.classify(FakeNomad(status=403), result(chief=ALL_FILTERED), job())
    assert placement_.verdict == plan.NEVER and "no node meets its constraints" in placement_.why_never


def test_a_node_list_that_fails_otherwise_than_forbidden_is_raised():
    with pytest.raises(NomadError):
        placement.classify(FakeNomad(status=500), result(chief=CPU_EXHAUSTED), job())


def test_the_same_job_with_node_read_is_never_by_size():
    verdict = placement.classify(FakeNomad([node_stub("a")]), result(chief=CPU_EXHAUSTED), job(cpu=90_000))
    assert verdict.verdict == plan.NEVER and "largest node offers 4000 MHz" in verdict.why_never


# ---- a cluster whose nodes are all drained ---------------------------------------------------


DRAINED = [node_stub("a", Drain=True, SchedulingEligibility="ineligible"), node_stub("b", Drain=True, SchedulingEligibility="ineligible")]


def test_a_drained_only_cluster_is_not_now_for_a_job_that_fits_a_node():
    # The plan evaluates no node (none is eligible); the drained ones come back.
    assert placement.classify(FakeNomad(DRAINED), result(chief=NONE_EVALUATED), job(cpu=3000, count=2)).verdict == plan.NOT_NOW


def test_a_drained_only_cluster_is_never_for_a_job_no_node_could_hold():
    verdict = placement.classify(FakeNomad(DRAINED), result(chief=NONE_EVALUATED), job(cpu=9000))
    assert verdict.verdict == plan.NEVER and "largest node offers 4000 MHz" in verdict.why_never


def test_readable_nodes_counts_drained_nodes_only_as_coming_back():
    api = FakeNomad(DRAINED)
    assert placement.readable_nodes(api, job()["Job"]) == ([], True)
    nodes, readable = placement.readable_nodes(api, job()["Job"], coming_back=True)
    assert readable and [n.node_id for n in nodes] == ["a", "b"]


def test_a_cluster_whose_only_node_is_down_waits_for_the_controller_s_judgement():
    # Nomad's node list says no time since a node went down: the submitter cannot tell a
    # reboot from a node gone for good, so it queues; the controller, which watches the
    # node, refuses the run once the node stayed away past its grace period.
    gone = node_stub("a", Status="down")
    verdict = placement.classify(FakeNomad([gone]), result(chief=NONE_EVALUATED), job())
    assert verdict.verdict == plan.NOT_NOW


def test_a_cluster_with_no_node_at_all_is_never():
    verdict = placement.classify(FakeNomad([]), result(chief=NONE_EVALUATED), job())
    assert verdict.verdict == plan.NEVER and "no client node is ready" in verdict.why_never
