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

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import consul

from nomadtf import capacity, wire
from nomadtf.admission import board as boards
from nomadtf.admission import elastic, fit, order, preemption, suspension
from nomadtf.admission.forecast import Forecast
from nomadtf.admission.lease import Lease
from nomadtf.admission.order import QueuedRun
from nomadtf.admission.sharing import Sharing
from nomadtf.errors import NomadError, ServerError
from nomadtf.nomad import NomadAPI

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


class NoMetrics:
    """What a controller without a metrics port reports to (admission/metrics.py's calls)."""

    def leading(self, leads: bool) -> None: ...
    def admitted(self, namespace: str, waited_s: float) -> None: ...
    def refused(self, namespace: str) -> None: ...
    def gave_back(self, namespace: str) -> None: ...
    def preempted(self, namespace: str) -> None: ...
    def observe(self, queued: Any, committed: Any, policy: Any, shares: Any) -> None: ...


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
class _Seen:
    """A suspended-design job as last read, by its JobModifyIndex."""

    modify_index: int
    job: dict[str, Any] | None
    problem: str = ""


class Controller:
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
        self.seen: dict[tuple[str, str], _Seen] = {}
        self.arrival: dict[tuple[str, str, str], int] = {}  # (ns, job, run) -> the index it queued at
        self.never_checked: dict[tuple[str, str, str], float] = {}
        self.in_flight: dict[tuple[str, str], InFlight] = {}
        self.forming: dict[tuple[str, str], InFlight] = {}  # placed whole, its cluster not formed yet (deadline: ready_timeout)
        self.not_before: dict[tuple[str, str, str], float] = {}  # (ns, job, run) -> unix time: its backoff after not forming
        self.preempting: dict[tuple[str, str], Preempting] = {}  # victim -> its preemption
        self.ended: set[tuple[str, str, str]] = set()  # runs whose end the ledger has (or that had ended when we took the lead)
        self.ended_known = False  # after the first step of a lead: an end seen now is new
        self.given_back: set[tuple[str, str]] = set()  # runs given back this step: not victims again
        self.by_job: dict[tuple[str, str], list[dict[str, Any]]] = {}  # this step's holding allocations by job
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

    def step(self, stubs: list[dict[str, Any]], allocs: list[dict[str, Any]] | None = None) -> None:
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
            self.by_job.setdefault((alloc.get("Namespace", "default"), alloc.get("JobID", "")), []).append(alloc)
        self.down_since = {n["ID"]: self.down_since.get(n["ID"], now) for n in nodes if n.get("Status") != "ready"}
        self._check_in_flight(jobs, allocs)
        self._check_forming(jobs)
        self._suspend_preempted(jobs)
        rooms = fit.node_rooms(nodes, allocs)
        self._reserve_in_flight(rooms, allocs)
        held = _batch_held(allocs)
        committed = self._committed(held)
        asked = self.sharing.requests
        self.sharing.step(held, now)
        self.requests += self.sharing.requests - asked
        total = capacity.total(capacity._node_resources(n) for n in nodes if fit.may_return(n, now, self.down_since))
        queued = []
        self._forget_admitted(jobs)
        for key, job in list(jobs.items()):
            current = suspension.state(job)
            run_id = (job.get("Meta") or {}).get(wire.META_RUN, "")
            # A finished run is never touched: suspending it again would run it again.
            if current in (suspension.ADMITTING, suspension.ADMITTED) and job.get("Status") != "dead" and not self._admitted_by_us(key, run_id):
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
        holding = {(a.get("Namespace", "default"), a.get("JobID", "")) for a in allocs if capacity.holds_resources(a)}
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

    def _suspended_jobs(self, stubs: list[dict[str, Any]]) -> tuple[dict[tuple[str, str], dict[str, Any]], list[boards.Skipped]]:
        """The live suspended-design jobs, read again only when changed; the unreadable ones.

        GET /v1/job/:id per changed job"""
        jobs: dict[tuple[str, str], dict[str, Any]] = {}
        skipped: list[boards.Skipped] = []
        live = set()
        for stub in stubs:
            meta = stub.get("Meta") or {}
            if meta.get(suspension.META_ADMISSION) == suspension.SUSPENDED and stub.get("Status") == "dead":
                self._book_end(stub)
            if meta.get(suspension.META_ADMISSION) != suspension.SUSPENDED or stub.get("Stop"):
                continue
            key = (str(stub.get("Namespace") or "default"), str(stub.get("ID")))
            live.add(key)
            modify_index = int(stub.get("JobModifyIndex") or 0)
            seen = self.seen.get(key)
            if seen is None or seen.modify_index != modify_index:
                seen = self._read(key, modify_index)
                self.seen[key] = seen
            if seen.problem:
                run_id = str((stub.get("Meta") or {}).get(wire.META_RUN, ""))
                skipped.append(boards.Skipped(key[0], wire.queue_ticket(key[0], key[1], run_id), seen.problem))
            elif seen.job is not None and not seen.job.get("Stop"):
                jobs[key] = seen.job
        for key in set(self.seen) - live:
            del self.seen[key]
        present = {(str(st.get("Namespace") or "default"), str(st.get("ID")), str((st.get("Meta") or {}).get(wire.META_RUN, ""))) for st in stubs}
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

    def _book_end(self, stub: dict[str, Any]) -> None:
        """A run that ended: how, in the ledger, once (the runs already ended when this
        replica took the lead are not booked again).  GET .../cluster/state"""
        from nomadtf.discovery import ConsulDiscovery

        namespace, job_id = str(stub.get("Namespace") or "default"), str(stub.get("ID"))
        run_key = (namespace, job_id, str((stub.get("Meta") or {}).get(wire.META_RUN, "")))
        if run_key in self.ended:
            return
        self.ended.add(run_key)
        if not self.ended_known:
            return
        summary = (stub.get("JobSummary") or {}).get("Summary") or {}
        ran = {k: sum(int((g or {}).get(k) or 0) for g in summary.values()) for k in ("Complete", "Failed", "Lost")}
        if not any(ran.values()):
            return  # never ran: refused (booked then) or removed from the queue
        # The run's recorded state first: a follower stops the job of a run that failed.
        try:
            state = ConsulDiscovery(job_id, namespace, client=self.consul, run_id=run_key[2]).job_state() or ""
        except (ServerError, ValueError):
            state = ""
        self.requests += 1
        if state == "succeeded" or state.startswith("failed"):
            how = "succeeded" if state == "succeeded" else "failed"
        elif ran["Failed"] or ran["Lost"]:
            how = "failed"  # its allocations failed (a follower then stops the job): not a stop
        else:
            how = "stopped" if stub.get("Stop") else "succeeded"
        self.sharing.record(namespace, how, time.time())

    def _read(self, key: tuple[str, str], modify_index: int) -> _Seen:
        try:
            job = self._api(key[0]).job(key[1])
            self.requests += 1
        except NomadError as exc:
            return _Seen(modify_index, None, f"could not be read: {exc}")
        if job is None:
            return _Seen(modify_index, None)
        try:
            suspension.Suspension.of(job)
        except suspension.Malformed as exc:
            return _Seen(int(job.get("JobModifyIndex") or modify_index), None, str(exc))
        return _Seen(int(job.get("JobModifyIndex") or modify_index), job)

    def _queued_run(self, job: dict[str, Any]) -> QueuedRun | None:
        wanted = suspension.Suspension.of(job)
        if wanted is None:
            return None
        namespace, job_id = job.get("Namespace") or "default", job["ID"]
        run_id = (job.get("Meta") or {}).get(wire.META_RUN, "")
        modify_index = int(job.get("JobModifyIndex") or 0)
        arrival = self.arrival.setdefault((namespace, job_id, run_id), modify_index)
        priority = self.sharing.policy.of(namespace).priority(order.clamp_priority(job.get("Priority")))
        return QueuedRun(
            namespace, job_id, run_id, priority, arrival, (job.get("SubmitTime") or 0) / 1e9,
            modify_index, wanted.counts, wanted.gang_timeout_s, fit.RunAsk.of(suspension.wanted_job(job, wanted.counts)),
            wanted.ready_timeout_s, wanted.requeue_limit, wanted.minimum,
        )  # fmt: skip

    # ---- the walk in order -----------------------------------------------------------------------

    def _walk(self, queued: list[QueuedRun], rooms: list[fit.Room], nodes: list[dict[str, Any]], allocs: list[dict[str, Any]],
              committed: dict[str, capacity.Resources], jobs: dict[tuple[str, str], dict[str, Any]]) -> list[boards.BoardLine]:  # fmt: skip
        """Admit what fits, in order (the module's docstring, step 2); the board's lines.
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
                run = _sized(run, rooms, committed.get(run.namespace, capacity.Resources()), share)
            needs = run.ask.needs
            line = functools.partial(_board_line, run, place)
            if admitted >= MAX_ADMITS_PER_STEP:
                lines.append(line("being admitted"))
                continue
            if now < self.not_before.get(run_key, 0.0):
                waiting = True
                lines.append(line(f"waits {self.not_before[run_key] - now:.0f}s before its next try: its cluster did not form last time"))
                continue
            # A run a predecessor half admitted already holds its scaled groups: only the rest must fit.
            missing = _missing(run.ask, self.by_job.get(run.key, []), run.key, run.arrival)
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
            short = capacity.shortfall(needs, _free_of(rooms, run.ask))
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
            missing = _missing(flight.run.ask, self.by_job.get(key, []), key, flight.run.arrival)
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
        return int(reply.get("JobModifyIndex") or 0)

    def _admit(self, run: QueuedRun) -> None:
        """Record the intent, scale the groups up, then the placeholder down (the job is never
        `dead` between).  PUT /v1/kv/nomadtf/_admission/admitted/<ns>/<job> ; the scale calls"""
        job = self.seen[run.key].job or {}
        if self.admitted.get(run.key) != run.run_id:
            if not self.lease.still_leads():
                raise LostLead(f"{self.name} lost the lead before admitting {run.namespace}/{run.job_id}")
            self.lease.publish(wire.kv_admitted(*run.key), run.run_id)
            self.admitted[run.key] = run.run_id
            self.requests += 2
        # The run's deadline counts from now, not from its submission (runtime/deadline.py).
        self.lease.publish(wire.kv_admitted_at(run.namespace, run.job_id, run.run_id), f"{time.time():.3f}")
        self.requests += 1
        current = suspension.group_counts(job)
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

    # ---- who admitted what ----------------------------------------------------------------------

    def _read_admitted(self) -> dict[tuple[str, str], str]:
        """GET /v1/kv/nomadtf/_admission/admitted/?recurse"""
        from nomadtf.discovery import consul_call

        _, items = consul_call("reading the admitted runs", self.consul.kv.get, wire.KV_ADMISSION_ADMITTED, recurse=True)
        self.requests += 1
        out = {}
        for item in items or []:
            namespace, _, job_id = item["Key"].removeprefix(wire.KV_ADMISSION_ADMITTED).partition("/")
            out[(namespace, job_id)] = (item.get("Value") or b"").decode(errors="replace")
        return out

    def _admitted_by_us(self, key: tuple[str, str], run_id: str) -> bool:
        """Whether a controller recorded this run as the one it admits (memory first; the key
        again before calling anything out of turn: a predecessor may have written it late).

        GET /v1/kv/nomadtf/_admission/admitted/<ns>/<job>"""
        from nomadtf.discovery import consul_call

        if self.admitted.get(key) == run_id:
            return True
        _, item = consul_call("reading an admitted run", self.consul.kv.get, wire.kv_admitted(*key), consistency="consistent")
        self.requests += 1
        if item and (item.get("Value") or b"").decode(errors="replace") == run_id:
            self.admitted[key] = run_id
            return True
        # The record can be lost with Consul's data (a -dev agent restarted, a restore): the
        # placeholder's scaling events in Nomad still say who lowered it. A submitter could
        # write such an event for its own run; that only lets its own run keep its place.
        try:
            events = self._api(key[0]).scaling_events(key[1]).get(suspension.PLACEHOLDER_GROUP) or []
        except NomadError:
            return True  # cannot tell: never stop a run on a guess
        self.requests += 1
        for event in events:
            meta = event.get("Meta") or {}
            if meta.get(suspension.META_ADMISSION) == "admitted" and meta.get(wire.META_RUN) == run_id:
                self.admitted[key] = run_id
                self._record_admitted(key, run_id)
                return True
        return False

    def _record_admitted(self, key: tuple[str, str], run_id: str) -> None:
        """PUT /v1/kv/nomadtf/_admission/admitted/<ns>/<job> (lost with Consul's data: written again)"""
        try:
            self.lease.publish(wire.kv_admitted(*key), run_id)
        except ServerError as exc:
            self.on_event(f"could not record {key[0]}/{key[1]} run {run_id} as admitted: {exc}")

    def _forget_admitted(self, jobs: dict[tuple[str, str], dict[str, Any]]) -> None:
        """A job gone from Nomad (purged) needs no record.  DELETE .../admitted/<ns>/<job>"""
        from nomadtf.discovery import consul_call

        for key in [k for k in self.admitted if k not in self.seen]:
            consul_call("forgetting an admitted run", self.consul.kv.delete, wire.kv_admitted(*key))
            self.requests += 1
            del self.admitted[key]

    def _suspend_again(self, job: dict[str, Any]) -> None:
        """A run someone other than the controller resumed (Nomad CE lets a token with
        scale-job scale its own jobs): placeholder up, groups to 0; it waits its turn."""
        run = self._queued_run(job)
        if run is None:
            return
        message = f"nomadtf admission: run {run.run_id} was resumed out of turn; suspended again (only the admission controller resumes a queued run)"
        try:
            # Every group, whatever the job read said: its submitter may be scaling it still.
            index = self._scale(run, suspension.PLACEHOLDER_GROUP, 1, run.job_modify_index, message, "suspended")
            for group in sorted(run.counts):
                index = self._scale(run, group, 0, index, message, "suspended")
        except NomadError as exc:
            self.on_event(f"could not suspend {run.namespace}/{run.job_id} again: {exc}")
            return
        self._note(run, "resumed out of turn: suspended again")

    # ---- admitted runs: placed whole, or given back ----------------------------------------------

    def _check_in_flight(self, jobs: dict[tuple[str, str], dict[str, Any]], allocs: list[dict[str, Any]]) -> None:
        """Each admitted run not yet placed whole: placed now (done), or past its gang
        timeout (given back). Its own allocations, terminal ones too: a short task may have
        ended before it is looked at.  GET /v1/job/:id/allocations per run in flight"""
        for key, flight in list(self.in_flight.items()):
            job = jobs.get(key)
            if job is None or (job.get("Meta") or {}).get(wire.META_RUN) != flight.run.run_id:
                self.in_flight.pop(key, None)
                continue
            own = self._api(key[0]).allocations(key[1])
            self.requests += 1
            placed = _holding_by_group(own, key, flight.run.arrival)
            if all(placed.get(group, 0) >= count for group, count in flight.run.counts.items()):
                self.in_flight.pop(key, None)
                if flight.run.ready_timeout_s > 0:
                    self.forming[key] = InFlight(flight.run, time.monotonic() + flight.run.ready_timeout_s)
            elif time.monotonic() > flight.deadline:
                self.in_flight.pop(key, None)
                self._give_back(flight.run, job, placed)

    # ---- placed, not ready: queued again with a backoff, then refused -----------------------------

    def _check_forming(self, jobs: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Each run placed whole whose cluster had not formed: formed now (done), or past its
        ready timeout: given back and queued again after a backoff, or, past its requeue
        limit, refused.  GET .../cluster/generation per run ; GET /v1/job/:id/scale at a timeout"""
        from nomadtf.discovery import ConsulDiscovery

        for key, forming in list(self.forming.items()):
            run, job = forming.run, jobs.get(key)
            if job is None or (job.get("Meta") or {}).get(wire.META_RUN) != run.run_id or job.get("Status") == "dead" \
                    or suspension.state(job) != suspension.ADMITTED:
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
        return sum(1 for e in events if (e.get("Meta") or {}).get(suspension.META_ADMISSION) == "not-ready"
                   and (e.get("Meta") or {}).get(wire.META_RUN) == run.run_id and e.get("Count") == 1)  # fmt: skip

    # ---- elastic runs: grown at a checkpoint while nobody waits ------------------------------------

    def _grow(self, jobs: dict[tuple[str, str], dict[str, Any]], rooms: list[fit.Room], committed: dict[str, capacity.Resources]) -> None:
        """Carry each growth on (checkpointed or its grace passed: resized; resized: placed, or
        back to its size before), then, while no run waits, start at most one: the elastic run
        below its most with room for more asks to checkpoint. A run that starts waiting calls
        every growth not yet resized off: growth never takes what a queued run could use."""
        for key, growing in list(self.growing.items()):
            job = jobs.get(key)
            try:
                run = self._queued_run(job) if job is not None and (job.get("Meta") or {}).get(wire.META_RUN) == growing.run_id else None
            except suspension.Malformed:
                run = None  # its Meta changed under us: the growth is off
            if run is None or job is None or job.get("Status") == "dead" or suspension.state(job) != suspension.ADMITTED or key in self.preempting:
                del self.growing[key]
                continue
            if growing.placed_by:
                placed = _holding_by_group(self.by_job.get(key, []), key, run.arrival)
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

    def _start_growth(self, jobs: dict[tuple[str, str], dict[str, Any]], rooms: list[fit.Room], committed: dict[str, capacity.Resources]) -> None:
        """The first elastic run, placed whole and formed, below its most, with room for more:
        asked to checkpoint; it grows at the checkpoint (or once its grace has passed)."""
        settled = time.monotonic() - RESIZE_SETTLE_S
        self.resized_at = {key: at for key, at in self.resized_at.items() if at > settled}
        busy = set(self.growing) | set(self.preempting) | set(self.in_flight) | set(self.forming) | self.given_back | set(self.resized_at)
        for key, job in sorted(jobs.items()):
            if key in busy or job.get("Status") == "dead" or suspension.state(job) != suspension.ADMITTED:
                continue
            try:
                run = self._queued_run(job)
            except suspension.Malformed:
                continue
            if run is None or not run.minimum or run.ask is None:
                continue
            counts = suspension.group_counts(job)
            now = {group: counts.get(group, 0) for group in run.minimum}
            placed = _holding_by_group(self.by_job.get(key, []), key, run.arrival)
            if all(now[g] >= run.counts[g] for g in now) or any(placed.get(g, 0) < n for g, n in counts.items() if g in run.counts):
                continue  # at its most, or not placed whole (placing, or some tasks ended): nothing to grow
            grown = _growth(run, now, rooms, committed.get(run.namespace, capacity.Resources()), self.sharing.policy.of(run.namespace))
            if grown is None:
                continue
            self._signal_checkpoint(run.namespace, run.job_id)
            grace = _grace_s(job)
            saved = self._progress_of(run.namespace, run.job_id, run.run_id)["checkpoint_step"]
            self.growing[key] = elastic.Growing(run.run_id, now, grown, saved, time.monotonic() + grace)
            self._note(run, f"room for {elastic.sizes(grown, run.minimum)}: asked to checkpoint; it grows then (in at most {grace:.0f}s)")
            return

    def _resize(self, run: QueuedRun, job: dict[str, Any], counts: dict[str, int], message: str, verdict: str) -> bool:
        """An admitted elastic run to `counts`: its tasks learn them from Consul first (a
        shrinking cluster is whole at once, a growing one waits for its new members), then
        Nomad changes the groups. False when a call failed (tried again next step).

        PUT .../cluster/counts ; POST /v1/job/:id/scale per changed group"""
        current = suspension.group_counts(job)
        try:
            self._set_counts(run.namespace, run.job_id, run.run_id, counts)
            index = int(job.get("JobModifyIndex") or 0)
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
        from nomadtf.discovery import ConsulDiscovery

        if not self.lease.still_leads():
            raise LostLead(f"{self.name} lost the lead while resizing {namespace}/{job_id}")
        ConsulDiscovery(job_id, namespace, client=self.consul, run_id=run_id).set_counts(counts)
        self.requests += 5

    # ---- preemption ------------------------------------------------------------------------------

    def _running_runs(self, jobs: dict[tuple[str, str], dict[str, Any]], by_job: dict[tuple[str, str], list[dict[str, Any]]],
                      committed: dict[str, capacity.Resources]) -> list[preemption.Candidate]:  # fmt: skip
        """The admitted runs placed whole and running that a waiting run might preempt (their
        progress not read yet); none given back or asked to checkpoint this step."""
        policy = self.sharing.policy
        out = []
        for key, job in jobs.items():
            own = [a for a in by_job.get(key, []) if capacity.holds_resources(a)]
            if not own or key in self.in_flight or key in self.preempting or key in self.given_back or job.get("Status") == "dead":
                continue
            if suspension.state(job) != suspension.ADMITTED:
                continue
            owner = policy.of(key[0])
            borrowing = owner.nominal is not None and bool(owner.over(committed.get(key[0], capacity.Resources()), capacity.Resources(), nominal_only=True))
            started = min(int(a.get("CreateTime") or 0) for a in own) / 1e9
            out.append(preemption.Candidate(key[0], key[1], (job.get("Meta") or {}).get(wire.META_RUN, ""),
                                            owner.priority(order.clamp_priority(job.get("Priority"))),
                                            tuple((a.get("NodeID", ""), capacity.alloc_resources(a)) for a in own), started, borrowing))  # fmt: skip
        return out

    def _preempt_for(self, run: QueuedRun, missing: fit.RunAsk, rooms: list[fit.Room], running: list[preemption.Candidate],
                     jobs: dict[tuple[str, str], dict[str, Any]], committed: dict[str, capacity.Resources]) -> bool:  # fmt: skip
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

    def _as_shrink(self, candidate: preemption.Candidate, job: dict[str, Any]) -> preemption.Candidate | None:
        """`candidate` as an elastic run shrunk to its minimums (None: not elastic, or at them)."""
        try:
            wanted = suspension.Suspension.of(job)
        except suspension.Malformed:
            return None
        if wanted is None or not wanted.minimum:
            return None
        counts = {group: count for group, count in suspension.group_counts(job).items() if group in wanted.counts}
        return preemption.as_shrink(candidate, self.by_job.get(candidate.key, []), counts, wanted.minimum)

    def _progress_of(self, namespace: str, job_id: str, run_id: str) -> dict[str, int | None]:
        """{"step", "checkpoint_step"} from the run's progress record (None: none reported, or
        not a sane number: the record is the team's own to write).

        GET /v1/kv/nomadtf/<ns>/<job>/<run>/progress"""
        from nomadtf.discovery import ConsulDiscovery

        try:
            record = ConsulDiscovery(job_id, namespace, client=self.consul, run_id=run_id).progress()
        except (ServerError, ValueError):
            record = None
        self.requests += 1
        step, checkpoint_step, _ = preemption.progress_numbers(record)
        return {"step": step, "checkpoint_step": checkpoint_step}

    def _ask_to_checkpoint(self, victim: preemption.Candidate, job: dict[str, Any], by: str, for_key: tuple[str, str]) -> None:
        """SIGUSR1 to each of the victim's allocations (the supervisor passes it on to code that
        catches it); it is suspended (or, elastic, shrunk) once it reports a new checkpoint, or
        its kill timeout (at most MAX_PREEMPT_GRACE_S: the victim's own job sets it) has passed."""
        self._signal_checkpoint(victim.namespace, victim.job_id)
        grace = _grace_s(job)
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
            if capacity.holds_resources(alloc) and alloc.get("ClientStatus") == "running":
                try:
                    api.signal_allocation(alloc["ID"], "SIGUSR1")
                except ServerError as exc:
                    self.on_event(f"could not ask {namespace}/{job_id} allocation {alloc['ID'][:8]} to checkpoint: {exc}")
                self.requests += 1
        self.requests += 1

    def _suspend_preempted(self, jobs: dict[tuple[str, str], dict[str, Any]]) -> None:
        """Each victim that checkpointed or whose grace has passed: suspended whole and queued
        again. A preemption whose waiting run no longer waits (admitted elsewhere, stopped,
        purged) is called off: nothing is suspended for nobody."""
        for key, preempting in list(self.preempting.items()):
            job = jobs.get(key)
            if job is None or (job.get("Meta") or {}).get(wire.META_RUN) != preempting.victim.run_id or job.get("Status") == "dead":
                del self.preempting[key]  # it ended (or was stopped) meanwhile: nothing to suspend
                continue
            waiting = jobs.get(preempting.for_key)
            if waiting is None or suspension.state(waiting) != suspension.QUEUED:
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

    def _give_back(self, run: QueuedRun, job: dict[str, Any], placed: dict[str, int], message: str = "", verdict: str = "requeued",
                   note: str = "") -> int | None:  # fmt: skip
        """Placeholder up first (the job stays pending), then every group to 0, the unplaced
        ones first (a placed group stopped first would free room for a blocked one, which
        Nomad would then place only for us to stop it); the run's Consul keys go (its next
        admission starts afresh); it keeps its place in line. `message`/`verdict`: what the
        placeholder's scaling event says (a preemption's, else the gang timeout's). The
        JobModifyIndex the last call left; None when a call failed."""
        from nomadtf.discovery import ConsulDiscovery

        message = message or f"nomadtf admission: run {run.run_id} not placed whole within its gang timeout; queued again"
        index = None
        try:
            index = self._scale(run, suspension.PLACEHOLDER_GROUP, 1, int(job.get("JobModifyIndex") or 0), message, verdict)
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

    def _reserve_in_flight(self, rooms: list[fit.Room], allocs: list[dict[str, Any]]) -> None:
        """Take from `rooms` what admitted runs still wait for Nomad to place."""
        for key, flight in self.in_flight.items():
            assert flight.run.ask is not None
            missing = _missing(flight.run.ask, self.by_job.get(key, []), key, flight.run.arrival)
            if missing.slots:
                fit.place(missing, rooms)

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


def _holding_by_group(allocs: list[dict[str, Any]], key: tuple[str, str], since_index: int) -> dict[str, int]:
    """The allocations of this run of the job (created after its registration at
    `since_index`: an earlier run of the same name is not this one) that Nomad placed."""
    out: dict[str, int] = {}
    for alloc in allocs:
        if (alloc.get("Namespace", "default"), alloc.get("JobID")) == key and alloc.get("DesiredStatus", "run") == "run" \
                and int(alloc.get("CreateIndex") or 0) > since_index \
                and alloc.get("ClientStatus") in ("pending", "running", "complete"):
            out[alloc.get("TaskGroup", "")] = out.get(alloc.get("TaskGroup", ""), 0) + 1
    return out


def _missing(ask: fit.RunAsk, allocs: list[dict[str, Any]], key: tuple[str, str], since_index: int) -> fit.RunAsk:
    """`ask` less the allocations of this run that already hold their place."""
    have = _holding_by_group(allocs, key, since_index)
    counted: dict[str, int] = {}
    missing = []
    for slot in ask.slots:
        counted[slot.group] = counted.get(slot.group, 0) + 1
        if counted[slot.group] > have.get(slot.group, 0):
            missing.append(slot)
    return replace(ask, slots=tuple(missing))


def _free_of(rooms: list[fit.Room], ask: fit.RunAsk) -> capacity.Resources:
    """What the usable nodes `ask` may use have free, summed."""
    mine = [r for r in rooms if r.usable and fit._takes(r, ask)]
    devices: dict[str, int] = {}
    for room in mine:
        for name, count in room.devices.items():
            devices[name] = devices.get(name, 0) + max(count, 0)
    return capacity.Resources(sum(max(r.cpu, 0) for r in mine), sum(max(r.memory, 0) for r in mine), devices)


def _grace_s(job: dict[str, Any]) -> float:
    """How long a run asked to checkpoint has before it is suspended, shrunk or grown anyway."""
    return min(MAX_PREEMPT_GRACE_S, max(MIN_PREEMPT_GRACE_S, _kill_timeout_s(job)))


def _kill_timeout_s(job: dict[str, Any]) -> float:
    """The longest KillTimeout of the job's tasks, in seconds (Nomad's default: 5 s)."""
    timeouts = [int(task.get("KillTimeout") or 5_000_000_000) for group in job.get("TaskGroups") or [] for task in group.get("Tasks") or []]
    return max(timeouts, default=5_000_000_000) / 1e9


def _board_line(run: QueuedRun, place: int, note: str, short: capacity.Resources | None = None) -> boards.BoardLine:
    assert run.ask is not None
    ticket = wire.queue_ticket(run.namespace, run.job_id, run.run_id)
    return boards.BoardLine(ticket, run.namespace, run.priority, place, run.since, run.ask.needs, short, note)


def _batch_held(allocs: list[dict[str, Any]]) -> dict[str, capacity.Resources]:
    """namespace -> what its batch allocations hold now (the work quotas and usage count;
    service and system jobs are long-lived and outside the queue)."""
    out: dict[str, capacity.Resources] = {}
    for alloc in allocs:
        if capacity.holds_resources(alloc) and alloc.get("JobType", "batch") not in fit.LONG_LIVED_TYPES:
            namespace = alloc.get("Namespace", "default")
            out[namespace] = out.get(namespace, capacity.Resources()) + capacity.alloc_resources(alloc)
    return out


def _sized(run: QueuedRun, rooms: list[fit.Room], held: capacity.Resources, share: Any) -> QueuedRun:
    """An elastic run at the largest counts its quota and `rooms` take now (elastic.largest),
    else at its minimums: it waits for, reserves and preempts for those."""
    assert run.ask is not None
    ask = run.ask

    def fits(counts: dict[str, int]) -> bool:
        smaller = ask.with_counts(counts)
        return not share.over(held, smaller.needs) and fit.fits(smaller, rooms)

    counts = elastic.largest(run.counts, run.minimum, fits) or {**run.counts, **run.minimum}
    return replace(run, counts=counts, ask=ask.with_counts(counts))


def _growth(run: QueuedRun, now: dict[str, int], rooms: list[fit.Room], held: capacity.Resources, share: Any) -> dict[str, int] | None:
    """The largest counts above `now` (at most the run's most) whose added allocations its
    quota and `rooms` take now; None when not even one more does."""
    assert run.ask is not None
    ask = run.ask

    def fits(grown: dict[str, int]) -> bool:
        extra = ask.with_counts(elastic.extra(now, grown))
        return not share.over(held, extra.needs) and fit.fits(extra, rooms)

    return elastic.largest({group: run.counts[group] for group in now}, now, fits, above_bottom=True)
