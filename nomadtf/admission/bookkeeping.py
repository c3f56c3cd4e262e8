"""Pure: the leader's tunables, what it remembers about runs between steps, and the sums
over a run's allocations its steps share (what it holds, what it still misses, its grace)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nomadtf import wire
from nomadtf.admission import board as boards
from nomadtf.admission import elastic, fit, preemption
from nomadtf.admission.order import QueuedRun
from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, Job

STEP_WAIT_S = 5.0  # the leader looks at least this often (a gang deadline, a node's return)
MIN_STEP_S = 0.2  # a burst of changes makes one step, not one per change
MAX_ADMITS_PER_STEP = 20  # a burst is admitted over several steps: gang checks and the board keep up
PUBLISH_MIN_S = 1.0  # the board is written at most this often (it is rewritten whole)
NEVER_RECHECK_S = 60.0  # how often a waiting run is judged "never" again
REPUBLISH_S = 60.0  # an unchanged board is written again this often: its age says the leader lives
FORMING_CHECK_S = 2.0  # a placed run's generation is read at most this often
CHECKPOINT_CHECK_S = 1.0  # the progress of a run asked to checkpoint, this often: each step it runs on after saving is lost
REQUEUE_BACKOFF_S = 10.0  # a run whose cluster did not form waits this long before its next try, doubled each time
REQUEUE_BACKOFF_MAX_S = 300.0
MAX_PREEMPT_LOOKS = 5  # the first runs in line that do not fit look for victims each step, not all
MIN_PREEMPT_GRACE_S = 5.0  # a preempted run has at least this long (else its kill timeout) to checkpoint
MAX_PREEMPT_GRACE_S = 60.0  # and at most this long, whatever kill timeout its own job sets
RESIZE_SETTLE_S = 30.0  # an elastic run resized this recently does not grow again: each resize restarts its cluster


class LostLead(Exception):
    """The fence failed: another replica leads now; this one acts no more."""


@dataclass
class InFlight:
    """A run admitted and not yet placed whole."""

    run: QueuedRun
    deadline: float  # monotonic
    checked: float = 0.0  # monotonic: when its cluster's generation was last read (forming runs)


@dataclass
class Preempting:
    """A run asked to checkpoint, to be suspended once its kill timeout has passed."""

    victim: preemption.Candidate
    for_key: tuple[str, str]  # the waiting run it makes room for
    by: str  # "team-b/big (priority 90)"
    suspend_at: float  # monotonic
    checked: float = 0.0  # monotonic: when its progress was last read


@dataclass
class Seen:
    """A suspended-design job as last read, by its JobModifyIndex."""

    modify_index: int
    job: Job | None
    problem: str = ""


def holding_by_group(allocs: list[Allocation], key: tuple[str, str], since_index: int) -> dict[str, int]:
    """The allocations of this run of the job (created after its registration at
    `since_index`: an earlier run of the same name is not this one) that Nomad placed."""
    out: dict[str, int] = {}
    for alloc in allocs:
        if alloc.key == key and alloc.desired_status == "run" and alloc.create_index > since_index \
                and alloc.client_status in ("pending", "running", "complete"):
            out[alloc.task_group] = out.get(alloc.task_group, 0) + 1
    return out


def unplaced(ask: fit.RunAsk, allocs: list[Allocation], key: tuple[str, str], since_index: int) -> fit.RunAsk:
    """`ask` less the allocations of this run that already hold their place."""
    have = holding_by_group(allocs, key, since_index)
    counted: dict[str, int] = {}
    missing = []
    for slot in ask.slots:
        counted[slot.group] = counted.get(slot.group, 0) + 1
        if counted[slot.group] > have.get(slot.group, 0):
            missing.append(slot)
    return replace(ask, slots=tuple(missing))


def free_of(rooms: list[fit.Room], ask: fit.RunAsk) -> capacity.Resources:
    """What the usable nodes `ask` may use have free, summed."""
    mine = [r for r in rooms if r.usable and fit._takes(r, ask)]
    devices: dict[str, int] = {}
    for room in mine:
        for name, count in room.devices.items():
            devices[name] = devices.get(name, 0) + max(count, 0)
    return capacity.Resources(sum(max(r.cpu, 0) for r in mine), sum(max(r.memory, 0) for r in mine), devices)


def grace_s(job: Mapping[str, Any]) -> float:
    """How long a run asked to checkpoint has before it is suspended, shrunk or grown anyway."""
    return min(MAX_PREEMPT_GRACE_S, max(MIN_PREEMPT_GRACE_S, kill_timeout_s(job)))


def kill_timeout_s(job: Mapping[str, Any]) -> float:
    """The longest KillTimeout of the job's tasks, in seconds (Nomad's default: 5 s)."""
    timeouts = [int(task.get("KillTimeout") or 5_000_000_000) for group in job.get("TaskGroups") or [] for task in group.get("Tasks") or []]
    return max(timeouts, default=5_000_000_000) / 1e9


def board_line(run: QueuedRun, place: int, note: str, short: capacity.Resources | None = None) -> boards.BoardLine:
    assert run.ask is not None
    ticket = wire.queue_ticket(run.namespace, run.job_id, run.run_id)
    return boards.BoardLine(ticket, run.namespace, run.priority, place, run.since, run.ask.needs, short, note)


def batch_held(allocs: list[Allocation]) -> dict[str, capacity.Resources]:
    """namespace -> what its batch allocations hold now (the work quotas and usage count;
    service and system jobs are long-lived and outside the queue)."""
    out: dict[str, capacity.Resources] = {}
    for alloc in allocs:
        if alloc.holds_resources and alloc.job_type not in fit.LONG_LIVED_TYPES:
            namespace = alloc.namespace
            out[namespace] = out.get(namespace, capacity.Resources()) + alloc.resources
    return out


def sized(run: QueuedRun, rooms: list[fit.Room], held: capacity.Resources, share: Any) -> QueuedRun:
    """An elastic run at the largest counts its quota and `rooms` take now (elastic.largest),
    else at its minimums: it waits for, reserves and preempts for those."""
    assert run.ask is not None
    ask = run.ask

    def fits(counts: dict[str, int]) -> bool:
        smaller = ask.with_counts(counts)
        return not share.over(held, smaller.needs) and fit.fits(smaller, rooms)

    counts = elastic.largest(run.counts, run.minimum, fits) or {**run.counts, **run.minimum}
    return replace(run, counts=counts, ask=ask.with_counts(counts))


def growth(run: QueuedRun, now: dict[str, int], rooms: list[fit.Room], held: capacity.Resources, share: Any) -> dict[str, int] | None:
    """The largest counts above `now` (at most the run's most) whose added allocations its
    quota and `rooms` take now; None when not even one more does."""
    assert run.ask is not None
    ask = run.ask

    def fits(grown: dict[str, int]) -> bool:
        extra = ask.with_counts(elastic.extra(now, grown))
        return not share.over(held, extra.needs) and fit.fits(extra, rooms)

    return elastic.largest({group: run.counts[group] for group in now}, now, fits, above_bottom=True)
