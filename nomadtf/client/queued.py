"""A submitter's side of admission: whether a controller leads, waiting for a suspended
run to be admitted, and what a queued run says (docs/guide/queueing.md).

The submitter writes nothing shared: its run is a suspended job in its own namespace,
registered with its own token. It reads its own job (a blocking query that wakes only when
that job changes) and the board the controller publishes (one Consul key), and stops its
own job when it gives up (`--timeout`, Ctrl-C with `remove`).

Usage:
    leader = controller_leader()                  # "" when no controller leads
    wait = AdmissionWait(api, "digits", run_id, on_status=show, timeout_s=600)
    job = wait.wait()                             # the admitted job, or an error
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import consul

from nomadtf import wire
from nomadtf.admission import suspension
from nomadtf.admission.board import Board, BoardLine
from nomadtf.errors import JobFailed, JobStopped, QueueInterrupted, QueueTimeout, ServerError
from nomadtf.job.answers import Job
from nomadtf.job.capacity import Resources
from nomadtf.servers.nomad import NomadAPI

REMOVE, LEAVE = "remove", "leave"  # what Ctrl-C does to a queued run
JOB_WAIT_S = 10.0  # a waiter looks at the board at least this often (its own job wakes it at once)
FIRST_LOOKS_S = 2.0  # ... and this often in its first FIRST_LOOKS_FOR_S, so its first place shows soon
FIRST_LOOKS_FOR_S = 10.0
DETACH_LOOK_S = 10.0  # how long --detach waits for the controller's first look at the run


def read_board(client: consul.Consul | None = None) -> Board:
    """GET /v1/kv/nomadtf/_admission/board (an empty board when it cannot be read)."""
    from nomadtf.servers.consulhttp import consul_call, consul_client

    try:
        _, item = consul_call("reading the admission board", (client or consul_client()).kv.get, wire.KV_ADMISSION_BOARD)
    except ServerError:
        return Board()
    return Board.parse((item or {}).get("Value"))


def controller_leader(client: consul.Consul | None = None) -> str:
    """Who leads admission ("" when no controller does).  GET /v1/kv/nomadtf/_admission/leader"""
    from nomadtf.admission.lease import leader_of
    from nomadtf.servers.consulhttp import consul_client

    return leader_of(client or consul_client())[1]


def refusal(api: NomadAPI, job_id: str) -> str:
    """Why the controller gave up on a run: its placeholder's last scaling event.

    GET /v1/job/:job_id/scale"""
    try:
        events = api.scaling_events(job_id).get(suspension.PLACEHOLDER_GROUP) or []
    except ServerError as exc:
        return f"the admission controller refused it (its reason could not be read: {exc})"
    for event in events:
        if event.meta.get(suspension.META_ADMISSION) == "refused":
            return event.message or "refused by the admission controller"
    return "the admission controller refused it"


def preemptions(api: NomadAPI, job_id: str, run_id: str) -> list[str]:
    """When and by whom the admission controller preempted this run, oldest first:
    ["10:05:12 preempted at step 420 by team-b/big (priority 90); requeued"].

    GET /v1/job/:job_id/scale"""
    try:
        events = api.scaling_events(job_id).get(suspension.PLACEHOLDER_GROUP) or []
    except ServerError:
        return []
    out = []
    for event in reversed(events):  # Nomad lists the newest first
        if event.meta.get(suspension.META_ADMISSION) == "preempted" and event.meta.get(wire.META_RUN) == run_id:
            when = time.strftime("%H:%M:%S", time.localtime(event.time / 1e9))
            message = event.message.removeprefix("nomadtf admission: ").removeprefix(f"run {run_id} ")
            out.append(f"{when} {message}")
    return out


def _duration(seconds: float) -> str:
    """'45s', '12m', '3h05m'"""
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def describe_short(short: Resources) -> str:
    """'cpu 1200 MHz, nvidia/gpu x1': only the dimensions that lack something."""
    parts = [f"cpu {short.cpu} MHz"] if short.cpu else []
    parts += [f"memory {short.memory} MB"] if short.memory else []
    parts += [f"{name} x{count}" for name, count in sorted(short.devices.items()) if count]
    return ", ".join(parts)


@dataclass(frozen=True)
class QueueStatus:
    """What a queued run says: its place, what it needs, what of that the cluster lacks."""

    label: str  # namespace/job
    run_id: str
    line: BoardLine | None
    length: int
    leader: str
    shown: int = 0  # how many lines the board lists (it lists at most board.MAX_LINES)

    def describe(self) -> str:
        """'team-a/digits run 3f2a9c1e does not fit now: needs cpu 3380 MHz, memory 1800 MB;
        the cluster lacks cpu 1200 MHz now; place 1 of 2 in the queue since 10:05:12'"""
        if not self.leader:
            return f"{self.label} run {self.run_id} waits: no admission controller leads now; it is admitted once one does"
        line = self.line
        if line is None and self.shown and self.length > self.shown:
            return f"{self.label} run {self.run_id} is queued at a place after {self.shown} of {self.length}"
        if line is None:
            return f"{self.label} run {self.run_id} is queued; the admission controller has not published its place yet"
        try:
            since = time.strftime("%H:%M:%S", time.localtime(line.since)) if line.since else "?"
        except (OverflowError, ValueError, OSError):
            since = "?"
        parts = [f"{self.label} run {self.run_id} {line.note or 'waits'}: needs {line.needs.describe()}"]
        if line.short is not None and line.short != Resources():
            parts.append(f"the cluster lacks {describe_short(line.short)} now")
        elif line.short is not None and line.note.startswith("does not fit now"):
            parts.append("what is free is spread over nodes none of which can hold one of its allocations")
        parts.append(f"place {line.place} of {self.length} in the queue since {since}")
        if line.starts_at:
            left = max(0.0, line.starts_at - time.time())
            try:
                at = time.strftime("%H:%M:%S", time.localtime(line.starts_at))
            except (OverflowError, ValueError, OSError):
                at = "?"
            parts.append(f"estimated start {at} (in {_duration(left)})")
        return "; ".join(parts)


@dataclass(frozen=True)
class Waiting:
    """A run left queued (`--detach`, Ctrl-C with LEAVE): its place when it was left."""

    place: int
    length: int


class AdmissionWait:
    """Waits for one suspended run of this submitter's (see the module's docstring)."""

    def __init__(
        self,
        api: NomadAPI,
        job_id: str,
        run_id: str,
        *,
        on_status: Callable[[QueueStatus], None] = lambda status: None,
        on_event: Callable[[str], None] = lambda line: None,
        timeout_s: float | None = None,
        on_interrupt: str = REMOVE,
        board: Callable[[], Board] = read_board,
        registered_index: int = 0,
    ):
        if on_interrupt not in (REMOVE, LEAVE):
            raise ValueError(f"on_interrupt: {on_interrupt!r} is neither {REMOVE!r} nor {LEAVE!r}")
        self.api = api
        self.job_id = job_id
        self.run_id = run_id
        self.on_status = on_status
        self.on_event = on_event
        self.timeout_s = timeout_s
        self.on_interrupt = on_interrupt
        self.board = board
        self.registered_index = registered_index  # the suspended registration's JobModifyIndex
        self.started = time.monotonic()
        self._said = ""

    @property
    def label(self) -> str:
        return f"{self.api.namespace}/{self.job_id}"

    def status(self) -> QueueStatus:
        board = self.board()
        line = board.line_of(wire.queue_ticket(self.api.namespace, self.job_id, self.run_id))
        return QueueStatus(self.label, self.run_id, line, board.length, board.leader if board.age_s() < 600 else "", len(board.lines))

    def wait(self, detach: bool = False) -> Job | Waiting:
        """The job once admitted; with `detach`, a Waiting once the controller placed it in
        line (or DETACH_LOOK_S passed).
        JobFailed (refused: never fits), JobStopped (stopped or replaced), QueueTimeout,
        QueueInterrupted.

        GET /v1/job/:job_id?index=&wait= (blocking) ; GET /v1/kv/nomadtf/_admission/board ;
        DELETE /v1/job/:job_id on --timeout or Ctrl-C (remove)"""
        try:
            return self._wait(detach)
        except KeyboardInterrupt:
            raise self.interrupted() from None

    def _wait(self, detach: bool) -> Job | Waiting:
        index = 0
        while True:
            job, index = self.api.watch_job(self.job_id, index, wait_s=self._wait_s())
            current = self._judge(job)
            if job is not None and current in (suspension.ADMITTED, suspension.PLAIN):
                waited = time.monotonic() - self.started
                if waited >= 1:
                    self.on_event(f"admitted after {waited:.0f}s in the queue")
                return job
            status = self.status()
            # --detach returns once the controller has looked: admitted (above), refused
            # (an error, said now), or placed in line; at the latest after DETACH_LOOK_S.
            if detach and (status.line is not None or not status.leader or time.monotonic() - self.started > DETACH_LOOK_S):
                place = status.line.place if status.line else 0
                return Waiting(place, status.length)
            self._say(status)
            self._check_deadline(status)

    def _judge(self, job: Job | None) -> str:
        if job is None or job.run_id != self.run_id:
            raise JobStopped(
                f"{self.label} run {self.run_id} was removed from the queue (purged, or replaced by another run); nothing of it ran"
            )
        current = suspension.state(job.document)
        if job.stop and current != suspension.ADMITTED:
            raise JobStopped(f"{self.label} run {self.run_id} was removed from the queue (nomadtf stop, or a run with --replace); nothing of it ran")
        if current == suspension.REFUSED:
            raise JobFailed(f"{self.label} run {self.run_id} was not admitted: {refusal(self.api, self.job_id)}")
        return current

    def _wait_s(self) -> float:
        longest = FIRST_LOOKS_S if time.monotonic() - self.started < FIRST_LOOKS_FOR_S else JOB_WAIT_S
        if self.timeout_s is None:
            return longest
        return max(1.0, min(longest, self.started + self.timeout_s - time.monotonic()))

    def _say(self, status: QueueStatus) -> None:
        if status.leader and status.line is None and time.monotonic() - self.started < 2.0:
            return  # the controller has not looked yet: most runs are admitted before it would
        text = status.describe()
        if text != self._said:
            self._said = text
            self.on_status(status)

    def _check_deadline(self, status: QueueStatus) -> None:
        if self.timeout_s is None or time.monotonic() < self.started + self.timeout_s:
            return
        place = f" at place {status.line.place} of {status.length}" if status.line else ""
        raise QueueTimeout(
            f"{self.label} run {self.run_id} waited {time.monotonic() - self.started:.0f}s in the queue (--timeout){place}; "
            f"removed it from the queue, {self._remove()}"
        )

    def _remove(self) -> str:
        """Stop our job, and say truly what that ended: the controller may have admitted it
        a moment before (Nomad stops those allocations all the same).

        DELETE /v1/job/:job_id ; GET /v1/job/:job_id/allocations"""
        self.api.stop(self.job_id)
        started = [a for a in self.api.allocations(self.job_id) if a.create_index > self.registered_index]
        if not started:
            return "nothing of it ran"
        return f"it had just been admitted: stopped its {len(started)} allocation(s) before they trained"

    def interrupted(self) -> QueueInterrupted:
        """What Ctrl-C does to the queued run (`on_interrupt`), and the error that says so."""
        if self.on_interrupt == LEAVE:
            return QueueInterrupted(
                f"left {self.label} run {self.run_id} in the queue: the admission controller starts it in its turn "
                f"(nomadtf status {self.job_id} --namespace {self.api.namespace}; nomadtf stop {self.job_id} to remove it)"
            )
        try:
            what = self._remove()
        except ServerError as exc:
            return QueueInterrupted(f"interrupted; could not remove {self.label} run {self.run_id} from the queue: {exc}")
        return QueueInterrupted(f"removed {self.label} run {self.run_id} from the queue; {what}")
