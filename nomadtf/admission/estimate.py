"""When each queued run may start: a plan of the queue on the cluster's capacity over time.
Pure.

What runs now ends when its own numbers say: a nomadtf run that reports steps and declares
how many (`context.steps`) at the rate it has reported so far; one that declares a duration
(`admission.duration`) that long after it started; anything else (a job nomadtf did not
start, a run that says neither) is taken to hold what it holds for good. The queued runs are
planned in the queue's order, each at the earliest time from which the cluster's free
capacity (CPU, memory, GPUs, summed over the nodes) holds it for its whole declared
duration (conservative backfill: a later run may be planned earlier, but never so as to
delay one ahead of it). A run whose start or whose predecessors' ends cannot be told gets no
estimate. Packing onto nodes, constraints and preemption are not planned: an estimate.

Usage:
    ends = end_of(step=120, steps=600, first=(20, t0), last=(120, t1))     # the running run's end
    starts = plan(free_now, [Holding(needs, ends_at)], [Planned(key, needs, duration_s)], now)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Hashable

from nomadtf.admission import usage
from nomadtf.job.capacity import Resources

DIMENSIONS = ("cpu", "memory", usage.GPU)


@dataclass(frozen=True)
class Holding:
    """What a running job holds, and when it gives it back (None: not known)."""

    needs: Resources
    ends_at: float | None


@dataclass(frozen=True)
class Planned:
    """A queued run, in the queue's order."""

    key: Hashable
    needs: Resources
    duration_s: float | None  # None: not declared (it holds its room for good, for the plan)


def end_of(steps: int | None, first: tuple[int, float] | None, last: tuple[int, float] | None, started: float | None,
           duration_s: float | None) -> float | None:  # fmt: skip
    """When a running run ends: from its step rate (two reports, `first` and `last`, each
    (step, unix time)) and the steps it declared; else its declared duration from `started`."""
    if steps and first and last and last[1] > first[1] and last[0] > first[0]:
        rate = (last[0] - first[0]) / (last[1] - first[1])
        ends = last[1] + max(0, steps - last[0]) / rate if rate > 0 else math.inf
        return ends if math.isfinite(ends) else None
    if duration_s is not None and started is not None:
        return started + duration_s
    return None


def _vector(amount: Resources) -> tuple[float, ...]:
    dims = usage.dimensions(amount)
    return tuple(dims[k] for k in DIMENSIONS)


def plan(free_now: Resources, holding: Iterable[Holding], waiting: Sequence[Planned], now: float) -> dict[Hashable, float | None]:
    """Each waiting run's estimated start (unix time), or None (see the module's rule)."""
    events: dict[float, list[float]] = {}  # time -> change of the free capacity from then on

    def change(at: float, delta: Iterable[float]) -> None:
        row = events.setdefault(at, [0.0] * len(DIMENSIONS))
        for i, value in enumerate(delta):
            row[i] += value

    base = _vector(free_now)
    for held in holding:
        if held.ends_at is not None:
            change(max(held.ends_at, now), _vector(held.needs))
    out: dict[Hashable, float | None] = {}
    for run in waiting:
        need = _vector(run.needs)
        times = sorted({now, *(t for t in events if t >= now)})
        levels, level = [], list(base)
        for t in times:  # the free capacity on [times[i], times[i + 1])
            level = [a + b for a, b in zip(level, events.get(t, [0.0] * len(DIMENSIONS)), strict=True)]
            levels.append(level)
        found, i = None, 0
        while i < len(times):  # the earliest start whose whole duration fits; a segment too short skips every start before it
            end = times[i] + run.duration_s if run.duration_s is not None else float("inf")
            j = i
            while j < len(times) and times[j] < end and all(levels[j][k] >= need[k] - 1e-9 for k in range(len(DIMENSIONS))):
                j += 1
            if j == len(times) or times[j] >= end:
                found = times[i]
                break
            i = j + 1
        out[run.key] = found
        if found is not None:
            change(found, [-x for x in need])
            if run.duration_s is not None:
                change(found + run.duration_s, need)
    return out
