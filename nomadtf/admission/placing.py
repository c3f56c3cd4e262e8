"""Admitted runs until placed whole and formed: a run placed in part past its gang
timeout, or whose cluster did not form in time, is given back and queued again (then refused
past its requeue limit).

One part of the admission controller (controller.py): its methods run on the leader's
`Controller`, whose state (the runs in flight, forming, preempting, growing) they share."""

from __future__ import annotations

import time
from dataclasses import replace

from nomadtf import wire
from nomadtf.admission import fit, suspension
from nomadtf.admission.bookkeeping import (
    FORMING_CHECK_S,
    REQUEUE_BACKOFF_MAX_S,
    REQUEUE_BACKOFF_S,
    InFlight,
    holding_by_group,
    unplaced,
)
from nomadtf.admission.order import QueuedRun
from nomadtf.errors import NomadError, ServerError
from nomadtf.job.answers import Allocation, Job


class WatchesPlacement:
    """Admitted runs until placed whole and formed, or given back."""

    def _check_in_flight(self, jobs: dict[tuple[str, str], Job], allocs: list[Allocation]) -> None:
        """Each admitted run not yet placed whole: placed now (done), or past its gang
        timeout (given back). Its own allocations, terminal ones too: a short task may have
        ended before it is looked at.  GET /v1/job/:id/allocations per run in flight"""
        for key, flight in list(self.in_flight.items()):
            job = jobs.get(key)
            if job is None or job.run_id != flight.run.run_id:
                self.in_flight.pop(key, None)
                continue
            own = self._api(key[0]).allocations(key[1])
            self.requests += 1
            placed = holding_by_group(own, key, flight.run.arrival)
            if all(placed.get(group, 0) >= count for group, count in flight.run.counts.items()):
                self.in_flight.pop(key, None)
                if flight.run.ready_timeout_s > 0:
                    self.forming[key] = InFlight(flight.run, time.monotonic() + flight.run.ready_timeout_s)
            elif time.monotonic() > flight.deadline:
                self.in_flight.pop(key, None)
                self._give_back(flight.run, job, placed)

    def _check_forming(self, jobs: dict[tuple[str, str], Job]) -> None:
        """Each run placed whole whose cluster had not formed: formed now (done), or past its
        ready timeout: given back and queued again after a backoff, or, past its requeue
        limit, refused.  GET .../cluster/generation per run ; GET /v1/job/:id/scale at a timeout"""
        from nomadtf.servers.consul import ConsulDiscovery

        for key, forming in list(self.forming.items()):
            run, job = forming.run, jobs.get(key)
            if job is None or job.run_id != run.run_id or job.dead \
                    or suspension.state(job.document) != suspension.ADMITTED:
                del self.forming[key]
                continue
            if time.monotonic() < forming.deadline and time.monotonic() - forming.checked < FORMING_CHECK_S:
                continue
            forming.checked = time.monotonic()
            try:
                generation = ConsulDiscovery(run.job_id, run.namespace, client=self.consul, run_id=run.run_id).generation()[0]
            except (ServerError, ValueError):
                continue  # cannot tell: ask again next step
            self.requests += 1
            number = generation.get("generation") if isinstance(generation, dict) else None  # the team's own key: anything
            if isinstance(number, int) and not isinstance(number, bool) and number >= 1:
                del self.forming[key]
                continue
            if time.monotonic() < forming.deadline:
                continue
            del self.forming[key]
            tries = self._not_ready_count(run) + 1
            if tries > run.requeue_limit:
                why = f"its cluster did not form within {run.ready_timeout_s:g}s of being placed, {tries} times (admission.requeue_limit {run.requeue_limit})"
                index = self._give_back(run, job, {}, f"nomadtf admission: run {run.run_id}: {why}; giving up", "not-ready", f"not ready: {why}; giving up")
                if index is not None:
                    self._refuse(replace(run, job_modify_index=index), why)
                continue
            backoff = min(REQUEUE_BACKOFF_MAX_S, REQUEUE_BACKOFF_S * 2 ** (tries - 1))
            self.not_before[(run.namespace, run.job_id, run.run_id)] = time.time() + backoff
            said = (f"its cluster did not form within {run.ready_timeout_s:g}s of being placed; queued again "
                    f"({tries} of {run.requeue_limit}), next try in {backoff:.0f}s")  # fmt: skip
            self._give_back(run, job, {}, f"nomadtf admission: run {run.run_id}: {said}", "not-ready", f"not ready: {said}")

    def _not_ready_count(self, run: QueuedRun) -> int:
        """How often this run was queued again for not forming (the placeholder's scaling
        events say so whoever led then).  GET /v1/job/:id/scale"""
        try:
            events = self._api(run.namespace).scaling_events(run.job_id).get(suspension.PLACEHOLDER_GROUP) or []
        except NomadError:
            return 0
        self.requests += 1
        return sum(1 for e in events if e.meta.get(suspension.META_ADMISSION) == "not-ready"
                   and e.meta.get(wire.META_RUN) == run.run_id and e.count == 1)  # fmt: skip

    def _give_back(self, run: QueuedRun, job: Job, placed: dict[str, int], message: str = "", verdict: str = "requeued",
                   note: str = "") -> int | None:  # fmt: skip
        """Placeholder up first (the job stays pending), then every group to 0, the unplaced
        ones first (a placed group stopped first would free room for a blocked one, which
        Nomad would then place only for us to stop it); the run's Consul keys go (its next
        admission starts afresh); it keeps its place in line. `message`/`verdict`: what the
        placeholder's scaling event says (a preemption's, else the gang timeout's). The
        JobModifyIndex the last call left; None when a call failed."""
        from nomadtf.servers.consul import ConsulDiscovery

        message = message or f"nomadtf admission: run {run.run_id} not placed whole within its gang timeout; queued again"
        index = None
        try:
            index = self._scale(run, suspension.PLACEHOLDER_GROUP, 1, job.modify_index, message, verdict)
            for group in sorted(run.counts, key=lambda g: (placed.get(g, 0) >= run.counts[g], g)):
                index = self._scale(run, group, 0, index, f"nomadtf admission: gave back the placed part of run {run.run_id}", verdict)
        except NomadError as exc:
            self.on_event(f"could not give back {run.namespace}/{run.job_id}: {exc}")
            return None
        self.given_back.add(run.key)
        try:
            ConsulDiscovery(run.job_id, run.namespace, client=self.consul, run_id=run.run_id).delete_run_keys()
        except ServerError as exc:
            self.on_event(f"could not clear the Consul keys of {run.namespace}/{run.job_id} run {run.run_id}: {exc}")
        if note:
            self._note(run, note)
            return index
        self.metrics.gave_back(run.namespace)
        self._note(run, f"not placed whole within {run.gang_timeout_s:g}s: gave back its placed part; queued again")
        return index

    def _reserve_in_flight(self, rooms: list[fit.Room], allocs: list[Allocation]) -> None:
        """Take from `rooms` what admitted runs still wait for Nomad to place."""
        for key, flight in self.in_flight.items():
            assert flight.run.ask is not None
            missing = unplaced(flight.run.ask, self.by_job.get(key, []), key, flight.run.arrival)
            if missing.slots:
                fit.place(missing, rooms)
