"""Which running runs make room for a waiting one. Pure.

A waiting run may preempt a running run when

- its priority is at least PRIORITY_GAP higher (Nomad's own rule for preemption), or
- its namespace reclaims its nominal quota: the waiting run fits in its namespace's nominal
  quota, and the running run's namespace holds more than its own (it borrows).

(the second never against a run of higher priority: the victim would sort ahead of the
reclaiming run once requeued, take the room back and be preempted again, in a loop).

The victims are whole runs (never one allocation of a distributed job): the fewest that make
room, chosen to lose the least work, then the lowest priority, then the most recently
started. The work a run loses is the time it has run (from Nomad's own record of its
allocations) times the share of its reported steps since its last reported checkpoint
(`nomadtf.progress`); a run that reports no steps counts as losing all of it. So a team
that misreports its steps can make its run look at worst like one that never checkpoints,
never cheaper to keep than it is. One victim that makes room on its own is taken before any
pair; beyond that the search is greedy in that order, then drops every victim the rest can
do without. At most MAX_CANDIDATES are weighed.

An elastic run above its minimums (`count: {"min", "max"}`) is first offered shrunk: as a
candidate it gives back only its elastic groups' allocations beyond their minimums (Nomad
stops the highest-numbered first). The controller tries those alone before any run is
suspended whole.

Usage:
    victims = choose(ask, rooms, [c for c in candidates if reason(waiting, c)])   # None: no room
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from nomadtf.admission import fit
from nomadtf.job.answers import Allocation
from nomadtf.job.capacity import Resources

PRIORITY_GAP = 10
MAX_CANDIDATES = 20  # the cheapest by priority and age; their progress is read, the rest not weighed
MAX_STEP = 10**12


def progress_numbers(record: object) -> tuple[int | None, int | None, float | None]:
    """(step, checkpoint_step, time) of a progress record a team's own tasks write: each
    None unless it is a sane number (a whole number from 0 to MAX_STEP; a finite time)."""
    if not isinstance(record, dict):
        return None, None, None

    def whole(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP else None

    at = record.get("time")
    good_time = isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at) and 0 < at < 1e11
    return whole(record.get("step")), whole(record.get("checkpoint_step")), float(at) if good_time else None


@dataclass(frozen=True)
class Candidate:
    """A running, admitted run that could be preempted."""

    namespace: str
    job_id: str
    run_id: str
    priority: int  # capped at its namespace's ceiling
    held: tuple[tuple[str, Resources], ...]  # (node id, what one allocation holds there)
    started: float = 0.0  # unix time of its first allocation (Nomad's record)
    borrowing: bool = False  # its namespace holds more than its nominal quota
    step: int | None = None  # its latest reported step
    checkpoint_step: int | None = None  # its last reported checkpoint
    shrink_to: tuple[tuple[str, int], ...] = ()  # set: shrunk to these group counts, not suspended (held: what it gives back)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.job_id)

    def lost_s(self, now: float) -> float:
        """The seconds of work a preemption would lose (see the module's rule)."""
        running = max(0.0, now - self.started) if self.started else 0.0
        if not self.step:
            return running
        return running * min(1.0, max(0, self.step - (self.checkpoint_step or 0)) / self.step)


_ALLOC_INDEX = re.compile(r"\[(\d+)\]$")


def as_shrink(candidate: Candidate, allocs: Iterable[Allocation], counts: Mapping[str, int],
              minimum: Mapping[str, int]) -> Candidate | None:  # fmt: skip
    """`candidate` shrunk to its minimums instead of suspended whole: it gives back only its
    elastic groups' allocations numbered at or above their minimums. None: none to give."""
    target = {group: min(count, minimum[group]) for group, count in counts.items() if group in minimum}
    if all(counts[group] <= least for group, least in target.items()):
        return None  # at its minimums already
    surplus = [(a.node_id, a.resources) for a in beyond(allocs, target)]
    if not surplus:
        return None
    return replace(candidate, held=tuple(surplus), shrink_to=tuple(sorted(target.items())))


def beyond(allocs: Iterable[Allocation], counts: Mapping[str, int]) -> list[Allocation]:
    """The allocations still holding room in `counts`' groups numbered at or above those
    counts: what a group scaled down to them gives back (Nomad stops the highest first)."""
    out = []
    for alloc in allocs:
        group, found = alloc.task_group, _ALLOC_INDEX.search(alloc.name)
        if group in counts and found and int(found.group(1)) >= counts[group] and alloc.holds_resources:
            out.append(alloc)
    return out


def reason(priority: int, reclaims: bool, candidate: Candidate) -> str:
    """Why a waiting run of `priority` (`reclaims`: it fits its namespace's nominal quota)
    may preempt `candidate`; "" when it may not."""
    if candidate.priority <= priority - PRIORITY_GAP:
        return f"priority {priority} over {candidate.priority}"
    if reclaims and candidate.borrowing and candidate.priority <= priority:
        return "its namespace reclaims its nominal quota"
    return ""


def cheapest(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The MAX_CANDIDATES likeliest victims before their progress is read: lowest priority,
    most recently started."""
    return sorted(candidates, key=lambda c: (c.priority, -c.started, c.namespace, c.job_id))[:MAX_CANDIDATES]


def reserve_for(ask: fit.RunAsk, rooms: list[fit.Room], victims: Iterable[Candidate]) -> None:
    """Hold back in `rooms`, on the nodes its victims give back, what the preempting run will
    take there: backfill does not take the room it preempted for."""
    victims = list(victims)
    theirs = {node_id for victim in victims for node_id, _ in victim.held}
    trial = sorted(_without(rooms, victims), key=lambda room: room.node_id not in theirs)  # first fit: their nodes first
    taken: list[tuple[str, fit.Slot]] = []
    if fit.place(ask, trial, taken=taken):
        fit.hold_back(rooms, taken)


def fits_without(ask: fit.RunAsk, rooms: list[fit.Room], victims: Iterable[Candidate]) -> bool:
    """Whether `ask` fits `rooms` once `victims` gave back what they hold (rooms unchanged)."""
    return fit.place(ask, _without(rooms, victims))


def _without(rooms: list[fit.Room], victims: Iterable[Candidate]) -> list[fit.Room]:
    """A copy of `rooms` with what `victims` hold given back."""
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
    return trial


def choose(ask: fit.RunAsk, rooms: list[fit.Room], candidates: Iterable[Candidate], now: float) -> list[Candidate] | None:
    """The victims that make room for `ask` (see the module's rule); None when even all of
    `candidates` would not."""

    def _cost(candidate: Candidate) -> tuple[float, int, float, str, str]:
        return (round(candidate.lost_s(now), 3), candidate.priority, -candidate.started, candidate.namespace, candidate.job_id)

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
