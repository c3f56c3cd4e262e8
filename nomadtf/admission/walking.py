"""The walk in fair order: refuse what can never fit, admit what fits now (each call
behind the fence), let the rest wait, backfill or reserve (the controller's docstring, step 2).

One part of the admission controller (controller.py): its methods run on the leader's
`Controller`, whose state (the runs in flight, forming, preempting, growing) they share."""

from __future__ import annotations

import functools
import time

from nomadtf import wire
from nomadtf.admission import board as boards
from nomadtf.admission import elastic, fit, preemption, suspension
from nomadtf.admission.bookkeeping import (
    MAX_ADMITS_PER_STEP,
    MAX_PREEMPT_LOOKS,
    NEVER_RECHECK_S,
    InFlight,
    LostLead,
    board_line,
    free_of,
    sized,
    unplaced,
)
from nomadtf.admission.order import QueuedRun
from nomadtf.errors import NomadError, ServerError
from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, Job, Node


class WalksTheQueue:
    """The walk in order and the admitting calls."""

    def _walk(self, queued: list[QueuedRun], rooms: list[fit.Room], nodes: list[Node], allocs: list[Allocation],
              committed: dict[str, capacity.Resources], jobs: dict[tuple[str, str], Job]) -> list[boards.BoardLine]:  # fmt: skip
        """Admit what fits, in order (controller.py's docstring, step 2); the board's lines.
        `committed`: what each namespace holds and has admitted (its quota's use)."""
        policy = self.sharing.policy
        lines = []
        waiting = False  # a run did not start: capacity or quota may come back when allocations end
        strict_stop = False  # backfill off: nothing starts after the first run that does not fit
        admitted = 0
        now = time.time()
        place = 0
        running: list[preemption.Candidate] | None = None  # read once, when a run first does not fit
        later: list[fit.Room] | None = None  # the nodes once batch work ends: every reservation is placed in it in turn
        preempted = False  # one new preemption a step: each is seen through before the next is planned
        looked = 0  # runs that looked for victims this step
        for run in queued:
            assert run.ask is not None
            run_key = (run.namespace, run.job_id, run.run_id)
            share = policy.of(run.namespace)
            why = share.never(run.ask.needs)
            if not why and now - self.never_checked.get(run_key, 0.0) >= NEVER_RECHECK_S:
                self.never_checked[run_key] = now
                why = fit.never(run.ask, nodes, allocs, now, self.down_since)
            if why:
                self._refuse(run, f"it can never fit: {why}")
                continue
            place += 1
            if run.minimum and not self.by_job.get(run.key):
                run = sized(run, rooms, committed.get(run.namespace, capacity.Resources()), share)
            needs = run.ask.needs
            line = functools.partial(board_line, run, place)
            if admitted >= MAX_ADMITS_PER_STEP:
                lines.append(line("being admitted"))
                continue
            if now < self.not_before.get(run_key, 0.0):
                waiting = True
                lines.append(line(f"waits {self.not_before[run_key] - now:.0f}s before its next try: its cluster did not form last time"))
                continue
            # A run a predecessor half admitted already holds its scaled groups: only the rest must fit.
            missing = unplaced(run.ask, self.by_job.get(run.key, []), run.key, run.arrival)
            held = committed.get(run.namespace, capacity.Resources())
            over = share.over(held, missing.needs)
            if over:
                waiting = True
                lines.append(line(f"waits for its namespace's quota ({'; '.join(over)})"))
                continue
            if not strict_stop and fit.place(missing, rooms):
                try:
                    self.after_fit(run)
                    self._admit(run)
                except ServerError as exc:  # stopped, purged or re-registered meanwhile: next step reads it again
                    self.on_event(f"could not admit {run.namespace}/{run.job_id} run {run.run_id}: {exc}")
                    continue
                admitted += 1
                committed[run.namespace] = held + missing.needs
                lines.append(line("admitted"))
                continue
            short = capacity.shortfall(needs, free_of(rooms, run.ask))
            waiting = True
            making_room = not strict_stop and run.key in self.making_room
            if policy.preemption and not strict_stop and not making_room and not preempted and looked < MAX_PREEMPT_LOOKS:
                looked += 1
                if running is None:
                    running = self._running_runs(jobs, self.by_job, committed)
                making_room = preempted = self._preempt_for(run, missing, rooms, running, jobs, committed)
            if making_room:
                preemption.reserve_for(missing, rooms, self.making_room[run.key])  # what its victims give back is its
                count = len(self.making_room.get(run.key, ()))
                lines.append(line(f"does not fit now; preempting {count} run(s) to make room: it starts once they have stopped", short))
                continue
            if strict_stop:
                lines.append(line("waits for the runs ahead of it", short))
                continue
            if not policy.backfill:
                strict_stop = True
                lines.append(line("does not fit now", short))
                continue
            if now - (run.since or now) >= policy.reserve_after_s:
                later = later if later is not None else fit.later_rooms(nodes, allocs)
                if fit.reserve(missing, rooms, later):
                    lines.append(line("does not fit now; it holds a reservation: nothing new starts in what it needs", short))
                    continue
            lines.append(line("does not fit now", short))
        self.blocked, self.more = waiting, admitted >= MAX_ADMITS_PER_STEP
        return lines

    def _committed(self, held: dict[str, capacity.Resources]) -> dict[str, capacity.Resources]:
        """What each namespace's batch allocations hold (`held`), and what its admitted runs
        still wait for Nomad to place: its quota's use."""
        out = dict(held)
        for key, flight in self.in_flight.items():
            assert flight.run.ask is not None
            missing = unplaced(flight.run.ask, self.by_job.get(key, []), key, flight.run.arrival)
            out[key[0]] = out.get(key[0], capacity.Resources()) + missing.needs
        return out

    def _scale(self, run: QueuedRun, group: str, count: int, index: int, message: str, verdict: str) -> int:
        """One admitting call behind the fence; the JobModifyIndex it leaves.

        GET /v1/kv/nomadtf/_admission/leader?consistent ; POST /v1/job/:id/scale"""
        if not self.lease.still_leads():
            raise LostLead(f"{self.name} lost the lead while acting on {run.namespace}/{run.job_id}")
        reply = self._api(run.namespace).scale(
            run.job_id, group, count, message, modify_index=index, meta={wire.META_RUN: run.run_id, suspension.META_ADMISSION: verdict}
        )
        self.requests += 2
        return reply.job_modify_index

    def _admit(self, run: QueuedRun) -> None:
        """Record the intent, scale the groups up, then the placeholder down (the job is never
        `dead` between).  PUT /v1/kv/nomadtf/_admission/admitted/<ns>/<job> ; the scale calls"""
        job = self.seen[run.key].job
        if self.admitted.get(run.key) != run.run_id:
            if not self.lease.still_leads():
                raise LostLead(f"{self.name} lost the lead before admitting {run.namespace}/{run.job_id}")
            self.lease.publish(wire.kv_admitted(*run.key), run.run_id)
            self.admitted[run.key] = run.run_id
            self.requests += 2
        # The run's deadline counts from now, not from its submission (runtime/deadline.py).
        self.lease.publish(wire.kv_admitted_at(run.namespace, run.job_id, run.run_id), f"{time.time():.3f}")
        self.requests += 1
        current = suspension.group_counts(job.document) if job else {}
        waited = max(0.0, time.time() - run.since) if run.since else 0.0
        size = f" at {elastic.sizes(run.counts, run.minimum)}" if run.minimum else ""
        message = f"nomadtf admission: admitted run {run.run_id}{size} after {waited:.0f}s in the queue"
        if run.minimum:  # its tasks form at these counts, not at the most its job.json allows
            self._set_counts(run.namespace, run.job_id, run.run_id, {group: run.counts[group] for group in run.minimum})
            self.resized_at[run.key] = time.monotonic()  # it forms before it may grow
        index = run.job_modify_index
        for group, count in sorted(run.counts.items()):
            if current.get(group) != count:
                index = self._scale(run, group, count, index, message, "admitted")
        self._scale(run, suspension.PLACEHOLDER_GROUP, 0, index, message, "admitted")
        self.in_flight[run.key] = InFlight(run, time.monotonic() + run.gang_timeout_s)
        self.metrics.admitted(run.namespace, waited)
        self.sharing.record(run.namespace, "admitted", time.time())
        self.sharing.record(run.namespace, "queued_s", time.time(), waited)
        self._note(run, f"admitted{size} after {waited:.0f}s in the queue")

    def _refuse(self, run: QueuedRun, why: str) -> None:
        """Give up on a run: its placeholder to 0 with the reason (the job ends)."""
        try:
            self._scale(run, suspension.PLACEHOLDER_GROUP, 0, run.job_modify_index, f"nomadtf admission refused run {run.run_id}: {why}", "refused")
        except NomadError as exc:
            self.on_event(f"could not refuse {run.namespace}/{run.job_id}: {exc}")
            return
        self.metrics.refused(run.namespace)
        self.sharing.record(run.namespace, "refused", time.time())
        self._note(run, f"refused: {why}")
