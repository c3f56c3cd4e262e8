"""The queue's one ordering rule (nomadtf/admission/order.py): higher priority first, then
first come first served by the Raft index of arrival. Pure."""

from __future__ import annotations

import pytest

from nomadtf.admission.order import QueuedRun, clamp_priority, ordered, place_of


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


def test_place_of_is_one_based_and_counts_the_whole_queue():
    runs = ordered([run("a", arrival=1), run("b", arrival=2), run("c", arrival=3)])
    assert place_of(runs, ("team-a", "a")) == (1, 3)
    assert place_of(runs, ("team-a", "c")) == (3, 3)


def test_place_of_a_run_not_queued_is_zero():
    runs = [run("a")]
    assert place_of(runs, ("team-b", "a")) == (0, 1)  # same job name, another namespace
    assert place_of([], ("team-a", "a")) == (0, 0)
