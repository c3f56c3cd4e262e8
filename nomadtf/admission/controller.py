"""The admission controller's loop: read what Nomad holds, decide, resume suspended runs.

Any number of replicas run `nomadtf admission serve`; one leads (lease.py). The leader:

1. reads every job (one blocking query, `GET /v1/jobs?namespace=*&meta=true`), the nodes
   and the allocations; the body of a suspended run only when its JobModifyIndex changed;
2. orders the queued runs (order.py) and walks them in order: a run that could never fit
   is refused (its placeholder scaled to 0 with the reason: the job ends, `status` and its
   follower say why); a run that fits in what is free — less what runs admitted a moment
   ago still need — is admitted; the first that does not fit stops the walk (strict order);
3. admits by scaling each group of that exact job version to its wanted count and the
   placeholder to 0, each call after checking it still leads and against the JobModifyIndex
   the last call left (a stale leader's call fails; a standby that finds a run half
   admitted finishes it, or gives it back);
4. watches every admitted run until Nomad placed all of it; a run still placed in part
   after its gang timeout is given back (placeholder up, groups to 0, its Consul keys
   cleared) and queued again at its old place — whoever follows it, or nobody;
5. publishes the board (board.py) when what it says changed.

Nothing a submitter writes is acted on beyond its own job in its own namespace: the
controller reads jobs from Nomad, where the submitter's token could only write its own
namespace, and parses each one alone (a job it cannot read is skipped and listed).

Usage:
    Controller(NomadAPI.from_env(namespace="*"), consul_client(), name, on_event=print).serve(stop)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import consul

from nomadtf import capacity, wire
from nomadtf.admission import board as boards
from nomadtf.admission import fit, order, suspension
from nomadtf.admission.lease import Lease
from nomadtf.admission.order import QueuedRun
from nomadtf.errors import NomadError, ServerError
from nomadtf.nomad import NomadAPI

STEP_WAIT_S = 5.0  # the leader looks at least this often (a gang deadline, a node's return)
MIN_STEP_S = 0.1  # a burst of changes makes one step, not one per change
NEVER_RECHECK_S = 60.0  # how often a waiting run is judged "never" again
REPUBLISH_S = 60.0  # an unchanged board is written again this often: its age says the leader lives


class LostLead(Exception):
    """The fence failed: another replica leads now; this one acts no more."""


@dataclass
class InFlight:
    """A run admitted and not yet placed whole."""

    run: QueuedRun
    deadline: float  # monotonic
    admitted_at: float = field(default_factory=time.time)


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
    ):
        self.api = api  # namespace "*": reads every namespace it may
        # Called between the fit and the first admitting call (tests take capacity there,
        # as a job nomadtf did not start may).
        self.after_fit = after_fit
        self.consul = client
        self.name = name
        self.on_event = on_event
        self.lease = Lease(client, name)
        self.seen: dict[tuple[str, str], _Seen] = {}
        self.arrival: dict[tuple[str, str, str], int] = {}  # (ns, job, run) -> the index it queued at
        self.never_checked: dict[tuple[str, str, str], float] = {}
        self.in_flight: dict[tuple[str, str], InFlight] = {}
        self.down_since: dict[str, float] = {}  # node id -> when this replica first saw it away
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
                        self.lead(stop)
                        continue
                    index = self.lease.wait_for_change(index)
                except (ServerError, LostLead) as exc:
                    self.on_event(f"{self.name}: {exc}")
                    stop.wait(2.0)
        finally:
            self.lease.close()

    def lead(self, stop: Any) -> None:
        """Steps until the lead is lost or `stop`.

        GET /v1/kv/nomadtf/_admission/admitted/?recurse once; then each step's calls"""
        self.admitted = self._read_admitted()
        index = 0
        last = 0.0
        while not stop.is_set():
            if not self.lease.still_leads():
                self.on_event(f"{self.name} lost the lead")
                return
            time.sleep(max(0.0, last + MIN_STEP_S - time.monotonic()))
            last = time.monotonic()
            stubs, index = self.api.watch_jobs(index, wait_s=self._wait_s())
            self.requests += 2
            self.step(stubs)

    def _wait_s(self) -> float:
        if not self.in_flight:
            return STEP_WAIT_S
        soonest = min(f.deadline for f in self.in_flight.values()) - time.monotonic()
        return max(0.5, min(STEP_WAIT_S, soonest))

    # ---- one step ------------------------------------------------------------------------------

    def step(self, stubs: list[dict[str, Any]]) -> None:
        """Read, decide, act, publish (see the module's docstring)."""
        jobs, skipped = self._suspended_jobs(stubs)
        nodes = self.api.nodes()
        allocs, _ = self.api.cluster_allocations()
        self.requests += 2
        now = time.time()
        self.down_since = {n["ID"]: self.down_since.get(n["ID"], now) for n in nodes if n.get("Status") != "ready"}
        self._check_in_flight(jobs, allocs)
        rooms = fit.node_rooms(nodes, allocs)
        self._reserve_in_flight(rooms, allocs)
        queued = []
        self._forget_admitted(jobs)
        for key, job in list(jobs.items()):
            current = suspension.state(job)
            run_id = (job.get("Meta") or {}).get(wire.META_RUN, "")
            # A finished run is never touched: suspending it again would run it again.
            if current in (suspension.ADMITTING, suspension.ADMITTED) and self.admitted.get(key) != run_id and job.get("Status") != "dead":
                self._suspend_again(job)  # resumed by someone else (its submitter's scale-job): back in line
                continue
            if current == suspension.ADMITTING and key not in self.in_flight:
                queued.append(self._queued_run(job))  # a predecessor's half admission: finish it in its turn
            elif current == suspension.QUEUED:
                queued.append(self._queued_run(job))
        queued = order.ordered(q for q in queued if q is not None)
        lines = self._walk(queued, rooms, nodes, allocs)
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
        for key in set(self.in_flight) - set(jobs):
            self.in_flight.pop(key)  # stopped or purged while it was being placed
        return jobs, skipped

    def _read(self, key: tuple[str, str], modify_index: int) -> _Seen:
        try:
            job = self.api.in_namespace(key[0]).job(key[1])
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
        return QueuedRun(
            namespace, job_id, run_id, order.clamp_priority(job.get("Priority")), arrival, (job.get("SubmitTime") or 0) / 1e9,
            modify_index, wanted.counts, wanted.gang_timeout_s, fit.RunAsk.of(suspension.wanted_job(job, wanted.counts)),
        )  # fmt: skip

    # ---- the walk in order -----------------------------------------------------------------------

    def _walk(self, queued: list[QueuedRun], rooms: list[fit.Room], nodes: list[dict[str, Any]], allocs: list[dict[str, Any]]) -> list[boards.BoardLine]:
        lines = []
        blocked = False
        now = time.time()
        place = 0
        for run in queued:
            assert run.ask is not None
            run_key = (run.namespace, run.job_id, run.run_id)
            if now - self.never_checked.get(run_key, 0.0) >= NEVER_RECHECK_S:
                self.never_checked[run_key] = now
                why = fit.never(run.ask, nodes, allocs, now, self.down_since)
                if why:
                    self._refuse(run, f"it can never fit: {why}")
                    continue
            place += 1
            ticket = wire.queue_ticket(run.namespace, run.job_id, run.run_id)
            needs = run.ask.needs
            # A run a predecessor half admitted already holds its scaled groups: only the rest must fit.
            if not blocked and fit.place(_missing(run.ask, allocs, run.key, run.arrival), rooms):
                try:
                    self.after_fit(run)
                    self._admit(run)
                except NomadError as exc:  # stopped, purged or re-registered meanwhile: next step reads it again
                    self.on_event(f"could not admit {run.namespace}/{run.job_id} run {run.run_id}: {exc}")
                    continue
                lines.append(boards.BoardLine(ticket, run.namespace, run.priority, place, run.since, needs, None, "admitted"))
                continue
            short = capacity.shortfall(needs, _free_of(rooms, run.ask))
            note = "waits for the runs ahead of it" if blocked else "does not fit now"
            blocked = True
            lines.append(boards.BoardLine(ticket, run.namespace, run.priority, place, run.since, needs, short, note))
        return lines

    def _scale(self, run: QueuedRun, group: str, count: int, index: int, message: str, verdict: str) -> int:
        """One admitting call behind the fence; the JobModifyIndex it leaves.

        GET /v1/kv/nomadtf/_admission/leader?consistent ; POST /v1/job/:id/scale"""
        if not self.lease.still_leads():
            raise LostLead(f"{self.name} lost the lead while acting on {run.namespace}/{run.job_id}")
        reply = self.api.in_namespace(run.namespace).scale(
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
        current = suspension.group_counts(job)
        waited = max(0.0, time.time() - run.since) if run.since else 0.0
        message = f"nomadtf admission: admitted run {run.run_id} after {waited:.0f}s in the queue"
        index = run.job_modify_index
        for group, count in sorted(run.counts.items()):
            if current.get(group) != count:
                index = self._scale(run, group, count, index, message, "admitted")
        self._scale(run, suspension.PLACEHOLDER_GROUP, 0, index, message, "admitted")
        self.in_flight[run.key] = InFlight(run, time.monotonic() + run.gang_timeout_s)
        self._note(run, f"admitted after {waited:.0f}s in the queue")

    def _refuse(self, run: QueuedRun, why: str) -> None:
        """Give up on a run: its placeholder to 0 with the reason (the job ends)."""
        try:
            self._scale(run, suspension.PLACEHOLDER_GROUP, 0, run.job_modify_index, f"nomadtf admission refused run {run.run_id}: {why}", "refused")
        except NomadError as exc:
            self.on_event(f"could not refuse {run.namespace}/{run.job_id}: {exc}")
            return
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
            index = run.job_modify_index
            if suspension.group_counts(job).get(suspension.PLACEHOLDER_GROUP, 0) < 1:
                index = self._scale(run, suspension.PLACEHOLDER_GROUP, 1, index, message, "suspended")
            for group, count in sorted(suspension.group_counts(job).items()):
                if group != suspension.PLACEHOLDER_GROUP and count > 0:
                    index = self._scale(run, group, 0, index, message, "suspended")
        except NomadError as exc:
            self.on_event(f"could not suspend {run.namespace}/{run.job_id} again: {exc}")
            return
        self._note(run, "resumed out of turn: suspended again")

    # ---- admitted runs: placed whole, or given back ----------------------------------------------

    def _check_in_flight(self, jobs: dict[tuple[str, str], dict[str, Any]], allocs: list[dict[str, Any]]) -> None:
        for key, flight in list(self.in_flight.items()):
            job = jobs.get(key)
            if job is None or (job.get("Meta") or {}).get(wire.META_RUN) != flight.run.run_id:
                self.in_flight.pop(key, None)
                continue
            placed = _placed(allocs, key, flight.run.counts, flight.run.arrival)
            if placed:
                self.in_flight.pop(key, None)
            elif time.monotonic() > flight.deadline:
                self.in_flight.pop(key, None)
                self._give_back(flight.run, job, _holding_by_group(allocs, key, flight.run.arrival))

    def _give_back(self, run: QueuedRun, job: dict[str, Any], placed: dict[str, int]) -> None:
        """Placeholder up first (the job stays pending), then every group to 0, the unplaced
        ones first (a placed group stopped first would free room for a blocked one, which
        Nomad would then place only for us to stop it); the run's Consul keys go (its next
        admission starts afresh); it keeps its place in line."""
        from nomadtf.discovery import ConsulDiscovery

        try:
            index = self._scale(run, suspension.PLACEHOLDER_GROUP, 1, int(job.get("JobModifyIndex") or 0),
                                f"nomadtf admission: run {run.run_id} not placed whole within its gang timeout; queued again", "requeued")  # fmt: skip
            for group in sorted(run.counts, key=lambda g: (placed.get(g, 0) >= run.counts[g], g)):
                index = self._scale(run, group, 0, index, f"nomadtf admission: gave back the placed part of run {run.run_id}", "requeued")
        except NomadError as exc:
            self.on_event(f"could not give back {run.namespace}/{run.job_id}: {exc}")
            return
        try:
            ConsulDiscovery(run.job_id, run.namespace, client=self.consul, run_id=run.run_id).delete_run_keys()
        except ServerError as exc:
            self.on_event(f"could not clear the Consul keys of {run.namespace}/{run.job_id} run {run.run_id}: {exc}")
        self._note(run, f"not placed whole within {run.gang_timeout_s:g}s: gave back its placed part; queued again")

    def _reserve_in_flight(self, rooms: list[fit.Room], allocs: list[dict[str, Any]]) -> None:
        """Take from `rooms` what admitted runs still wait for Nomad to place."""
        for key, flight in self.in_flight.items():
            assert flight.run.ask is not None
            missing = _missing(flight.run.ask, allocs, key, flight.run.arrival)
            if missing.slots:
                fit.place(missing, rooms)

    # ---- what it says -----------------------------------------------------------------------------

    def _note(self, run: QueuedRun, what: str) -> None:
        """The replica's log names the run; the board only its ticket."""
        self.on_event(f"{run.namespace}/{run.job_id} run {run.run_id}: {what}")
        happened = boards.Happened(run.namespace, wire.queue_ticket(run.namespace, run.job_id, run.run_id), f"{time.strftime('%H:%M:%S')} {what}")
        self.recent = (self.recent + [happened])[-20:]

    def _publish(self, lines: list[boards.BoardLine], skipped: list[boards.Skipped], free: capacity.Resources) -> None:
        """PUT /v1/kv/nomadtf/_admission/board when what it says changed, or REPUBLISH_S
        after the last write (a waiter takes a board older than ten minutes for a dead leader)."""
        board = boards.Board(self.name, 0.0, tuple(lines), tuple(skipped), len(lines), free, tuple(self.recent))
        if board.value() == self._published and time.monotonic() - self._published_at < REPUBLISH_S:
            return
        self._published, self._published_at = board.value(), time.monotonic()
        self.lease.publish(wire.KV_ADMISSION_BOARD, replace(board, at=time.time()).value())
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


def _placed(allocs: list[dict[str, Any]], key: tuple[str, str], counts: dict[str, int], since_index: int) -> bool:
    have = _holding_by_group(allocs, key, since_index)
    return all(have.get(group, 0) >= count for group, count in counts.items())


def _free_of(rooms: list[fit.Room], ask: fit.RunAsk) -> capacity.Resources:
    """What the usable nodes `ask` may use have free, summed."""
    mine = [r for r in rooms if r.usable and fit._takes(r, ask)]
    devices: dict[str, int] = {}
    for room in mine:
        for name, count in room.devices.items():
            devices[name] = devices.get(name, 0) + max(count, 0)
    return capacity.Resources(sum(max(r.cpu, 0) for r in mine), sum(max(r.memory, 0) for r in mine), devices)
