"""Preemption: the running runs a waiting one may preempt, its victims asked to
checkpoint (SIGUSR1), then suspended whole or, elastic, shrunk.

One part of the admission controller (controller.py): its methods run on the leader's
`Controller`, whose state (the runs in flight, forming, preempting, growing) they share."""

from __future__ import annotations

import time
from dataclasses import replace

from nomadtf.admission import elastic, fit, order, preemption, suspension
from nomadtf.admission.bookkeeping import (
    CHECKPOINT_CHECK_S,
    Preempting,
    grace_s,
)
from nomadtf.admission.order import QueuedRun
from nomadtf.errors import ServerError
from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, Job


class Preempts:
    """Victims chosen, asked to checkpoint, then suspended or shrunk."""

    def _running_runs(self, jobs: dict[tuple[str, str], Job], by_job: dict[tuple[str, str], list[Allocation]],
                      committed: dict[str, capacity.Resources]) -> list[preemption.Candidate]:  # fmt: skip
        """The admitted runs placed whole and running that a waiting run might preempt (their
        progress not read yet); none given back or asked to checkpoint this step."""
        policy = self.sharing.policy
        out = []
        for key, job in jobs.items():
            own = [a for a in by_job.get(key, []) if a.holds_resources]
            if not own or key in self.in_flight or key in self.preempting or key in self.given_back or job.dead:
                continue
            if suspension.state(job.document) != suspension.ADMITTED:
                continue
            owner = policy.of(key[0])
            borrowing = owner.nominal is not None and bool(owner.over(committed.get(key[0], capacity.Resources()), capacity.Resources(), nominal_only=True))
            started = min(a.create_time for a in own) / 1e9
            out.append(preemption.Candidate(key[0], key[1], job.run_id,
                                            owner.priority(order.clamp_priority(job.priority)),
                                            tuple((a.node_id, a.resources) for a in own), started, borrowing))  # fmt: skip
        return out

    def _preempt_for(self, run: QueuedRun, missing: fit.RunAsk, rooms: list[fit.Room], running: list[preemption.Candidate],
                     jobs: dict[tuple[str, str], Job], committed: dict[str, capacity.Resources]) -> bool:  # fmt: skip
        """Start preempting the runs that make room for `run` (preemption.py), if any may.

        GET .../progress per weighed candidate ; POST /v1/client/allocation/:id/signal per victim allocation"""
        share = self.sharing.policy.of(run.namespace)
        reclaims = share.nominal is not None and not share.over(committed.get(run.namespace, capacity.Resources()), missing.needs, nominal_only=True)
        eligible = [c for c in running if c.key != run.key and c.key not in self.preempting and preemption.reason(run.priority, reclaims, c)]
        # Elastic runs shrunk to their minimums first: only if that is not room enough is any run suspended whole.
        shrinks = [shrink for c in eligible if (shrink := self._as_shrink(c, jobs[c.key])) is not None]
        victims = None
        for candidates in (preemption.cheapest(shrinks), preemption.cheapest(eligible)):
            if not candidates or not preemption.fits_without(missing, rooms, candidates):
                continue
            candidates = [replace(c, **self._progress_of(c.namespace, c.job_id, c.run_id)) for c in candidates]
            victims = preemption.choose(missing, rooms, candidates, time.time())
            if victims:
                break
        if not victims:
            return False
        by = f"{run.namespace}/{run.job_id} (priority {run.priority})"
        for victim in victims:
            self._ask_to_checkpoint(victim, jobs[victim.key], by, run.key)
        self.making_room[run.key] = victims
        return True

    def _in_play(self, victim: preemption.Candidate, holding: set[tuple[str, str]]) -> bool:
        """A victim still making room: asked to checkpoint, or suspended and still holding
        (its allocations stopping), or shrunk and its tasks beyond the new counts still
        holding."""
        if victim.key in self.preempting:
            return True
        if not victim.shrink_to:
            return victim.key in holding
        return bool(preemption.beyond(self.by_job.get(victim.key, []), dict(victim.shrink_to)))

    def _as_shrink(self, candidate: preemption.Candidate, job: Job) -> preemption.Candidate | None:
        """`candidate` as an elastic run shrunk to its minimums (None: not elastic, or at them)."""
        try:
            wanted = suspension.Suspension.of(job.document)
        except suspension.Malformed:
            return None
        if wanted is None or not wanted.minimum:
            return None
        counts = {group: count for group, count in suspension.group_counts(job.document).items() if group in wanted.counts}
        return preemption.as_shrink(candidate, self.by_job.get(candidate.key, []), counts, wanted.minimum)

    def _progress_of(self, namespace: str, job_id: str, run_id: str) -> dict[str, int | None]:
        """{"step", "checkpoint_step"} from the run's progress record (None: none reported, or
        not a sane number: the record is the team's own to write).

        GET /v1/kv/nomadtf/<ns>/<job>/<run>/progress"""
        from nomadtf.servers.consul import ConsulDiscovery

        try:
            record = ConsulDiscovery(job_id, namespace, client=self.consul, run_id=run_id).progress()
        except (ServerError, ValueError):
            record = None
        self.requests += 1
        step, checkpoint_step, _ = preemption.progress_numbers(record)
        return {"step": step, "checkpoint_step": checkpoint_step}

    def _ask_to_checkpoint(self, victim: preemption.Candidate, job: Job, by: str, for_key: tuple[str, str]) -> None:
        """SIGUSR1 to each of the victim's allocations (the supervisor passes it on to code that
        catches it); it is suspended (or, elastic, shrunk) once it reports a new checkpoint, or
        its kill timeout (at most MAX_PREEMPT_GRACE_S: the victim's own job sets it) has passed."""
        self._signal_checkpoint(victim.namespace, victim.job_id)
        grace = grace_s(job.document)
        self.preempting[victim.key] = Preempting(victim, for_key, by, time.monotonic() + grace)
        self.growing.pop(victim.key, None)
        lost = f"{victim.lost_s(time.time()):.0f}s of work since its last checkpoint" if victim.step else "no steps reported"
        what = f"shrunk to {', '.join(f'{g}={n}' for g, n in victim.shrink_to)}" if victim.shrink_to else "suspended"
        self._note_key(victim.namespace, victim.job_id, victim.run_id,
                       f"to be preempted for {by}: asked to checkpoint, {what} in at most {grace:.0f}s ({lost})")  # fmt: skip

    def _signal_checkpoint(self, namespace: str, job_id: str) -> None:
        """SIGUSR1 to each running allocation of the job.

        GET /v1/job/:id/allocations ; POST /v1/client/allocation/:id/signal per allocation"""
        api = self._api(namespace)
        for alloc in api.allocations(job_id):
            if alloc.client_status == "running":
                try:
                    api.signal_allocation(alloc.id, "SIGUSR1")
                except ServerError as exc:
                    self.on_event(f"could not ask {namespace}/{job_id} allocation {alloc.id[:8]} to checkpoint: {exc}")
                self.requests += 1
        self.requests += 1

    def _suspend_preempted(self, jobs: dict[tuple[str, str], Job]) -> None:
        """Each victim that checkpointed or whose grace has passed: suspended whole and queued
        again. A preemption whose waiting run no longer waits (admitted elsewhere, stopped,
        purged) is called off: nothing is suspended for nobody."""
        for key, preempting in list(self.preempting.items()):
            job = jobs.get(key)
            if job is None or job.run_id != preempting.victim.run_id or job.dead:
                del self.preempting[key]  # it ended (or was stopped) meanwhile: nothing to suspend
                continue
            waiting = jobs.get(preempting.for_key)
            if waiting is None or suspension.state(waiting.document) != suspension.QUEUED:
                del self.preempting[key]
                self._note_key(*key, preempting.victim.run_id, f"preemption for {preempting.by} called off: that run no longer waits")
                continue
            if time.monotonic() < preempting.suspend_at and not self._checkpointed_since(
                    preempting, *key, preempting.victim.run_id, preempting.victim.checkpoint_step):
                continue
            run = self._queued_run(job)
            if run is None:
                del self.preempting[key]
                continue
            step = self._progress_of(*key, run.run_id)["step"]
            at = f" at step {step}" if step is not None else ""
            if preempting.victim.shrink_to:
                counts = dict(preempting.victim.shrink_to)
                said = f"shrunk to {elastic.sizes(counts, run.minimum)}{at} for {preempting.by}"
                if self._resize(run, job, counts, f"nomadtf admission: run {run.run_id} {said}", "shrunk"):
                    del self.preempting[key]
                    self.metrics.preempted(run.namespace)
                    self._note(run, said)
                continue
            index = self._give_back(run, job, {}, f"nomadtf admission: run {run.run_id} preempted{at} by {preempting.by}; requeued", "preempted",
                                    f"preempted{at} by {preempting.by}: suspended whole; queued again")  # fmt: skip
            if index is None:
                continue  # could not suspend it now: tried again next step
            del self.preempting[key]
            self.metrics.preempted(run.namespace)
            self.sharing.record(run.namespace, "preempted", time.time())

    def _checkpointed_since(self, asked: Preempting | elastic.Growing, namespace: str, job_id: str, run_id: str, before: int | None) -> bool:
        """The run reported a checkpoint newer than `before`, the one it had when it was
        asked: it need not be given the rest of its grace. Read at most every CHECKPOINT_CHECK_S."""
        if time.monotonic() - asked.checked < CHECKPOINT_CHECK_S:
            return False
        asked.checked = time.monotonic()
        saved = self._progress_of(namespace, job_id, run_id)["checkpoint_step"]
        return saved is not None and (before is None or saved > before)
