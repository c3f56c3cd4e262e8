"""The leader's reads: the live suspended-design jobs (each read again only when its
JobModifyIndex changed), a run's end booked in the ledger once, a job as a queued run.

One part of the admission controller (controller.py): its methods run on the leader's
`Controller`, whose state (the runs in flight, forming, preempting, growing) they share."""

from __future__ import annotations

import time

from nomadtf import wire
from nomadtf.admission import board as boards
from nomadtf.admission import fit, order, suspension
from nomadtf.admission.bookkeeping import (
    Seen,
)
from nomadtf.admission.order import QueuedRun
from nomadtf.errors import NomadError, ServerError
from nomadtf.job.answers import Job, JobStub


class ReadsJobs:
    """What the leader reads each step."""

    def _suspended_jobs(self, stubs: list[JobStub]) -> tuple[dict[tuple[str, str], Job], list[boards.Skipped]]:
        """The live suspended-design jobs, read again only when changed; the unreadable ones.

        GET /v1/job/:id per changed job"""
        jobs: dict[tuple[str, str], Job] = {}
        skipped: list[boards.Skipped] = []
        live = set()
        for stub in stubs:
            suspended = (stub.meta or {}).get(suspension.META_ADMISSION) == suspension.SUSPENDED
            if suspended and stub.status == "dead":
                self._book_end(stub)
            if not suspended or stub.stop:
                continue
            key = stub.key
            live.add(key)
            modify_index = stub.job_modify_index
            seen = self.seen.get(key)
            if seen is None or seen.modify_index != modify_index:
                seen = self._read(key, modify_index)
                self.seen[key] = seen
            if seen.problem:
                skipped.append(boards.Skipped(key[0], wire.queue_ticket(key[0], key[1], stub.run_id), seen.problem))
            elif seen.job is not None and not seen.job.stop:
                jobs[key] = seen.job
        for key in set(self.seen) - live:
            del self.seen[key]
        present = {(*st.key, st.run_id) for st in stubs}
        self.ended &= present  # a purged run's end needs no remembering
        for run_key in [k for k in self.arrival if k[:2] not in live]:
            self.arrival.pop(run_key, None)
            self.never_checked.pop(run_key, None)
        for run_key in [k for k in self.not_before if k[:2] not in live]:
            del self.not_before[run_key]
        for key in set(self.forming) - live:
            del self.forming[key]
        for key in set(self.in_flight) - set(jobs):
            self.in_flight.pop(key)  # stopped or purged while it was being placed
        return jobs, skipped

    def _book_end(self, stub: JobStub) -> None:
        """A run that ended: how, in the ledger, once (the runs already ended when this
        replica took the lead are not booked again).  GET .../cluster/state"""
        from nomadtf.servers.consul import ConsulDiscovery

        namespace, job_id = stub.key
        run_key = (namespace, job_id, stub.run_id)
        if run_key in self.ended:
            return
        self.ended.add(run_key)
        if not self.ended_known:
            return
        if not any(stub.ran.values()):
            return  # never ran: refused (booked then) or removed from the queue
        # The run's recorded state first: a follower stops the job of a run that failed.
        try:
            state = ConsulDiscovery(job_id, namespace, client=self.consul, run_id=run_key[2]).job_state() or ""
        except (ServerError, ValueError):
            state = ""
        self.requests += 1
        if state == "succeeded" or state.startswith("failed"):
            how = "succeeded" if state == "succeeded" else "failed"
        elif stub.ran.get("failed") or stub.ran.get("lost"):
            how = "failed"  # its allocations failed (a follower then stops the job): not a stop
        else:
            how = "stopped" if stub.stop else "succeeded"
        self.sharing.record(namespace, how, time.time())

    def _read(self, key: tuple[str, str], modify_index: int) -> Seen:
        try:
            job = self._api(key[0]).job(key[1])
            self.requests += 1
        except NomadError as exc:
            return Seen(modify_index, None, f"could not be read: {exc}")
        if job is None:
            return Seen(modify_index, None)
        try:
            suspension.Suspension.of(job.document)
        except suspension.Malformed as exc:
            return Seen(job.modify_index or modify_index, None, str(exc))
        return Seen(job.modify_index or modify_index, job)

    def _queued_run(self, job: Job) -> QueuedRun | None:
        wanted = suspension.Suspension.of(job.document)
        if wanted is None:
            return None
        namespace, job_id, run_id, modify_index = job.namespace, job.id, job.run_id, job.modify_index
        arrival = self.arrival.setdefault((namespace, job_id, run_id), modify_index)
        priority = self.sharing.policy.of(namespace).priority(order.clamp_priority(job.priority))
        return QueuedRun(
            namespace, job_id, run_id, priority, arrival, job.submit_time / 1e9,
            modify_index, wanted.counts, wanted.gang_timeout_s, fit.RunAsk.of(suspension.wanted_job(job.document, wanted.counts)),
            wanted.ready_timeout_s, wanted.requeue_limit, wanted.minimum,
        )  # fmt: skip
