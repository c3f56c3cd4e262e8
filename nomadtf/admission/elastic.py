"""Elastic runs: the sizes a run with `count: {"min", "max"}` may take. Pure.

An elastic run is admitted at the largest size that fits now (at least its minimums), grown
towards its maximums when capacity frees while no run waits, at a checkpoint, and shrunk to
its minimums before a preemption suspends it whole (preemption.as_shrink). Sizes run from
`top` down to `bottom` one task at a time, taken from the elastic groups in turn
(suspension.shrunk); whether a size fits is monotonic in practice (fewer tasks never need
more), so the largest that fits is found by bisection: log2(max - min) packings.

Usage:
    counts = largest(run.counts, run.minimum, lambda c: fit.fits(ask.with_counts(c), rooms))
    grown = largest(wanted.counts, now, fits_extra, above_bottom=True)    # None: no growth fits
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nomadtf.admission import suspension


def largest(top: Mapping[str, int], bottom: Mapping[str, int], fits: Callable[[dict[str, int]], bool], *,
            above_bottom: bool = False) -> dict[str, int] | None:  # fmt: skip
    """The largest counts from `top` down to `bottom` (or to one task above it) that `fits`;
    None when not even the smallest does. `bottom` names the elastic groups: the others stay
    as `top` has them."""
    span = suspension.shrinkable(top, bottom)
    lo, hi = 0, span - 1 if above_bottom else span
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        counts = suspension.shrunk(top, bottom, mid)
        if fits(counts):
            best, hi = counts, mid - 1
        else:
            lo = mid + 1
    return best


def extra(now: Mapping[str, int], grown: Mapping[str, int]) -> dict[str, int]:
    """How many allocations of each group growing from `now` to `grown` adds."""
    return {group: count - now.get(group, 0) for group, count in grown.items() if count > now.get(group, 0)}


def sizes(counts: Mapping[str, int], minimum: Mapping[str, int]) -> str:
    """ "worker=2 of 1-3", for notes and scaling messages."""
    return ", ".join(f"{group}={counts.get(group, 0)}" for group in sorted(minimum))


@dataclass
class Growing:
    """An elastic run asked to checkpoint before it grows."""

    run_id: str
    before: dict[str, int]  # its elastic groups' counts now
    to: dict[str, int]  # what it grows to
    checkpoint_step: int | None  # its last reported checkpoint when asked
    grow_at: float  # monotonic: grown then even without a new checkpoint
    checked: float = 0.0  # monotonic: when its progress was last read
    placed_by: float = (
        0.0  # monotonic, once scaled: its new allocations placed by then, else it goes back to `before`
    )
    extra: dict[str, int] = field(default_factory=dict)
