"""Which running runs make room for a waiting one (nomadtf/admission/preemption.py). Pure."""

from __future__ import annotations

import copy

import pytest

from nomadtf.admission import fit, preemption
from nomadtf.admission.preemption import Candidate
from nomadtf.capacity import Resources
from tests.unit.admission.test_fit import alloc, ask, group, node


def running(job: str, cpu: int, *, node_id: str = "n1", priority: int = 30, step: int | None = None, checkpoint: int | None = None,
            admitted_at: float = 0.0, borrowing: bool = False, allocs: int = 1) -> Candidate:  # fmt: skip
    return Candidate("team-a", job, f"{job}-run", priority, tuple((node_id, Resources(cpu, 100)) for _ in range(allocs)),
                     admitted_at, borrowing, step, checkpoint)  # fmt: skip


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
    assert preemption.reason(49, True, running("b", 1000, priority=90, borrowing=True)) == "its namespace reclaims its nominal quota"
    assert preemption.reason(49, False, running("b", 1000, priority=40, borrowing=True)) == ""


def test_the_run_losing_the_fewest_steps_since_its_checkpoint_is_preempted():
    fresh = running("fresh", 3000, step=1000, checkpoint=990)
    stale = running("stale", 3000, node_id="n2", step=1000, checkpoint=100)
    rooms = rooms_with(fresh, stale)
    assert names(preemption.choose(ask(group("big", 1, 3500)), rooms, [stale, fresh])) == ["fresh"]


def test_equal_losses_go_to_the_lowest_priority_then_the_most_recent():
    a = running("a", 3000, priority=30, admitted_at=100.0)
    b = running("b", 3000, node_id="n2", priority=20, admitted_at=50.0)
    assert names(preemption.choose(ask(group("big", 1, 3500)), rooms_with(a, b), [a, b])) == ["b"]
    c = running("c", 3000, priority=20, admitted_at=200.0)
    assert names(preemption.choose(ask(group("big", 1, 3500)), rooms_with(c, b), [b, c])) == ["c"]


def test_one_run_that_makes_room_alone_is_taken_before_two_cheaper_ones():
    small1, small2 = running("s1", 1500, step=0), running("s2", 1500, step=0)
    large = running("large", 3500, node_id="n2", step=500, checkpoint=0)
    rooms = rooms_with(small1, small2, large)  # n1: 1000 free, n2: 500 free
    assert names(preemption.choose(ask(group("big", 1, 3800)), rooms, [small1, small2, large])) == ["large"]


def test_a_whole_run_is_freed_on_every_node_it_holds_and_victims_not_needed_are_dropped():
    spread = running("spread", 1500, allocs=1)
    other = Candidate("team-a", "spread2", "r", 30, (("n1", Resources(1500, 100)), ("n2", Resources(1500, 100))))
    rooms = rooms_with(spread, other)  # n1: 4000-3000 = 1000 free; n2: 2500 free
    victims = preemption.choose(ask(group("chief", 1, 2000), group("worker", 1, 2500)), rooms, [other, spread])
    # Either alone makes room (the worker on one node, the chief on the other); equal costs
    # go by name. Its allocations on both nodes count for the one that holds two.
    assert names(victims) == ["spread"]
    assert preemption.fits_without(ask(group("chief", 1, 2000), group("worker", 1, 4000)), rooms, [other])
    assert not preemption.fits_without(ask(group("chief", 1, 2000), group("worker", 1, 4000)), rooms, [spread])


def test_when_even_every_candidate_would_not_make_room_nothing_is_chosen_and_rooms_stay():
    a = running("a", 1000)
    rooms = rooms_with(a)
    before = copy.deepcopy(rooms)
    assert preemption.choose(ask(group("huge", 1, 9000)), rooms, [a]) is None
    assert [(r.cpu, r.memory) for r in rooms] == [(r.cpu, r.memory) for r in before]


@pytest.mark.parametrize(("step", "checkpoint", "lost"), [(None, None, 0), (500, None, 500), (500, 450, 50), (500, 600, 0)])
def test_steps_lost_count_from_the_last_checkpoint(step, checkpoint, lost):
    assert running("a", 1, step=step, checkpoint=checkpoint).steps_lost == lost
