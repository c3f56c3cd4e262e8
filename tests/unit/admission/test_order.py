"""The queue's one ordering rule (nomadtf/admission/order.py): higher priority first, then
first come first served by the Raft index of arrival. Pure."""

from __future__ import annotations

import pytest

from nomadtf.admission.order import QueuedRun, clamp_priority, ordered


def run(job_id: str, priority: int = 50, arrival: int = 100, namespace: str = "team-a") -> QueuedRun:
    return QueuedRun(namespace, job_id, run_id=f"{job_id}-run", priority=priority, arrival=arrival, since=0.0, job_modify_index=arrival)


@pytest.mark.parametrize(("value", "clamped"), [(10**9, 100), (101, 100), (100, 100), (1, 1), (0, 1), (-5, 1), (70, 70), ("70", 70),
                                                ("x", 50), (None, 50), ("", 50), ([3], 50)])  # fmt: skip
def test_clamp_priority_keeps_nomad_s_range_and_reads_junk_as_the_default(value, clamped):
    assert clamp_priority(value) == clamped


def test_higher_priority_goes_first_whatever_its_arrival():
    assert [r.job_id for r in ordered([run("early", 50, 1), run("urgent", 90, 500), run("low", 10, 0)])] == ["urgent", "early", "low"]


def test_equal_priorities_go_in_order_of_arrival():
    assert [r.job_id for r in ordered([run("c", arrival=30), run("a", arrival=10), run("b", arrival=20)])] == ["a", "b", "c"]


def test_ordering_does_not_depend_on_the_order_runs_were_read_in():
    runs = [run("a", 70, 5), run("b", 70, 3), run("c", 20, 1), run("d", 90, 9)]
    assert ordered(runs) == ordered(list(reversed(runs))) == ordered(runs[2:] + runs[:2])
    assert [r.job_id for r in ordered(runs)] == ["d", "b", "a", "c"]


# ---- the fair order between namespaces (order.fair_order) ---------------------------------

from nomadtf.admission import policy as policies  # noqa: E402
from nomadtf.admission.fit import RunAsk, Slot  # noqa: E402
from nomadtf.admission.order import fair_order  # noqa: E402
from nomadtf.job.capacity import Resources  # noqa: E402

CLUSTER = Resources(10_000, 10_000, {})


def sized(job_id: str, namespace: str, cpu: int, arrival: int, priority: int = 50) -> QueuedRun:
    ask = RunAsk(namespace, job_id, ("*",), "default", (Slot("g", Resources(cpu, 100)),))
    return QueuedRun(namespace, job_id, f"{job_id}-run", priority, arrival, 0.0, arrival, {"g": 1}, 30.0, ask)


def names(runs) -> list[str]:
    return [r.job_id for r in runs]


def test_the_issue_s_two_teams_team_b_s_one_run_is_second_not_fourth():
    """team-a queued a1, a2, a3, then team-b b1, all priority 50, each 65 % of the cluster.
    a1 runs (its namespace holds 65 %): b1 goes before a2 and a3."""
    queued = [sized("a2", "team-a", 6500, 2), sized("a3", "team-a", 6500, 3), sized("b1", "team-b", 6500, 4)]
    assert names(fair_order(queued, policies.Policy(), {}, {"team-a": Resources(6500, 100)}, CLUSTER)) == ["b1", "a2", "a3"]
    # Before anything ran, the first come goes first, then the namespaces alternate.
    queued = [sized("a1", "team-a", 6500, 1)] + queued
    assert names(fair_order(queued, policies.Policy(), {}, {}, CLUSTER)) == ["a1", "b1", "a2", "a3"]


def test_recent_usage_orders_namespaces_that_hold_nothing_now():
    queued = [sized("a1", "team-a", 1000, 1), sized("b1", "team-b", 1000, 2)]
    assert names(fair_order(queued, policies.Policy(), {"team-a": 0.3, "team-b": 0.1}, {}, CLUSTER)) == ["b1", "a1"]


def test_priority_goes_before_fairness_and_is_capped_by_the_namespace_s_ceiling():
    queued = [sized("a1", "team-a", 1000, 1, priority=90), sized("b1", "team-b", 1000, 2, priority=60)]
    assert names(fair_order(queued, policies.Policy(), {"team-a": 0.9}, {}, CLUSTER)) == ["a1", "b1"]


def test_a_weight_gives_a_namespace_a_larger_share_before_it_yields():
    policy = policies.parse('{"namespaces": {"team-a": {"weight": 3}}}')
    queued = [sized(f"a{i}", "team-a", 1000, i) for i in range(1, 5)] + [sized(f"b{i}", "team-b", 1000, 10 + i) for i in range(1, 3)]
    # team-a's score grows a third as fast: three of its runs for each of team-b's.
    assert names(fair_order(queued, policy, {}, {}, CLUSTER)) == ["a1", "b1", "a2", "a3", "a4", "b2"]


def test_a_run_within_its_nominal_quota_goes_before_one_that_would_borrow():
    policy = policies.parse('{"namespaces": {"team-a": {"nominal": {"cpu": 2000}}, "team-b": {"nominal": {"cpu": 8000}}}}')
    queued = [sized("a1", "team-a", 1500, 1), sized("b1", "team-b", 1000, 2)]
    # team-a holds 1000 of its 2000: a1 would borrow; team-b's run is within its quota,
    # although team-b used more of the cluster lately.
    assert names(fair_order(queued, policy, {"team-b": 0.5}, {"team-a": Resources(1000)}, CLUSTER)) == ["b1", "a1"]


def test_the_fair_order_does_not_depend_on_the_order_runs_were_read_in():
    queued = [sized("a1", "team-a", 3000, 5), sized("b1", "team-b", 2000, 3), sized("c1", "team-c", 1000, 9, priority=70),
              sized("a2", "team-a", 1000, 1), sized("b2", "team-b", 1000, 4)]  # fmt: skip
    shares = {"team-a": 0.1, "team-b": 0.2}
    first = fair_order(queued, policies.Policy(), shares, {}, CLUSTER)
    assert first == fair_order(list(reversed(queued)), policies.Policy(), shares, {}, CLUSTER)
    assert names(first) == ["c1", "a2", "b1", "a1", "b2"]
