"""Elastic runs grown at a checkpoint while nobody waits, and resized (their tasks
told the counts through Consul first, then Nomad's groups scaled).

One part of the admission controller (controller.py): its methods run on the leader's
`Controller`, whose state (the runs in flight, forming, preempting, growing) they share."""

from __future__ import annotations

import time

from nomadtf.admission import elastic, fit, suspension
from nomadtf.admission.bookkeeping import (
    RESIZE_SETTLE_S,
    LostLead,
    grace_s,
    growth,
    holding_by_group,
)
from nomadtf.admission.order import QueuedRun
from nomadtf.errors import ServerError
from nomadtf.job import capacity
from nomadtf.job.answers import Job


class GrowsElasticRuns:
    """Elastic runs grown and resized."""

    def _grow(self, jobs: dict[tuple[str, str], Job], rooms: list[fit.Room], committed: dict[str, capacity.Resources]) -> None:
        """Carry each growth on (checkpointed or its grace passed: resized; resized: placed, or
        back to its size before), then, while no run waits, start at most one: the elastic run
        below its most with room for more asks to checkpoint. A run that starts waiting calls
        every growth not yet resized off: growth never takes what a queued run could use."""
        for key, growing in list(self.growing.items()):
            job = jobs.get(key)
            try:
                run = self._queued_run(job) if job is not None and job.run_id == growing.run_id else None
            except suspension.Malformed:
                run = None  # its Meta changed under us: the growth is off
            if run is None or job is None or job.dead or suspension.state(job.document) != suspension.ADMITTED or key in self.preempting:
                del self.growing[key]
                continue
            if growing.placed_by:
                placed = holding_by_group(self.by_job.get(key, []), key, run.arrival)
                if all(placed.get(group, 0) >= count for group, count in growing.to.items()):
                    del self.growing[key]
                elif time.monotonic() > growing.placed_by:
                    said = f"its growth was not placed within {run.gang_timeout_s:g}s: back to {elastic.sizes(growing.before, run.minimum)}"
                    if self._resize(run, job, growing.before, f"nomadtf admission: run {run.run_id}: {said}", "shrunk"):
                        del self.growing[key]
                        self._note(run, said)
                continue
            if self.blocked or self.more:
                del self.growing[key]
                self._note(run, "growth called off: a run waits in the queue")
                continue
            if time.monotonic() < growing.grow_at and not self._checkpointed_since(growing, *key, run.run_id, growing.checkpoint_step):
                continue
            assert run.ask is not None
            extra = run.ask.with_counts(elastic.extra(growing.before, growing.to))
            over = self.sharing.policy.of(run.namespace).over(committed.get(run.namespace, capacity.Resources()), extra.needs)
            if over or not fit.place(extra, rooms):
                del self.growing[key]
                self._note(run, f"growth called off: {'; '.join(over) or 'its room was taken meanwhile'}")
                continue
            said = f"grown to {elastic.sizes(growing.to, run.minimum)}"
            if self._resize(run, job, growing.to, f"nomadtf admission: run {run.run_id} {said}", "grown"):
                growing.placed_by = time.monotonic() + run.gang_timeout_s
                committed[run.namespace] = committed.get(run.namespace, capacity.Resources()) + extra.needs
                self._note(run, said)
        if not (self.blocked or self.more):
            self._start_growth(jobs, rooms, committed)

    def _start_growth(self, jobs: dict[tuple[str, str], Job], rooms: list[fit.Room], committed: dict[str, capacity.Resources]) -> None:
        """The first elastic run, placed whole and formed, below its most, with room for more:
        asked to checkpoint; it grows at the checkpoint (or once its grace has passed)."""
        settled = time.monotonic() - RESIZE_SETTLE_S
        self.resized_at = {key: at for key, at in self.resized_at.items() if at > settled}
        busy = set(self.growing) | set(self.preempting) | set(self.in_flight) | set(self.forming) | self.given_back | set(self.resized_at)
        for key, job in sorted(jobs.items()):
            if key in busy or job.dead or suspension.state(job.document) != suspension.ADMITTED:
                continue
            try:
                run = self._queued_run(job)
            except suspension.Malformed:
                continue
            if run is None or not run.minimum or run.ask is None:
                continue
            counts = suspension.group_counts(job.document)
            now = {group: counts.get(group, 0) for group in run.minimum}
            placed = holding_by_group(self.by_job.get(key, []), key, run.arrival)
            if all(now[g] >= run.counts[g] for g in now) or any(placed.get(g, 0) < n for g, n in counts.items() if g in run.counts):
                continue  # at its most, or not placed whole (placing, or some tasks ended): nothing to grow
            grown = growth(run, now, rooms, committed.get(run.namespace, capacity.Resources()), self.sharing.policy.of(run.namespace))
            if grown is None:
                continue
            self._signal_checkpoint(run.namespace, run.job_id)
            grace = grace_s(job.document)
            saved = self._progress_of(run.namespace, run.job_id, run.run_id)["checkpoint_step"]
            self.growing[key] = elastic.Growing(run.run_id, now, grown, saved, time.monotonic() + grace)
            self._note(run, f"room for {elastic.sizes(grown, run.minimum)}: asked to checkpoint; it grows then (in at most {grace:.0f}s)")
            return

    def _resize(self, run: QueuedRun, job: Job, counts: dict[str, int], message: str, verdict: str) -> bool:
        """An admitted elastic run to `counts`: its tasks learn them from Consul first (a
        shrinking cluster is whole at once, a growing one waits for its new members), then
        Nomad changes the groups. False when a call failed (tried again next step).

        PUT .../cluster/counts ; POST /v1/job/:id/scale per changed group"""
        current = suspension.group_counts(job.document)
        try:
            self._set_counts(run.namespace, run.job_id, run.run_id, counts)
            index = job.modify_index
            for group, count in sorted(counts.items()):
                if current.get(group) != count:
                    index = self._scale(run, group, count, index, message, verdict)
        except ServerError as exc:
            self.on_event(f"could not resize {run.namespace}/{run.job_id}: {exc}")
            return False
        self.resized_at[run.key] = time.monotonic()
        return True

    def _set_counts(self, namespace: str, job_id: str, run_id: str, counts: dict[str, int]) -> None:
        """PUT .../cluster/counts ; the generation touched (discovery.set_counts)"""
        from nomadtf.servers.consul import ConsulDiscovery

        if not self.lease.still_leads():
            raise LostLead(f"{self.name} lost the lead while resizing {namespace}/{job_id}")
        ConsulDiscovery(job_id, namespace, client=self.consul, run_id=run_id).set_counts(counts)
        self.requests += 5
