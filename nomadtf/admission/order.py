"""The queue's order, over the suspended runs Nomad holds. Pure.

1. Higher priority first: the job's Nomad `Priority` (clamped to Nomad's 1–100), capped at
   its namespace's `max_priority` in the sharing policy (a team cannot outrank every other
   by writing 100).
2. At equal priority, a run its namespace's nominal quota still holds goes before a run
   that would borrow beyond it.
3. Then the namespace with the smallest fair-share score goes first: its recent usage (the
   dominant share of the cluster it held, remembered with the policy's half-life: usage.py)
   plus the dominant share it holds now, divided by its weight. The order is built one run at
   a time, each run counted as holding its ask once picked, so two namespaces with equal
   usage alternate.
4. Within a namespace (and among equal scores), first come first served by `arrival`: the
   Raft index at which the controller first saw the run suspended (its registration's
   JobModifyIndex; one counter for the whole cluster, so no clocks are compared and no
   submitter can write it).

Worked example (docs/guide/queueing.md): team-a queued a1, a2, a3 and then team-b b1, all
priority 50, each needing 65 % of the cluster. a1 starts (nobody used anything). While a1
runs, team-a's score is at least 0.65 and team-b's 0: b1 is next, then a2, a3.

Usage:
    runs = fair_order(queued, policy, average_share, held, total)   # admission order
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nomadtf.admission import usage
from nomadtf.admission.fit import RunAsk
from nomadtf.admission.policy import Policy
from nomadtf.job.capacity import Resources

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
    priority: int  # capped at its namespace's max_priority
    arrival: int  # Raft index: see the module's rule
    since: float  # unix time it was registered (the job's SubmitTime), for display
    job_modify_index: int
    counts: dict[str, int] = field(default_factory=dict)
    gang_timeout_s: float = 30.0
    ask: RunAsk | None = None
    ready_timeout_s: float = 0.0  # its cluster has this long to form once placed (0: not watched)
    requeue_limit: int = 3
    minimum: dict[str, int] = field(default_factory=dict)  # elastic groups: the fewest tasks (counts: as admitted, at most the most)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.job_id)


def sort_key(run: QueuedRun) -> tuple[int, int, str, str]:
    """Within one namespace: priority, then arrival."""
    return (-run.priority, run.arrival, run.namespace, run.job_id)


def ordered(runs: Iterable[QueuedRun]) -> list[QueuedRun]:
    """By priority and arrival alone (one namespace's line)."""
    return sorted(runs, key=sort_key)


def fair_order(
    runs: Iterable[QueuedRun], policy: Policy, average_share: Mapping[str, float], held: Mapping[str, Resources], total: Resources,
) -> list[QueuedRun]:
    """Every run in admission order (the module's rule). `average_share`: each namespace's
    remembered dominant share (usage.py); `held`: what each holds now; `total`: the cluster."""
    lines: dict[str, list[QueuedRun]] = {}
    for run in ordered(runs):
        lines.setdefault(run.namespace, []).append(run)
    for line in lines.values():
        line.reverse()  # pop() takes the head
    holding = {ns: held.get(ns, Resources()) for ns in lines}
    cluster = usage.dimensions(total)
    out: list[QueuedRun] = []

    def key(namespace: str) -> tuple[int, int, float, int, str, str]:
        run, share = lines[namespace][-1], policy.of(namespace)
        needs = run.ask.needs if run.ask is not None else Resources()
        borrows = 1 if share.over(holding[namespace], needs, nominal_only=True) else 0
        score = (average_share.get(namespace, 0.0) + usage.dominant_share(usage.dimensions(holding[namespace]), cluster)) / share.weight
        return (-run.priority, borrows, round(score, 9), run.arrival, namespace, run.job_id)

    while lines:
        namespace = min(lines, key=key)
        run = lines[namespace].pop()
        out.append(run)
        if run.ask is not None:
            holding[namespace] = holding[namespace] + run.ask.needs
        if not lines[namespace]:
            del lines[namespace]
    return out
