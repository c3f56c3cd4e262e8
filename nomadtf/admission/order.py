"""The queue's one ordering rule, over the suspended runs Nomad holds. Pure.

Higher priority first (the job's Nomad `Priority`, clamped to Nomad's 1–100); among equal
priorities, first come first served by `arrival`: the Raft index at which the controller
first saw the run suspended (its registration's JobModifyIndex; one counter for the whole
cluster, so no clocks are compared and no submitter can write it). Namespaces play no part
yet (fair sharing between teams is the next step). Strict: only runs in order are admitted,
a large run at the head is never overtaken, nothing running is preempted.

Usage:
    runs = ordered(queued)          # admission order
    place_of(runs, key)             # (2, 5): second of five
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from nomadtf.admission.fit import RunAsk

NOMAD_MIN_PRIORITY, NOMAD_MAX_PRIORITY = 1, 100


def clamp_priority(value: object) -> int:
    """Nomad's range; anything unreadable is the default 50."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 50
    return max(NOMAD_MIN_PRIORITY, min(NOMAD_MAX_PRIORITY, number))


@dataclass(frozen=True)
class QueuedRun:
    """One suspended run as the controller read it from Nomad."""

    namespace: str
    job_id: str
    run_id: str
    priority: int
    arrival: int  # Raft index: see the module's rule
    since: float  # unix time it was registered (the job's SubmitTime), for display
    job_modify_index: int
    counts: dict[str, int] = field(default_factory=dict)
    gang_timeout_s: float = 30.0
    ask: RunAsk | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.job_id)


def sort_key(run: QueuedRun) -> tuple[int, int, str, str]:
    return (-run.priority, run.arrival, run.namespace, run.job_id)


def ordered(runs: Iterable[QueuedRun]) -> list[QueuedRun]:
    return sorted(runs, key=sort_key)


def place_of(runs: list[QueuedRun], key: tuple[str, str]) -> tuple[int, int]:
    """(place, length) in `runs` (already ordered); (0, length) when not there."""
    for place, run in enumerate(runs, start=1):
        if run.key == key:
            return place, len(runs)
    return 0, len(runs)
