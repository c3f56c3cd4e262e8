"""The admission controller's loop: read what Nomad holds, decide, resume suspended runs.

Any number of replicas run `nomadtf admission serve`; one leads (lease.py). The leader:

1. reads every job (one blocking query, `GET /v1/jobs?namespace=*&meta=true`), the nodes
   and the allocations; the body of a suspended run only when its JobModifyIndex changed;
2. orders the queued runs fairly between namespaces (order.py, with the operator's policy
   and each namespace's remembered usage: sharing.py) and walks them in order: a run that
   could never fit the cluster or its namespace's quota is refused (its placeholder scaled
   to 0 with the reason: the job ends, `status` and its follower say why); a run its
   namespace's quota cannot take now waits without holding up others; a run that fits in
   what is free — less what runs admitted a moment ago still need, and what waiting runs
   hold reservations on — is admitted; a run that does not fit lets the runs behind it
   start where they fit (backfill), and once it has waited `reserve_after` it holds a
   reservation: nothing new starts in what it needs (with `backfill: false`, the first
   run that does not fit stops the walk: strict order);
3. admits by scaling each group of that exact job version to its wanted count and the
   placeholder to 0, each call after checking it still leads and against the JobModifyIndex
   the last call left (a stale leader's call fails; a standby that finds a run half
   admitted finishes it, or gives it back);
4. watches every admitted run until Nomad placed all of it; a run still placed in part
   after its gang timeout is given back (placeholder up, groups to 0, its Consul keys
   cleared) and queued again at its old place — whoever follows it, or nobody;
5. sizes elastic runs (elastic.py): admitted at the largest counts that fit, grown at a
   checkpoint while no run waits, shrunk to their minimums before any run is preempted
   whole (preemption.py);
6. publishes the board (board.py) when what it says changed.

Nothing a submitter writes is acted on beyond its own job in its own namespace: the
controller reads jobs from Nomad, where the submitter's token could only write its own
namespace, and parses each one alone (a job it cannot read is skipped and listed).

Usage:
    Controller(NomadAPI.from_env(namespace="*"), consul_client(), name, on_event=print).serve(stop)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import consul

from nomadtf import wire
from nomadtf.admission import board as boards
from nomadtf.admission import elastic, fit, order, preemption, suspension
from nomadtf.admission.admitted import KnowsWhoAdmitted
from nomadtf.admission.bookkeeping import (
    CHECKPOINT_CHECK_S,
    MIN_STEP_S,
    PUBLISH_MIN_S,
    REPUBLISH_S,
    STEP_WAIT_S,
    InFlight,
    LostLead,
    Preempting,
    Seen,
    batch_held,
)
from nomadtf.admission.forecast import Forecast
from nomadtf.admission.growing import GrowsElasticRuns
from nomadtf.admission.lease import Lease
from nomadtf.admission.order import QueuedRun
from nomadtf.admission.placing import WatchesPlacement
from nomadtf.admission.preempting import Preempts
from nomadtf.admission.reading import ReadsJobs
from nomadtf.admission.sharing import Sharing
from nomadtf.admission.walking import WalksTheQueue
from nomadtf.errors import ServerError
from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, JobStub
from nomadtf.servers.nomad import NomadAPI


class NoMetrics:
    """What a controller without a metrics port reports to (admission/metrics.py's calls)."""

    def leading(self, leads: bool) -> None: ...
    def admitted(self, namespace: str, waited_s: float) -> None: ...
    def refused(self, namespace: str) -> None: ...
    def gave_back(self, namespace: str) -> None: ...
    def preempted(self, namespace: str) -> None: ...
    def observe(self, queued: Any, committed: Any, policy: Any, shares: Any) -> None: ...


class Controller(ReadsJobs, WalksTheQueue, KnowsWhoAdmitted, WatchesPlacement, GrowsElasticRuns, Preempts):
    """The leader's loop and its step; each part of the step is one base class, a module of
    its own: reading.py, walking.py, admitted.py, placing.py, growing.py, preempting.py."""

    def __init__(
        self,
        api: NomadAPI,
        client: consul.Consul,
        name: str,
        *,
        on_event: Callable[[str], None] = lambda line: None,
        after_fit: Callable[[QueuedRun], None] = lambda run: None,
        metrics: Any = None,
    ):
        self.api = api  # namespace "*": reads every namespace it may
        # Called between the fit and the first admitting call (tests take capacity there,
        # as a job nomadtf did not start may).
        self.after_fit = after_fit
        self.consul = client
        self.name = name
        self.on_event = on_event
        self.lease = Lease(client, name)
        self.sharing = Sharing(client, on_event)
        self.forecast = Forecast(client)
        self.metrics = metrics or NoMetrics()  # admission/metrics.py's Metrics when served
        self.seen: dict[tuple[str, str], Seen] = {}
        self.arrival: dict[tuple[str, str, str], int] = {}  # (ns, job, run) -> the index it queued at
        self.never_checked: dict[tuple[str, str, str], float] = {}
        self.in_flight: dict[tuple[str, str], InFlight] = {}
        self.forming: dict[tuple[str, str], InFlight] = {}  # placed whole, its cluster not formed yet (deadline: ready_timeout)
        self.not_before: dict[tuple[str, str, str], float] = {}  # (ns, job, run) -> unix time: its backoff after not forming
        self.preempting: dict[tuple[str, str], Preempting] = {}  # victim -> its preemption
        self.ended: set[tuple[str, str, str]] = set()  # runs whose end the ledger has (or that had ended when we took the lead)
        self.ended_known = False  # after the first step of a lead: an end seen now is new
        self.given_back: set[tuple[str, str]] = set()  # runs given back this step: not victims again
        self.by_job: dict[tuple[str, str], list[Allocation]] = {}  # this step's holding allocations by job
        self.making_room: dict[tuple[str, str], list[preemption.Candidate]] = {}  # waiting run -> its victims
        self.growing: dict[tuple[str, str], elastic.Growing] = {}  # elastic runs growing at a checkpoint
        self.resized_at: dict[tuple[str, str], float] = {}  # monotonic: when an elastic run was last resized
        self.down_since: dict[str, float] = {}  # node id -> when this replica first saw it away
        self.blocked = False  # the last walk stopped at a run that does not fit: wait on the allocations
        self.more = False  # the last walk stopped at MAX_ADMITS_PER_STEP: step again at once
        self._apis: dict[str, NomadAPI] = {}
        self._publish_due = 0.0  # monotonic: a board held back by PUBLISH_MIN_S is written then
        self.admitted: dict[tuple[str, str], str] = {}  # (ns, job) -> the run it admitted (wire.kv_admitted)
        self.recent: list[boards.Happened] = []
        self._published = ""
        self._published_at = 0.0
        self.requests = 0  # Nomad and Consul requests made while leading (the bench reads it)

    # ---- standing by and leading ------------------------------------------------------------

    def serve(self, stop: Any) -> None:
        """Until `stop` is set: stand by, lead when the lead is free, admit while leading."""
        index = 0
        try:
            while not stop.is_set():
                try:
                    if self.lease.acquire():
                        self.on_event(f"{self.name} leads admission")
                        self.metrics.leading(True)
                        try:
                            self.lead(stop)
                        finally:
                            self.metrics.leading(False)
                        continue
                    index = self.lease.wait_for_change(index)
                except (ServerError, LostLead) as exc:
                    self.on_event(f"{self.name}: {exc}")
                    stop.wait(2.0)
                except Exception as exc:  # noqa: BLE001 - a bug must not end admission for the whole cluster
                    self.on_event(f"{self.name}: unexpected error, leading again in 5s: {exc.__class__.__name__}: {exc}")
                    stop.wait(5.0)
        finally:
            self.lease.close()

    def lead(self, stop: Any) -> None:
        """Steps until the lead is lost or `stop`. It waits on what can change its mind: the
        job list (a run queued, stopped, resumed), or, while the head of the line does not fit,
        the allocations (capacity comes back when one ends; a purge changes no job's summary).

        GET /v1/kv/nomadtf/_admission/admitted/?recurse once; then each step's calls"""
        self.admitted = self._read_admitted()
        self.sharing.load(time.time())
        self.ended_known = False
        # What a former lead of this replica planned is stale: the cluster moved on meanwhile.
        self.in_flight.clear()
        self.forming.clear()
        self.preempting.clear()
        self.making_room.clear()
        self.growing.clear()
        self.not_before.clear()
        jobs_index = allocs_index = 0
        last = 0.0
        while not stop.is_set():
            if not self.lease.still_leads():
                self.on_event(f"{self.name} lost the lead")
                return
            time.sleep(max(0.0, last + MIN_STEP_S - time.monotonic()))
            last = time.monotonic()
            allocs = None
            if self.more:
                stubs, jobs_index = self.api.watch_jobs()
            elif self.blocked and jobs_index:
                allocs, allocs_index = self.api.cluster_allocations(allocs_index, wait_s=self._wait_s(), holding_only=True)
                stubs, jobs_index = self.api.watch_jobs()
                self.requests += 1
            else:
                stubs, jobs_index = self.api.watch_jobs(jobs_index, wait_s=self._wait_s())
            self.requests += 2
            self.step(stubs, allocs)

    def _wait_s(self) -> float:
        """Until the next thing due: a gang deadline, a held-back board, or STEP_WAIT_S."""
        due = [f.deadline for f in [*self.in_flight.values(), *self.forming.values()]] + ([self._publish_due] if self._publish_due else [])
        due += [time.monotonic() + t - time.time() for t in self.not_before.values()]
        if self.preempting or any(not g.placed_by for g in self.growing.values()):
            due.append(time.monotonic() + CHECKPOINT_CHECK_S)  # a checkpoint awaited
        if not due:
            return STEP_WAIT_S
        return max(0.5, min(STEP_WAIT_S, min(due) - time.monotonic()))

    def _api(self, namespace: str) -> NomadAPI:
        """One client (one connection pool) per namespace."""
        if namespace not in self._apis:
            self._apis[namespace] = self.api.in_namespace(namespace)
        return self._apis[namespace]

    # ---- one step ------------------------------------------------------------------------------

    def step(self, stubs: list[JobStub], allocs: list[Allocation] | None = None) -> None:
        """Read, decide, act, publish (see the module's docstring). `allocs`: the holding
        allocations when the caller has them already."""
        jobs, skipped = self._suspended_jobs(stubs)
        nodes = self.api.nodes()
        self.requests += 1
        if allocs is None:
            allocs, _ = self.api.cluster_allocations(holding_only=True)
            self.requests += 1
        now = time.time()
        self.not_before = {k: t for k, t in self.not_before.items() if t > now}  # waited out
        self.given_back = set()
        self.by_job = {}
        for alloc in allocs:
            self.by_job.setdefault(alloc.key, []).append(alloc)
        self.down_since = {n.id: self.down_since.get(n.id, now) for n in nodes if n.status != "ready"}
        self._check_in_flight(jobs, allocs)
        self._check_forming(jobs)
        self._suspend_preempted(jobs)
        rooms = fit.node_rooms(nodes, allocs)
        self._reserve_in_flight(rooms, allocs)
        held = batch_held(allocs)
        committed = self._committed(held)
        asked = self.sharing.requests
        self.sharing.step(held, now)
        self.requests += self.sharing.requests - asked
        total = capacity.total(n.offers for n in nodes if fit.may_return(n, now, self.down_since))
        queued = []
        self._forget_admitted(jobs)
        for key, job in list(jobs.items()):
            current = suspension.state(job.document)
            # A finished run is never touched: suspending it again would run it again.
            if current in (suspension.ADMITTING, suspension.ADMITTED) and not job.dead and not self._admitted_by_us(key, job.run_id):
                self._suspend_again(job)  # resumed by someone else (its submitter's scale-job): back in line
                continue
            if current == suspension.ADMITTING and key not in self.in_flight:
                queued.append(self._queued_run(job))  # a predecessor's half admission: finish it in its turn
            elif current == suspension.QUEUED:
                queued.append(self._queued_run(job))
        policy = self.sharing.policy
        known = set(self.sharing.usage.decayed) | {run.namespace for run in queued if run is not None}
        average = {namespace: self.sharing.usage.average_share(namespace, total) for namespace in known}
        self.ended_known = True
        queued = order.fair_order((q for q in queued if q is not None), policy, average, committed, total)
        self.metrics.observe((run.namespace for run in queued), committed, policy, average)
        waiting_keys = {run.key for run in queued}
        holding = {a.key for a in allocs if a.holds_resources}
        for key, victims in list(self.making_room.items()):
            # Admitted, stopped or purged; or its victims are suspended and gone and it still
            # does not fit (others took the room): it may look for victims again.
            if key not in waiting_keys or not [v for v in victims if self._in_play(v, holding)]:
                del self.making_room[key]
        lines = self._walk(queued, rooms, nodes, allocs, committed, jobs)
        self._grow(jobs, rooms, committed)
        asked = self.forecast.requests
        self.forecast.update(now, jobs, allocs, nodes, queued, set(self.in_flight))
        self.requests += self.forecast.requests - asked
        lines = [line if line.note == "admitted" else replace(line, starts_at=self.forecast.starts.get(line.ticket)) for line in lines]
        free = capacity.total(capacity.Resources(max(r.cpu, 0), max(r.memory, 0), {k: max(v, 0) for k, v in r.devices.items()})
                              for r in rooms if r.usable)  # fmt: skip
        self._publish(lines, skipped, free)

    # ---- what it says -----------------------------------------------------------------------------

    def _note(self, run: QueuedRun, what: str) -> None:
        self._note_key(run.namespace, run.job_id, run.run_id, what)

    def _note_key(self, namespace: str, job_id: str, run_id: str, what: str) -> None:
        """The replica's log names the run; the board only its ticket."""
        self.on_event(f"{namespace}/{job_id} run {run_id}: {what}")
        happened = boards.Happened(namespace, wire.queue_ticket(namespace, job_id, run_id), f"{time.strftime('%H:%M:%S')} {what}")
        self.recent = (self.recent + [happened])[-20:]

    def _publish(self, lines: list[boards.BoardLine], skipped: list[boards.Skipped], free: capacity.Resources) -> None:
        """PUT /v1/kv/nomadtf/_admission/board when what it says changed, or REPUBLISH_S
        after the last write (a waiter takes a board older than ten minutes for a dead leader)."""
        board = boards.Board(self.name, 0.0, tuple(lines), tuple(skipped), len(lines), free, tuple(self.recent),
                             self.sharing.policy.digest())  # fmt: skip
        value, now = board.value(), time.monotonic()
        if value == self._published and now - self._published_at < REPUBLISH_S:
            return
        if now - self._published_at < PUBLISH_MIN_S:
            self._publish_due = self._published_at + PUBLISH_MIN_S  # written whole: at most once a second
            return
        self.lease.publish(wire.KV_ADMISSION_BOARD, replace(board, at=time.time()).value())
        self._published, self._published_at, self._publish_due = value, now, 0.0
        self.requests += 1
