"""Which running runs make room for a waiting one (nomadtf/admission/preemption.py). Pure."""

from __future__ import annotations

import copy

import pytest

from nomadtf.admission import fit, preemption
from nomadtf.admission.preemption import Candidate
from nomadtf.job.capacity import Resources
from tests.unit.admission.test_fit import alloc, ask, group, node

NOW = 10_000.0


def running(job: str, cpu: int, *, node_id: str = "n1", priority: int = 30, step: int | None = None, checkpoint: int | None = None,
            started: float = NOW - 100, borrowing: bool = False, allocs: int = 1) -> Candidate:  # fmt: skip
    return Candidate("team-a", job, f"{job}-run", priority, tuple((node_id, Resources(cpu, 100)) for _ in range(allocs)),
                     started, borrowing, step, checkpoint)  # fmt: skip


def rooms_with(*candidates: Candidate, cpu: int = 4000) -> list[fit.Room]:
    nodes = [node("n1", cpu, 8000), node("n2", cpu, 8000)]
    held = [alloc(n, r.cpu, r.memory, job=c.job_id, namespace=c.namespace) for c in candidates for n, r in c.held]
    return fit.node_rooms(nodes, held)


def names(victims) -> list[str] | None:
    return None if victims is None else sorted(v.job_id for v in victims)


def test_a_priority_ten_higher_or_a_reclaim_of_borrowed_quota_may_preempt_nothing_else():
    low = running("low", 1000, priority=40)
    assert preemption.reason(50, False, low) == "priority 50 over 40"
    assert preemption.reason(49, False, low) == ""
    assert preemption.reason(49, True, low) == ""  # reclaiming, but it does not borrow
    assert preemption.reason(49, True, running("b", 1000, priority=40, borrowing=True)) == "its namespace reclaims its nominal quota"
    assert preemption.reason(49, True, running("b", 1000, priority=49, borrowing=True)) == "its namespace reclaims its nominal quota"
    assert preemption.reason(49, False, running("b", 1000, priority=40, borrowing=True)) == ""
    # Never a borrower of higher priority: requeued, it would sort ahead, take the room back
    # and be preempted again, in a loop.
    assert preemption.reason(49, True, running("b", 1000, priority=50, borrowing=True)) == ""


def test_the_run_losing_the_least_work_since_its_checkpoint_is_preempted():
    fresh = running("fresh", 3000, step=1000, checkpoint=990)
    stale = running("stale", 3000, node_id="n2", step=1000, checkpoint=100)
    rooms = rooms_with(fresh, stale)
    assert names(preemption.choose(ask(group("big", 1, 3500)), rooms, [stale, fresh], NOW)) == ["fresh"]


def test_a_run_that_misreports_its_steps_looks_at_worst_like_one_that_never_checkpoints():
    """Work lost is time run (Nomad's record) times the share of steps since the checkpoint:
    a huge step count bought no protection beyond an honest run that never saved."""
    liar = running("liar", 3000, step=10**12, checkpoint=0, started=NOW - 100)
    honest = running("honest", 3000, node_id="n2", step=None, started=NOW - 200)  # reports nothing: loses all it ran
    assert liar.lost_s(NOW) == 100.0 and honest.lost_s(NOW) == 200.0
    assert names(preemption.choose(ask(group("big", 1, 3500)), rooms_with(liar, honest), [liar, honest], NOW)) == ["liar"]


def test_equal_losses_go_to_the_lowest_priority_then_the_most_recent():
    a = running("a", 3000, priority=30, step=10, checkpoint=10)
    b = running("b", 3000, node_id="n2", priority=20, step=10, checkpoint=10)
    assert names(preemption.choose(ask(group("big", 1, 3500)), rooms_with(a, b), [a, b], NOW)) == ["b"]
    c = running("c", 3000, priority=20, step=10, checkpoint=10, started=NOW - 10)
    assert names(preemption.choose(ask(group("big", 1, 3500)), rooms_with(c, b), [b, c], NOW)) == ["c"]


def test_one_run_that_makes_room_alone_is_taken_before_two_cheaper_ones():
    small1, small2 = running("s1", 1500, step=0), running("s2", 1500, step=0)
    large = running("large", 3500, node_id="n2", step=500, checkpoint=0)
    rooms = rooms_with(small1, small2, large)  # n1: 1000 free, n2: 500 free
    assert names(preemption.choose(ask(group("big", 1, 3800)), rooms, [small1, small2, large], NOW)) == ["large"]


def test_a_whole_run_is_freed_on_every_node_it_holds_and_victims_not_needed_are_dropped():
    spread = running("spread", 1500, allocs=1)
    other = Candidate("team-a", "spread2", "r", 30, (("n1", Resources(1500, 100)), ("n2", Resources(1500, 100))), NOW - 100)
    rooms = rooms_with(spread, other)  # n1: 4000-3000 = 1000 free; n2: 2500 free
    victims = preemption.choose(ask(group("chief", 1, 2000), group("worker", 1, 2500)), rooms, [other, spread], NOW)
    # Either alone makes room (the worker on one node, the chief on the other); equal costs
    # go by name. Its allocations on both nodes count for the one that holds two.
    assert names(victims) == ["spread"]
    assert preemption.fits_without(ask(group("chief", 1, 2000), group("worker", 1, 4000)), rooms, [other])
    assert not preemption.fits_without(ask(group("chief", 1, 2000), group("worker", 1, 4000)), rooms, [spread])


def test_when_even_every_candidate_would_not_make_room_nothing_is_chosen_and_rooms_stay():
    a = running("a", 1000)
    rooms = rooms_with(a)
    before = copy.deepcopy(rooms)
    assert preemption.choose(ask(group("huge", 1, 9000)), rooms, [a], NOW) is None
    assert [(r.cpu, r.memory) for r in rooms] == [(r.cpu, r.memory) for r in before]


@pytest.mark.parametrize(("step", "checkpoint", "lost"), [(None, None, 100.0), (0, None, 100.0), (500, None, 100.0), (500, 450, 10.0),
                                                          (500, 600, 0.0), (500, 500, 0.0)])  # fmt: skip
def test_work_lost_is_the_time_run_times_the_share_of_steps_since_the_last_checkpoint(step, checkpoint, lost):
    assert running("a", 1, step=step, checkpoint=checkpoint, started=NOW - 100).lost_s(NOW) == pytest.approx(lost)


@pytest.mark.parametrize(("record", "numbers"), [
    ({"step": 5, "checkpoint_step": 3, "time": 1.7e9}, (5, 3, 1.7e9)),
    ({"step": 10**13, "checkpoint_step": -1, "time": float("inf")}, (None, None, None)),
    ({"step": True, "checkpoint_step": "3", "time": "x"}, (None, None, None)),
    ([1], (None, None, None)), ("x", (None, None, None)), (None, (None, None, None)),
])  # fmt: skip
def test_a_progress_record_is_a_team_s_own_and_only_sane_numbers_are_read(record, numbers):
    assert preemption.progress_numbers(record) == numbers


def test_a_reservation_for_a_preempting_run_is_on_the_nodes_its_victims_give_back():
    victim = running("victim", 3000, node_id="n2")
    rooms = rooms_with(victim)  # n1: 4000 free, n2: 1000 free
    preemption.reserve_for(ask(group("big", 1, 3500)), rooms, [victim])
    # n1 has room for it now, but it was made room for on n2: that is where it is held back.
    assert {r.node_id: r.cpu for r in rooms} == {"n1": 4000, "n2": 1000 - 3500}
