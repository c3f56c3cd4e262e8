"""Admission: a run that does not fit now waits its turn in a queue, and a job starts all
at once or not at all (gang admission). docs/guide/queueing.md tells the whole design.

1. **Never or not now.** Nomad's plan (POST /v1/job/:id/plan) says whether the whole job
   fits now. When it does not, `plan.classify` tells "never" (no node could ever hold a
   task of a role, or the job exceeds the cluster: a fast failure, as before) from "not
   now" (capacity in use): the run joins the cluster's queue (queue.py: priority, then
   arrival) and says what it needs, what is free, who holds it (only jobs the token may
   read), its place and since when.
2. **All or nothing.** Only the run at the head is admitted, under one cluster-wide lock
   held through a Consul session (a crashed submitter's lock and entry go with its
   session): plan again, register only when every allocation fits, and keep the lock until
   Nomad has placed them, so the next plan sees them. When some stay unplaced anyway (a
   job nomadtf did not start took the room between plan and placement), the placed part
   is stopped after job.json `admission.gang_timeout` and the run goes back to its place
   in the queue.

Waiting is blocking queries: a run behind the head waits on the queue's keys (one change
wakes it), the head on Nomad's allocations (it plans again only when one lets go of
resources). A run nobody follows (`detach`, or Ctrl-C with LEAVE) stays queued with its
rendered job for the admission service (admission_service.py), which admits it through
`admit_unattended`: the same lock, plan and gang rules.

Usage:
    admission = Admission(api, on_status=show, on_event=log, timeout_s=600, on_interrupt=REMOVE)
    admitted = admission.admit(job, register, modify_index=0, gang_timeout_s=30)
    admitted.registration["EvalID"], admitted.waited_s
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from nomadtf import capacity, plan, queue, wire
from nomadtf.capacity import Resources
from nomadtf.discovery import AdmissionQueue, ConsulDiscovery
from nomadtf.errors import JobFailed, JobStopped, NomadError, QueueInterrupted, QueueTimeout
from nomadtf.nomad import NomadAPI
from nomadtf.queue import Entry, QueuedRun

REMOVE, LEAVE = "remove", "leave"  # what Ctrl-C does to a queued run
QUEUE_WAIT_S = 300.0  # a waiter behind the head re-asks at least this often (Consul's own default wait)
CAPACITY_WAIT_S = 30.0  # the head re-plans at least this often, also when no allocation changed
MIN_REPLAN_S = 0.5  # a burst of allocation changes (a job stopping) makes one plan, not one per change
STOP_WAIT_S = 60.0  # how long a stopped partial placement may take to release its allocations


@dataclass(frozen=True)
class QueueStatus:
    """What a queued run tells its submitter: its need, the cluster's free capacity and who
    holds it (only what the token may read), its place in the queue and since when."""

    label: str  # namespace/job of this run
    run_id: str
    place: int
    length: int
    since: float  # unix time it entered the queue
    needs: Resources
    capacity: Resources  # of the nodes the job may use
    free: Resources
    holders: list[tuple[str, Resources]] = field(default_factory=list)  # namespace/job, what it holds
    hidden: bool = False  # the plan failed although the visible free capacity would do
    reasons: list[str] = field(default_factory=list)  # the plan's, per group
    nodes_readable: bool = True  # False: the token may not read the node totals (no node:read)

    def describe(self) -> str:
        """One line for the submitter: 'team-a/digits run 3f2a9c1e does not fit now: needs
        cpu 3380 MHz, memory 1800 MB; free cpu 1820 of 5200 MHz, memory ...; held by
        team-b/digits (...); place 1 of 1 in the queue since 10:05:12'."""
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        waiting = "does not fit now" if self.place == 1 else f"waits behind {self.place - 1} run(s) ahead of it"
        free = [f"cpu {self.free.cpu} of {self.capacity.cpu} MHz", f"memory {self.free.memory} of {self.capacity.memory} MB"]
        for asked in sorted(self.needs.devices):  # only the devices this job asks for
            offered = {d: n for d, n in self.capacity.devices.items() if capacity.device_matches(asked, d)}
            left = sum(self.free.devices.get(d, 0) for d in offered)
            free.append(f"{asked} {left} of {sum(offered.values())}")
        # Without the node totals every "free" would read "0 of 0": say what is missing instead.
        said_free = "free " + ", ".join(free) if self.nodes_readable else "the node totals are not readable with this token (node:read)"
        parts = [f"{self.label} run {self.run_id} {waiting}: needs {self.needs.describe()}", said_free]
        if self.holders:
            shown = [f"{name} ({held.describe()})" for name, held in self.holders[:5]]
            more = f" and {len(self.holders) - 5} more" if len(self.holders) > 5 else ""
            parts.append("held by " + ", ".join(shown) + more)
        if self.hidden:
            parts.append("the rest is held by jobs your token cannot read, or too scattered over nodes to hold the job")
        parts.append(f"place {self.place} of {self.length} in the queue since {since}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Admitted:
    """How a run left `admit`: registered and placed, or (`detach`) left queued for the
    admission service (`registration` None, its `place` of `length`)."""

    registration: dict[str, Any] | None  # what POST /v1/jobs answered (EvalID, JobModifyIndex)
    waited_s: float  # in the queue, from entering it to the registration that placed
    attempts: int  # registrations; more than one when a partial placement was sent back
    notes: list[str] = field(default_factory=list)
    place: int = 0
    length: int = 0

    @property
    def queued(self) -> bool:
        return self.registration is None


class _Holding(NamedTuple):
    """The allocations that held resources, and the X-Nomad-Index they were read at."""

    index: int
    allocation_ids: set[str]


@dataclass(frozen=True)
class _ClusterView:
    """What may take a job and what holds it, read at one moment (Admission.view)."""

    nodes: list[capacity.NodeCapacity]
    allocs: list[dict[str, Any]]  # only those the token may read: Nomad lists no others
    index: int
    nodes_readable: bool = True  # False: the token may not list nodes (then `nodes` is empty)

    @property
    def holding(self) -> _Holding:
        return _Holding(self.index, {a["ID"] for a in self.allocs if capacity.holds_resources(a)})


@dataclass
class _Turn:
    """One run's way through the queue (admit's working state)."""

    job: dict[str, Any]
    entry: Entry
    register: Callable[[int], dict[str, Any]]
    modify_index: int
    placement: plan.Placement
    started: float  # monotonic
    timeout_s: float | None
    holder: ConsulDiscovery | None = None  # whose session renews `session`
    session: str = ""
    record: QueuedRun | None = None
    registered: bool = False  # a registration is out and not sent back
    left: bool = False  # left in the queue, unattended (Ctrl-C with LEAVE, or `detach`)
    attempts: int = 0
    last_plan: float = 0.0

    @property
    def deadline(self) -> float | None:
        return self.started + self.timeout_s if self.timeout_s else None

    def admitted(self, registration: dict[str, Any]) -> Admitted:
        waited = time.monotonic() - self.started
        notes = []
        if waited >= 1 or self.attempts > 1:
            again = f", {self.attempts} attempts" if self.attempts > 1 else ""
            notes.append(f"admitted after {waited:.0f}s in the queue{again}")
        return Admitted(registration, waited, self.attempts, notes)


@dataclass(frozen=True)
class _Placed:
    complete: bool
    modify_index: int = 0  # the job's JobModifyIndex after stopping a partial placement
    reasons: list[str] = field(default_factory=list)


def identity(job: dict[str, Any]) -> tuple[str, str, str]:
    """(namespace, job id, run id) of a rendered job (the body of POST /v1/jobs)."""
    inner = job["Job"]
    return inner.get("Namespace") or wire.DEFAULT_NAMESPACE, inner["ID"], (inner.get("Meta") or {}).get(wire.META_RUN, "")


def readable_nodes(api: NomadAPI, job: dict[str, Any]) -> tuple[list[capacity.NodeCapacity], bool]:
    """(the nodes that may take `job`, whether the token may list nodes at all).

    GET /v1/nodes?resources=true"""
    try:
        return capacity.node_capacities(api.nodes(), job), True
    except NomadError as exc:
        if exc.status == 403:
            return [], False
        raise


def queue_status(job: dict[str, Any], entry: Entry, entries: list[Entry], placement: plan.Placement, view: _ClusterView) -> QueueStatus:
    """What `entry` says while it waits, from `view` (read before `placement`'s plan). Pure.

    Holders are named only from `view.allocs`, the allocations Nomad let the token read
    (GET /v1/allocations?namespace=* lists no others): another team's jobs never reach the
    words; when the plan found no room although what the token sees would do, `hidden`
    says that the rest is held by jobs it cannot read."""
    namespace, job_id, run_id = identity(job)
    held = held_on(view.nodes, view.allocs)
    cluster = capacity.cluster_capacity(view.nodes)
    free = capacity.subtract(cluster, capacity.total(held.values()))
    needs = capacity.job_needs(job)
    short = capacity.short_of(needs, free) or ["cpu", "memory"]

    def weight(item: tuple[tuple[str, str], Resources]) -> tuple[int, ...]:
        res = item[1]
        return tuple(res.cpu if d == "cpu" else res.memory if d == "memory" else sum(res.devices.values()) for d in short)

    holders = [(f"{ns}/{name}", res) for (ns, name), res in sorted(held.items(), key=weight, reverse=True)]
    place, length = queue.position(entries, entry.key)
    # The plan found no room although what the token sees would do: someone it cannot see.
    hidden = bool(view.nodes) and placement.verdict != plan.FITS and not capacity.short_of(needs, free)
    return QueueStatus(
        f"{namespace}/{job_id}", run_id, place, length, entry.enqueued_at, needs, cluster, free, holders, hidden,
        placement.reasons, view.nodes_readable,
    )  # fmt: skip


class Admission:
    """Admits one run at a time through the cluster's queue (see the module's docstring).

    `on_status` gets a QueueStatus whenever what a waiting run would say changes;
    `on_event` a line for what happens (sent back to the queue). `timeout_s` bounds the
    wait in the queue; `on_interrupt` is what Ctrl-C does to a queued run (REMOVE, the
    default: nothing is left behind; LEAVE: it stays queued for the admission service).
    `detach`: a run that must wait is left queued for the admission service at once (when
    one runs; otherwise it waits here). `after_plan` is
    called between a plan that fits and the registration (tests take capacity there, as a
    job nomadtf did not start would).
    """

    def __init__(
        self,
        api: NomadAPI,
        queue_kv: AdmissionQueue | None = None,
        *,
        on_status: Callable[[QueueStatus], None] = lambda status: None,
        on_event: Callable[[str], None] = lambda line: None,
        timeout_s: float | None = None,
        on_interrupt: str = REMOVE,
        detach: bool = False,
        after_plan: Callable[[], None] = lambda: None,
    ):
        if on_interrupt not in (REMOVE, LEAVE):
            raise ValueError(f"on_interrupt: {on_interrupt!r} is neither {REMOVE!r} nor {LEAVE!r}")
        self.api = api
        self.queue = queue_kv or AdmissionQueue()
        self.on_status = on_status
        self.on_event = on_event
        self.timeout_s = timeout_s
        self.on_interrupt = on_interrupt
        self.detach = detach
        self.after_plan = after_plan
        self._told_no_service = False
        self._said = ""

    # ---- the check: never, not now, fits ----------------------------------------------------

    def check(self, job: dict[str, Any], nodes: list[capacity.NodeCapacity] | None = None) -> plan.Placement:
        """The plan's verdict for `job` now (`nodes`: those that may take it, when known).

        POST /v1/job/:job_id/plan ; GET /v1/nodes?resources=true when it does not fit"""
        return self.classify(self.api.plan(job), job, nodes)

    def classify(self, result: dict[str, Any], job: dict[str, Any], nodes: list[capacity.NodeCapacity] | None = None) -> plan.Placement:
        """plan.classify of a plan `result`, with the nodes that may take `job`.

        GET /v1/nodes?resources=true when the plan did not place everything"""
        if not result.get("FailedTGAllocs"):
            return plan.Placement(plan.FITS)
        return plan.classify(result, job, self._nodes(job) if nodes is None else nodes)

    def _nodes(self, job: dict[str, Any]) -> list[capacity.NodeCapacity]:
        """The nodes that may take `job`; none known when the token may not list nodes (then
        only Nomad's plan decides "never", by feasibility).  GET /v1/nodes?resources=true"""
        return readable_nodes(self.api, job)[0]

    def view(self, job: dict[str, Any]) -> _ClusterView:
        """The nodes that may take `job` and every allocation the token may read, now.

        GET /v1/nodes?resources=true ; GET /v1/allocations?namespace=*&resources=true"""
        nodes, readable = readable_nodes(self.api, job)
        allocs, index = self.api.cluster_allocations()
        return _ClusterView(nodes, allocs, index, readable)

    # ---- admission ----------------------------------------------------------------------------

    def admit(
        self,
        job: dict[str, Any],
        register: Callable[[int], dict[str, Any]],
        modify_index: int,
        *,
        gang_timeout_s: float,
    ) -> Admitted:
        """Queue `job` and register it (`register(modify_index)`, which renders and posts it)
        in its turn, when the whole job fits; JobFailed at once when it can never fit.

        QueueTimeout after `timeout_s` in the queue (the run is removed; nothing was
        submitted); QueueInterrupted on Ctrl-C, after removing the run or leaving it queued
        (`on_interrupt`); JobStopped when someone removed it from the queue. Errors of
        `register` (a 409: another run registered first) come through as they are.

        POST /v1/job/:job_id/plan ; GET /v1/nodes?resources=true ; PUT /v1/session/create ;
        PUT and blocking GET /v1/kv/nomadtf/_admission/queue/... and .../lock ;
        GET /v1/allocations?namespace=* (blocking, at the head) ; POST /v1/jobs ;
        GET /v1/evaluation/:id (blocking) ; GET /v1/job/:job_id/allocations (blocking, gang)
        """
        placement = self.check(job)
        if placement.verdict == plan.NEVER:
            raise JobFailed(placement.failure_text())
        namespace, job_id, run_id = identity(job)
        ticket = wire.queue_ticket(namespace, job_id, run_id)
        entry = Entry(
            namespace, ticket, int(job["Job"].get("Priority") or 50), time.time(), needs=_as_dict(capacity.job_needs(job)),
            gang_timeout_s=gang_timeout_s, key=wire.kv_queue_entry(namespace, ticket),
        )
        holder = ConsulDiscovery(job_id, namespace, client=self.queue.consul, run_id=run_id)
        turn = _Turn(job, entry, register, modify_index, placement, time.monotonic(), self.timeout_s, holder)
        turn.session = holder.open_session(wire.admission_session_name(namespace, job_id, run_id))
        turn.record = QueuedRun(namespace, job_id, run_id, ticket, entry.enqueued_at)
        try:
            if not self.queue.enqueue(entry, turn.session) or not self.queue.put_record(turn.record, turn.session):
                raise JobFailed(f"could not queue {namespace}/{job_id} run {run_id}: its queue entry is held by another session")
            try:
                return self._turns(turn)
            except KeyboardInterrupt:
                if self.on_interrupt == LEAVE and not turn.registered:
                    self._leave(turn)
                raise self._interrupted(turn) from None
        finally:
            if not turn.left:
                try:
                    self.queue.remove(namespace, turn.entry.ticket)
                except Exception:  # noqa: BLE001 - the session's end deletes it anyway
                    pass
            holder.close()  # the lock, and an entry still held, go with the session

    def admit_unattended(self, record: QueuedRun, entry: Entry, session: str, holder: ConsulDiscovery) -> bool:
        """The admission service's step for the unattended run at the head of the queue,
        under the service's `session`: register it when the whole job fits (True, out of
        the queue), or wait until some allocation lets go of resources (False: ask again).
        A run that cannot be registered any more (the job runs another run now, or it can
        never fit now) leaves the queue with `on_event` saying why (True).

        GET /v1/job/:job_id ; the calls of one turn (lock, plan, POST /v1/jobs, placement) ;
        DELETE .../queue/<ns>/<ticket> and .../runs/<ns>/<ticket>"""
        job = record.job or {}
        label = f"{record.namespace}/{record.job_id} run {record.run_id}"
        existing = self.api.job(record.job_id)
        if existing is not None and existing.get("Status") != "dead":
            if (existing.get("Meta") or {}).get(wire.META_RUN) != record.run_id:
                self.on_event(f"dropped {label} from the queue: job {record.job_id} is running another run")
            self.queue.remove(record.namespace, record.ticket)  # ... or this one (a leader died after registering it)
            return True
        modify_index = int((existing or {}).get("JobModifyIndex") or 0)

        def register(index: int) -> dict[str, Any]:
            return self.api.register(job, modify_index=index)

        turn = _Turn(job, entry, register, modify_index, plan.Placement(plan.NOT_NOW), time.monotonic(), None, holder, session, record)
        try:
            admitted, holding = self._take_turn(turn)
        except (JobFailed, NomadError) as exc:
            self.on_event(f"dropped {label} from the queue: {exc}")
            self.queue.remove(record.namespace, record.ticket)
            return True
        if admitted is not None:
            self.queue.remove(record.namespace, record.ticket)
            self.on_event(f"admitted {label} after {time.time() - record.enqueued_at:.0f}s in the queue")
            return True
        if holding is not None:
            self._wait_for_release(holding, None)
        return False

    def _leave(self, turn: _Turn) -> None:
        """Leave the run queued, unattended: entry and record outlive our session, the
        record with the job for the admission service to register.

        PUT .../queue/<ns>/<ticket>?release= ; PUT .../runs/<ns>/<ticket>?release="""
        turn.entry = replace(turn.entry, attended=False)
        turn.record = replace(turn.record, attended=False, job=turn.job)
        self.queue.release_record(turn.record, turn.session)
        self.queue.release(turn.entry, turn.session)
        turn.left = True

    def _leave_for_the_service(self, turn: _Turn, entries: list[Entry]) -> Admitted | None:
        """`detach`: leave the run to the admission service, when one runs (Admitted with
        its place); None (wait here) when none does.  GET /v1/kv/nomadtf/_admission/leader"""
        if not self.detach or turn.registered:
            return None
        _, leader = self.queue.leader()
        if not leader:
            if not self._told_no_service:
                self._told_no_service = True
                self.on_event("no admission service runs (nomadtf admission deploy): --detach waits here until the run is admitted")
            return None
        self._leave(turn)
        place, length = queue.position(entries, turn.entry.key)
        return Admitted(None, time.monotonic() - turn.started, turn.attempts, place=place, length=length)

    def _interrupted(self, turn: _Turn) -> QueueInterrupted:
        namespace, job_id, run_id = identity(turn.job)
        if turn.registered:
            return QueueInterrupted(
                f"interrupted while {namespace}/{job_id} run {run_id} was being placed; it was submitted and goes on "
                f"(nomadtf status {job_id} --namespace {namespace}, nomadtf stop {job_id} --namespace {namespace})"
            )
        if turn.left:
            return QueueInterrupted(
                f"left {namespace}/{job_id} run {run_id} in the queue, unattended: the admission service admits it in its "
                "turn (nomadtf admission deploy, if none runs); nothing is submitted until then"
            )
        return QueueInterrupted(f"removed {namespace}/{job_id} run {run_id} from the queue; nothing was submitted")

    def _turns(self, turn: _Turn) -> Admitted:
        """Wait for our turn, admit; after a partial placement, wait again from our place."""
        q_index, entries = self.queue.entries()
        while True:
            self._check_deadline(turn, entries)
            if queue.find(entries, turn.entry.key) is None:
                self._queue_again(turn)
                q_index, entries = self.queue.entries()
                continue
            if queue.ordered(entries)[0].key != turn.entry.key:
                self._say(queue_status(turn.job, turn.entry, entries, turn.placement, self.view(turn.job)))
                left = self._leave_for_the_service(turn, entries)
                if left is not None:
                    return left
                q_index, entries = self.queue.entries(q_index, wait_s=self._wait_s(QUEUE_WAIT_S, turn.deadline))
                continue
            admitted, holding = self._take_turn(turn)
            if admitted is not None:
                return admitted
            if holding is not None:  # it does not fit now
                left = self._leave_for_the_service(turn, entries)
                if left is not None:
                    return left
                self._wait_for_release(holding, turn.deadline)
            q_index, entries = self.queue.entries()

    def _take_turn(self, turn: _Turn) -> tuple[Admitted | None, _Holding | None]:
        """At the head: under the lock, plan, and register when everything fits.
        (Admitted, None) when placed; (None, what holds the cluster) when it does not fit
        now; (None, None) to look at the queue again (the lock was taken, the head changed,
        a partial placement was sent back)."""
        time.sleep(max(0.0, turn.last_plan + MIN_REPLAN_S - time.monotonic()))
        turn.last_plan = time.monotonic()
        if not self.queue.acquire_lock(turn.session, turn.entry.ticket):
            lock_index, holder = self.queue.wait_for_lock(0, 0)
            if holder:  # another admitter is placing a run: its end is the next chance
                self.queue.wait_for_lock(lock_index, self._wait_s(CAPACITY_WAIT_S, turn.deadline))
            return None, None
        try:
            _, entries = self.queue.entries()
            if queue.find(entries, turn.entry.key) is None:
                # Withdrawn (`nomadtf stop`) since the caller looked: the caller looks again
                # and says so (_queue_again; the service skips it), never registers it.
                return None, None
            if queue.ordered(entries)[0].key != turn.entry.key:
                return None, None  # a run of higher priority arrived meanwhile
            # What holds the cluster is read before the plan: a release after this read
            # wakes the wait below, none is missed between plan and wait.
            view = self.view(turn.job)
            turn.placement = self.check(turn.job, view.nodes)
            if turn.placement.verdict == plan.NEVER:
                raise JobFailed(turn.placement.failure_text())
            if turn.placement.verdict == plan.NOT_NOW:
                self._say(queue_status(turn.job, turn.entry, entries, turn.placement, view))
                return None, view.holding
            self.after_plan()
            registration = turn.register(turn.modify_index)
            turn.registered, turn.attempts = True, turn.attempts + 1
            placed = self._place(turn.job, registration, turn.entry.gang_timeout_s)
            if placed.complete:
                return turn.admitted(registration), None
            turn.registered, turn.modify_index = False, placed.modify_index
            namespace, job_id, _ = identity(turn.job)
            self.on_event(
                f"{namespace}/{job_id} stayed placed in part for {turn.entry.gang_timeout_s:g}s (admission.gang_timeout): "
                "stopped the placed part; back to its place in the queue (" + "; ".join(placed.reasons) + ")"
            )
            return None, None
        finally:
            self.queue.release_lock(turn.session)

    def _queue_again(self, turn: _Turn) -> None:
        """Our entry is gone. Removed by someone (`nomadtf stop`): JobStopped. Gone with our
        session (Consul restarted, or this process paused past the session's TTL): a new
        session and a new entry, behind the runs that kept theirs.

        GET /v1/session/info/:id ; PUT /v1/session/create ; PUT .../queue/<ns>/<ticket>?acquire="""
        namespace, job_id, run_id = identity(turn.job)
        if self.queue.session_alive(turn.session):
            raise JobStopped(
                f"{namespace}/{job_id} run {run_id} was removed from the queue (nomadtf stop, or a run with --replace); "
                "nothing was submitted"
            )
        turn.session = turn.holder.reopen_session()
        turn.entry = replace(turn.entry, enqueued_at=time.time())
        if not self.queue.enqueue(turn.entry, turn.session) or not self.queue.put_record(turn.record, turn.session):
            raise JobStopped(f"{namespace}/{job_id} run {run_id} lost its place in the queue and could not queue again")
        self.on_event(f"{namespace}/{job_id} run {run_id}: its Consul session ended (Consul restarted?); queued again")

    def _wait_for_release(self, holding: _Holding, deadline: float | None) -> None:
        """Block until an allocation that held resources lets go of them (capacity comes
        back only so), or CAPACITY_WAIT_S passes (a node may have joined). Other changes
        (a task event, a job placed) wake the query but cost one more query, not a plan.

        GET /v1/allocations?namespace=*&index=&wait= (blocking)"""
        until = time.monotonic() + self._wait_s(CAPACITY_WAIT_S, deadline)
        index, held = holding
        while time.monotonic() < until:
            allocs, index = self.api.cluster_allocations(index, wait_s=max(1.0, until - time.monotonic()))
            now_held = {a["ID"] for a in allocs if capacity.holds_resources(a)}
            if held - now_held:
                return
            held = now_held

    def _say(self, status: QueueStatus) -> None:
        """Hand the status on when what it says changed (not at every wake)."""
        text = status.describe()
        if text != self._said:
            self._said = text
            self.on_status(status)

    @staticmethod
    def _wait_s(longest: float, deadline: float | None) -> float:
        if deadline is None:
            return longest
        return max(1.0, min(longest, deadline - time.monotonic()))

    @staticmethod
    def _check_deadline(turn: _Turn, entries: list[Entry]) -> None:
        if turn.deadline is None or time.monotonic() < turn.deadline:
            return
        namespace, job_id, run_id = identity(turn.job)
        place, length = queue.position(entries, turn.entry.key)
        raise QueueTimeout(
            f"{namespace}/{job_id} run {run_id} waited {time.monotonic() - turn.started:.0f}s in the queue (--timeout), "
            f"at place {place} of {length}; removed it from the queue, nothing was submitted"
        )

    # ---- gang: all placed, or nothing ---------------------------------------------------------

    def _place(self, job: dict[str, Any], registration: dict[str, Any], gang_timeout_s: float) -> _Placed:
        """Wait until Nomad placed every allocation of the registration; when some stay
        unplaced for `gang_timeout_s`, stop the job, wait until its allocations let go, and
        clear the run's Consul keys (the next attempt starts afresh).

        GET /v1/evaluation/:eval_id (blocking) ; GET /v1/job/:job_id ;
        GET /v1/job/:job_id/allocations (blocking) ; DELETE /v1/job/:job_id ;
        DELETE /v1/kv/nomadtf/<ns>/<job>/<run>/?recurse
        """
        namespace, job_id, run_id = identity(job)
        evaluation = self._evaluated(registration["EvalID"], gang_timeout_s)
        failed = evaluation.get("FailedTGAllocs") or {}
        if not failed:
            return _Placed(True)
        inner = job["Job"]
        devices, counts = plan.requested_devices(inner), plan.group_counts(inner)
        reasons = [plan.explain_placement_failure(g, m, devices.get(g), counts.get(g)) for g, m in sorted(failed.items())]
        version = (self.api.job(job_id) or {}).get("Version", 0)
        deadline = time.monotonic() + gang_timeout_s
        index = 0
        while time.monotonic() < deadline:
            allocs, index = self.api.watch_allocations(job_id, index, wait_s=max(0.5, deadline - time.monotonic()))
            if _all_placed(allocs, version, counts):
                return _Placed(True)
        stopped = self.api.stop(job_id)
        self._wait_released(job_id)
        ConsulDiscovery(job_id, namespace, client=self.queue.consul, run_id=run_id).delete_run_keys()
        modify_index = int(stopped.get("JobModifyIndex") or (self.api.job(job_id) or {}).get("JobModifyIndex", 0))
        return _Placed(False, modify_index, reasons)

    def _evaluated(self, eval_id: str, wait_s: float) -> dict[str, Any]:
        """The registration's evaluation once the scheduler is done with it.

        GET /v1/evaluation/:eval_id?index= (blocking)"""
        index = 0
        while True:
            evaluation, index = self.api.watch_evaluation(eval_id, index, wait_s=max(5.0, wait_s))
            status = (evaluation or {}).get("Status")
            if status == "complete":
                return evaluation or {}
            if status in ("failed", "canceled"):
                raise JobFailed(f"evaluation {eval_id[:8]} {status}: {(evaluation or {}).get('StatusDescription', '')}")

    def _wait_released(self, job_id: str) -> None:
        """Until no allocation of the job holds resources (bounded by STOP_WAIT_S).

        GET /v1/job/:job_id/allocations (blocking)"""
        deadline = time.monotonic() + STOP_WAIT_S
        index = 0
        while time.monotonic() < deadline:
            allocs, index = self.api.watch_allocations(job_id, index, wait_s=max(0.5, min(5.0, deadline - time.monotonic())))
            if not any(capacity.holds_resources(a) for a in allocs):
                return


@dataclass(frozen=True)
class QueuedLine:
    """A queued run as `nomadtf status` shows it: its place, and what it waits for (its
    needs and, when the free capacity was read, what of them is not free now)."""

    record: QueuedRun
    place: int
    length: int
    priority: int
    needs: Resources = field(default_factory=Resources)
    short: Resources | None = None  # of `needs`, what the cluster lacks now; None: not read

    def describe(self) -> str:
        """'queued: run 3f2a9c1e at place 2 of 3 since 10:05:12, priority 50, needs cpu 3380 MHz,
        memory 1800 MB; short of cpu 1200 MHz now (for the admission service)'"""
        since = time.strftime("%H:%M:%S", time.localtime(self.record.enqueued_at))
        who = "its submitter follows it" if self.record.attended else "for the admission service"
        text = f"queued: run {self.record.run_id} at place {self.place} of {self.length} since {since}, priority {self.priority}"
        text += f", needs {self.needs.describe()}"
        if self.short is not None and self.short != Resources():
            text += f"; short of {_describe_short(self.short)} now"
        return f"{text} ({who})"

    def with_free(self, free: Resources | None) -> QueuedLine:
        """This line with its shortfall against `free` (None: unknown, nothing said)."""
        return replace(self, short=None if free is None else capacity.shortfall(self.needs, free))


def _describe_short(short: Resources) -> str:
    """'cpu 1200 MHz, nvidia/gpu x1': only the dimensions that lack something."""
    parts = [f"cpu {short.cpu} MHz"] if short.cpu else []
    parts += [f"memory {short.memory} MB"] if short.memory else []
    parts += [f"{name} x{count}" for name, count in sorted(short.devices.items()) if count]
    return ", ".join(parts)


def free_now(api: NomadAPI) -> Resources | None:
    """What the ready nodes of the default pool have free now, less what the allocations the
    token may read hold; None when the token may not read the node totals. For `nomadtf
    status` (a queued run's own record names no datacenter or pool unless it was left with
    its job), so it is the cluster's, not one job's.

    GET /v1/nodes?resources=true ; GET /v1/allocations?namespace=*&resources=true"""
    nodes, readable = readable_nodes(api, {"Datacenters": ["*"]})
    if not readable:
        return None
    allocs, _ = api.cluster_allocations()
    return capacity.subtract(capacity.cluster_capacity(nodes), capacity.total(held_on(nodes, allocs).values()))


def held_on(nodes: list[capacity.NodeCapacity], allocs: list[dict[str, Any]]) -> dict[tuple[str, str], Resources]:
    """What the allocations on `nodes` hold, by job (capacity.usage). Pure."""
    on_nodes = {n.node_id for n in nodes}
    return capacity.usage(a for a in allocs if a.get("NodeID") in on_nodes)


def queued_runs(queue_kv: AdmissionQueue, namespace: str, job_id: str | None = None) -> list[QueuedLine]:
    """The namespace's queued runs ("*": every namespace the token may read), of one job
    or all, with their place in the queue.

    GET /v1/kv/nomadtf/_admission/runs/<ns>/?recurse ; GET .../queue/?recurse"""
    records = [r for r in queue_kv.records(namespace) if job_id is None or r.job_id == job_id]
    if not records:
        return []
    _, entries = queue_kv.entries()
    lines = []
    for record in records:
        key = wire.kv_queue_entry(record.namespace, record.ticket)
        entry = queue.find(entries, key)
        if entry is not None:
            place, length = queue.position(entries, key)
            lines.append(QueuedLine(record, place, length, entry.priority, _resources(entry.needs)))
    return sorted(lines, key=lambda line: line.place)


def queue_overview(entries: list[Entry], readable: set[str]) -> list[str]:
    """`nomadtf admission status`'s lines for the queue, in admission order. Pure. Every
    submitter may read the queue, but the namespaces a token may not use are not named
    (their names can say which teams there are and what they run): "another namespace".
    `readable`: the namespaces the token may use (GET /v1/namespaces lists no others)."""
    lines = []
    for place, entry in enumerate(queue.ordered(entries), start=1):
        where = f"namespace {entry.namespace}" if entry.namespace in readable else "another namespace"
        who = "followed by its submitter" if entry.attended else "for the admission service"
        lines.append(f"  {place}. {where}, priority {entry.priority}, {who}")
    return lines


def withdraw(queue_kv: AdmissionQueue, namespace: str, job_id: str) -> list[str]:
    """Take every queued run of a job out of the queue (`nomadtf stop`); their run ids. A
    submitter following one hears that it was removed.

    GET /v1/kv/nomadtf/_admission/runs/<ns>/?recurse ; DELETE .../queue/<ns>/<ticket> and .../runs/<ns>/<ticket>"""
    runs = [r for r in queue_kv.records(namespace) if r.job_id == job_id]
    for record in runs:
        queue_kv.remove(record.namespace, record.ticket)
    return [r.run_id for r in runs]


def _all_placed(allocs: list[dict[str, Any]], version: int, counts: dict[str, int]) -> bool:
    """Every group of job version `version` has as many allocations as its count. Pure."""
    placed: dict[str, int] = {}
    for alloc in allocs:
        if alloc.get("JobVersion") == version and alloc.get("DesiredStatus", "run") == "run":
            placed[alloc.get("TaskGroup", "")] = placed.get(alloc.get("TaskGroup", ""), 0) + 1
    return all(placed.get(group, 0) >= count for group, count in counts.items())


def _as_dict(resources: Resources) -> dict[str, Any]:
    return {"cpu": resources.cpu, "memory": resources.memory, "devices": dict(resources.devices)}


def _resources(needs: dict[str, Any]) -> Resources:
    """The inverse of `_as_dict` (an entry's `needs`)."""
    return Resources(int(needs.get("cpu") or 0), int(needs.get("memory") or 0), dict(needs.get("devices") or {}))
