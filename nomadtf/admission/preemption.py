"""Which running runs make room for a waiting one. Pure.

A waiting run may preempt a running run when

- its priority is at least PRIORITY_GAP higher (Nomad's own rule for preemption), or
- its namespace reclaims its nominal quota: the waiting run fits in its namespace's nominal
  quota, and the running run's namespace holds more than its own (it borrows).

The victims are whole runs (never one allocation of a distributed job): the fewest that make
room, chosen to lose the fewest steps (steps since each one's last checkpoint, from its
progress record), then the lowest priority, then the most recently admitted. One victim
that makes room on its own is taken before any pair; beyond that the search is greedy in
that order, then drops every victim the rest can do without.

Usage:
    victims = choose(ask, rooms, [c for c in candidates if reason(waiting, c)])   # None: no room
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

from nomadtf.admission import fit
from nomadtf.capacity import Resources

PRIORITY_GAP = 10


@dataclass(frozen=True)
class Candidate:
    """A running, admitted run that could be preempted."""

    namespace: str
    job_id: str
    run_id: str
    priority: int  # capped at its namespace's ceiling
    held: tuple[tuple[str, Resources], ...]  # (node id, what one allocation holds there)
    admitted_at: float = 0.0
    borrowing: bool = False  # its namespace holds more than its nominal quota
    step: int | None = None  # its latest reported step
    checkpoint_step: int | None = None  # its last reported checkpoint

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.job_id)

    @property
    def steps_lost(self) -> int:
        """Steps since its last checkpoint (all of them without one; 0 when it reports none)."""
        if self.step is None:
            return 0
        return max(0, self.step - (self.checkpoint_step or 0))


def reason(priority: int, reclaims: bool, candidate: Candidate) -> str:
    """Why a waiting run of `priority` (`reclaims`: it fits its namespace's nominal quota)
    may preempt `candidate`; "" when it may not."""
    if candidate.priority <= priority - PRIORITY_GAP:
        return f"priority {priority} over {candidate.priority}"
    if reclaims and candidate.borrowing:
        return "its namespace reclaims its nominal quota"
    return ""


def _cost(candidate: Candidate) -> tuple[int, int, float, str, str]:
    return (candidate.steps_lost, candidate.priority, -candidate.admitted_at, candidate.namespace, candidate.job_id)


def fits_without(ask: fit.RunAsk, rooms: list[fit.Room], victims: Iterable[Candidate]) -> bool:
    """Whether `ask` fits `rooms` once `victims` gave back what they hold (rooms unchanged)."""
    trial = copy.deepcopy(rooms)
    by_id = {room.node_id: room for room in trial}
    for victim in victims:
        for node_id, held in victim.held:
            room = by_id.get(node_id)
            if room is None:
                continue
            room.cpu += held.cpu
            room.memory += held.memory
            for name, count in held.devices.items():
                room.devices[name] = room.devices.get(name, 0) + count
            room.jobs.pop(victim.key, None)
    return fit.place(ask, trial)


def choose(ask: fit.RunAsk, rooms: list[fit.Room], candidates: Iterable[Candidate]) -> list[Candidate] | None:
    """The victims that make room for `ask` (see the module's rule); None when even all of
    `candidates` would not."""
    ordered = sorted(candidates, key=_cost)
    for single in ordered:
        if fits_without(ask, rooms, [single]):
            return [single]
    chosen: list[Candidate] = []
    for candidate in ordered:
        chosen.append(candidate)
        if fits_without(ask, rooms, chosen):
            break
    else:
        return None
    for candidate in sorted(chosen, key=_cost, reverse=True):  # the costliest first: drop it if the rest will do
        rest = [c for c in chosen if c is not candidate]
        if fits_without(ask, rooms, rest):
            chosen = rest
    return chosen
