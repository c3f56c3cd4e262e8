"""What `nomadtf task` itself costs, and how the control plane scales with the number of tasks.

For each layout it submits a job of `tests/jobs/probe.py` tasks (the probe prints what it
was given and sleeps, so the training process costs nothing) through a counting proxy in
front of Consul that the job's tasks are pointed at (`discovery.consul_address`), and measures:

- formation: submission -> Nomad started the last task -> each task's "cluster complete
  after X s" (its own wait for its peers) -> the last task's "generation 1: starting" (the
  tasks' stderr log lines, read through Nomad's API), and every Consul request the tasks made
  from submission to that last start (plus the debounce), broken down by endpoint;
- steady state, once it has settled, over a window: CPU seconds of each `nomadtf task`
  process (its own user + system time, not its child's), per minute and as % of one core;
  RSS of each `nomadtf task` process at the end of the window and the peak RSS of it plus
  its child; every Consul request, per task per minute and per second for the whole job.

The 4-, 16- and 64-task layouts are `multi_worker_mirrored`, where every task runs the probe
(64 bare TensorFlow servers would not fit on a 2-core machine); the growth from 4 to 16 and
from 16 to 64 tasks is printed as ratios and as the exponent k of N^k (1 linear, 2
quadratic). The full run adds a 4-task `parameter_server` job (chief, 2 workers, ps), whose
tasks watch three services instead of one (its workers and ps serve with the probe jobs'
stand-in for TensorFlow's server, tests/jobs/stand_in: the control plane is measured here). The targets are printed beside the figures,
never asserted.

Needs the local stack: `nomadtf dev up && eval "$(nomadtf dev env)"`, then
`python bench/bench_supervisor.py [--window 60] [--sizes 4,16,64] [--quick] [--json FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil
import requests

from bench import tasklog
from tests import faults
from tests.helpers import allocations, nomad, nomadtf, probe_job, purge, task_log, unique, wait_until

WINDOW_ATTEMPTS = 3  # a window that a Consul restart disturbed is measured again
SETTLE_S = 10.0  # after every child runs: the debounce (1.5 s) and the last generation writes pass
FORMATION_TAIL_S = 2.5  # after the last generation-1 start, peers' debounced steps (1.5 s) still belong to it
FORMATION_BASE_S = 300.0  # submission -> every task started generation 1, plus ...
FORMATION_PER_TASK_S = 3.0  # ... this per task: 64 Python start-ups share 2 cores
BLOCKED_GRACE_S = 60.0  # a blocked evaluation (other sessions' jobs hold the node) may clear; then it is an error
SIZES = (4, 16, 64)
TARGET_CPU_PCT = 1.0
TARGET_RSS_MIB = 60.0
REQUEST_LINE = re.compile(rb"(GET|PUT|POST|DELETE|HEAD) (\S+) HTTP/1\.[01]")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
RUN_SEGMENT = re.compile(r"<job>/[0-9a-f]{8}/")  # the KV keys carry the run id after the job (nomadtf/wire.py)


@dataclass(frozen=True)
class Layout:
    strategy: str
    roles: dict[str, dict]

    @property
    def tasks(self) -> int:
        return sum(r["count"] for r in self.roles.values())

    @property
    def label(self) -> str:
        return f"{self.tasks} ({'mwm' if self.strategy == 'multi_worker_mirrored' else 'ps'})"


PROBE_CPU_MHZ = 20  # 64 x 20 = 1280 of 4600 MHz: other sessions' jobs on the same node still fit
PROBE_MEMORY_MB = 160


def mirrored(workers: int) -> Layout:
    """Every size asks the same per task, so that only N changes. The dev node offers 4600 MHz
    and about 24 GB: cpu=100 left 64 tasks unplaceable (a blocked evaluation). raw_exec does not
    cap either; the memory covers the measured peak of a `nomadtf task` plus its probe child
    (about 48 + 12 MiB, printed by the bench) with room for a slower start."""
    return Layout("multi_worker_mirrored", {"worker": {"count": workers, "cpu": PROBE_CPU_MHZ, "memory": PROBE_MEMORY_MB}})


# Workers and ps run a bare server (the probe jobs' stand-in for TensorFlow's, tests/jobs/stand_in);
# the memory left room for TensorFlow's own.
PARAMETER_SERVER = Layout(
    "parameter_server",
    {
        "chief": {"count": 1, "cpu": 100, "memory": 300},
        "worker": {"count": 2, "cpu": 100, "memory": 600},
        "ps": {"count": 1, "cpu": 100, "memory": 600},
    },
)


# ---- the counting proxy --------------------------------------------------------------------


class RequestParser:
    """Reads one connection's client-to-server bytes just far enough to see each request:
    its head up to the blank line, then Content-Length bytes of body, which are skipped (a
    KV value is never mistaken for a request)."""

    def __init__(self, record):
        self.record = record
        self.head = b""
        self.body_left = 0

    def feed(self, data: bytes) -> None:
        while data:
            if self.body_left:
                taken = min(self.body_left, len(data))
                self.body_left -= taken
                data = data[taken:]
                continue
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end], self.head[end + 4 :]
            self.head = b""
            first, *headers = head.split(b"\r\n")
            match = REQUEST_LINE.fullmatch(first)
            if not match:
                raise ValueError(f"not an HTTP request line: {first[:80]!r}")
            for line in headers:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    self.body_left = int(value)
                elif name == b"transfer-encoding":
                    raise ValueError("chunked request bodies are not parsed")  # requests sends Content-Length
            self.record(match.group(1).decode(), match.group(2).decode())


class CountingProxy:
    """A TCP proxy on a free 127.0.0.1 port in front of Consul that records every request
    (monotonic time, method, target) the clients send. Runs its own asyncio loop on a thread.

    Usage:
        with CountingProxy("127.0.0.1:8500") as proxy:
            ... point clients at f"127.0.0.1:{proxy.port}" ...
            proxy.requests   # [(t, "GET", "/v1/kv/...?index=12"), ...]
    """

    def __init__(self, upstream: str):
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host or "127.0.0.1", int(port or 8500))
        self.requests: list[tuple[float, str, str]] = []
        self.errors: list[tuple[float, str]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="consul-proxy", daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the counting proxy did not start")
        return self

    def __exit__(self, *_exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    def _record(self, method: str, target: str) -> None:
        self.requests.append((time.monotonic(), method, target))  # list.append is atomic

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError as exc:
            self.errors.append((time.monotonic(), f"cannot reach Consul: {exc.__class__.__name__}"))
            client_w.close()
            return
        parser = RequestParser(self._record)
        await asyncio.gather(self._pump(client_r, server_w, parser.feed), self._pump(server_r, client_w, None))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, inspect) -> None:
        try:
            while data := await reader.read(65536):
                if inspect:
                    try:
                        inspect(data)
                    except ValueError as exc:
                        self.errors.append((time.monotonic(), str(exc)))
                        inspect = None  # this connection is no longer counted; reported
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()


class CheckChanges:
    """Counts every change of any health check in Consul (the whole datacenter) with a
    blocking query of its own, on Consul itself: what else happens on the shared stack. The
    tasks watch only their own job's services (GET /v1/health/service/<job>-<role>), so
    their request rate should not follow it; this column shows whether it does.

    Usage: with CheckChanges() as changes: ...; changes.between(t0, t1)
    """

    def __init__(self):
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="check-changes", daemon=True)

    def __enter__(self) -> CheckChanges:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> int:
        return sum(1 for t in self.times if start <= t <= end)

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            try:
                resp = requests.get(
                    f"http://{consul_address()}/v1/health/state/any", params={"index": index, "wait": "10s"}, timeout=20
                )
                new_index = int(resp.headers["X-Consul-Index"])
            except (requests.RequestException, KeyError, ValueError):
                index = 0  # Consul restarting (other tests do that)
                self._stop.wait(1.0)
                continue
            if index and new_index != index:
                self.times.append(time.monotonic())
            index = new_index if new_index >= index else 0


def endpoint(method: str, target: str, job_id: str) -> str:
    """A request's endpoint with the job, its run and ids masked: `GET /v1/kv/nomadtf/default/
    <job>/<run>/cluster/ (blocking)`, the same name in every layout. A query with `index` is a
    blocking query."""
    parts = urlsplit(target)
    path = RUN_SEGMENT.sub("<job>/<run>/", UUID.sub("<id>", parts.path.replace(job_id, "<job>")))
    return f"{method} {path}" + (" (blocking)" if "index" in parse_qs(parts.query) else "")


# ---- one measurement -----------------------------------------------------------------------


@dataclass
class TaskFigures:
    pid: int
    role: str
    alloc_index: int
    cmdline: str
    cpu_s: float
    rss_mib: float
    peak_mib: float  # peak RSS of the task plus that of its child: what the layout's memory must cover


@dataclass
class Formation:
    """Submission to the last task's generation-1 start; times in seconds after submission,
    on the tasks' log clock (1 ms; 1 s on builds that log whole seconds)."""

    nomad_started_s: float  # Nomad started the last task (its TaskState StartedAt)
    complete_after_s: list[float]  # each task's own "cluster complete after X s" (its wait for peers)
    last_start_s: float  # the last task's "generation N: starting"
    generations: list[int]  # N of that line per task: 1 unless a rendezvous had to be redone
    requests: int  # every Consul request of the tasks from submission to last_start_s + FORMATION_TAIL_S
    by_endpoint: dict[str, int]
    check_changes: int  # of any check in Consul meanwhile, this job's included (CheckChanges)
    notes: str = ""  # why the figures may be off (Consul restarted, a later generation)


@dataclass
class Result:
    layout: str
    strategy: str
    tasks: int
    window_s: float
    per_task: list[TaskFigures]
    requests: int
    by_endpoint: dict[str, int]
    check_changes: int  # of any check in Consul during the window (other jobs included)
    formation: Formation | None = None
    disturbed: str = ""  # why this window is not steady state; empty when it is

    @property
    def cpu_pct(self) -> list[float]:
        return [100.0 * t.cpu_s / self.window_s for t in self.per_task]

    @property
    def rss(self) -> list[float]:
        return [t.rss_mib for t in self.per_task]

    @property
    def requests_per_task_min(self) -> float:
        return self.requests / self.tasks / (self.window_s / 60.0)

    @property
    def requests_per_s(self) -> float:
        """The whole job's steady load on Consul."""
        return self.requests / self.window_s

    def summary(self) -> dict:
        return {
            **asdict(self),
            "cpu_pct_mean": _mean(self.cpu_pct),
            "cpu_pct_max": max(self.cpu_pct),
            "cpu_s_per_task_min": _mean(self.cpu_pct) * 0.6,
            "rss_mib_mean": _mean(self.rss),
            "rss_mib_max": max(self.rss),
            "peak_task_and_child_mib_max": max(t.peak_mib for t in self.per_task),
            "requests_per_task_min": self.requests_per_task_min,
            "requests_per_s": self.requests_per_s,
        }


@dataclass
class Failed:
    """A layout that could not be measured; the report says why instead of a row of figures."""

    layout: str
    strategy: str
    tasks: int
    reason: str

    def summary(self) -> dict:
        return asdict(self)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def supervisors(job_id: str) -> dict[tuple[str, int], psutil.Process]:
    """(role, alloc index) -> the job's `nomadtf task` processes (found as tests/faults.py does)."""
    return {(role, index): psutil.Process(pid) for (kind, role, index), pid in faults.processes(job_id).items() if kind == "task"}


def peak_rss_mib(proc: psutil.Process) -> float:
    """VmHWM of a `nomadtf task` plus that of its children: an upper bound of what its
    allocation held at once (the two peaks need not coincide)."""
    kib = 0
    for member in [proc, *proc.children(recursive=True)]:
        try:
            status = Path(f"/proc/{member.pid}/status").read_text()
        except OSError:
            continue
        kib += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return kib / 1024


def consul_address() -> str:
    return os.environ.get("CONSUL_HTTP_ADDR", "127.0.0.1:8500").removeprefix("http://")


def submit(path: Path) -> None:
    """`nomadtf run --detach`, again while the shared Consul is restarting (other tests do that)."""
    for _attempt in range(5):
        out = nomadtf("run", str(path), "--detach")
        if out.returncode == 0:
            return
        if "cannot reach Consul" not in out.stderr:
            break
        time.sleep(5)
    raise RuntimeError(f"nomadtf run failed: {out.stderr or out.stdout}")


def measure(layout: Layout, window_s: float, workdir: Path) -> Result:
    job_id = unique("bench-sup")
    with CountingProxy(consul_address()) as proxy, CheckChanges() as changes:
        spec = probe_job(
            job_id,
            layout.strategy,
            # Long enough for formation and the windows; ends by itself if this bench is killed.
            context={"sleep": int(WINDOW_ATTEMPTS * (window_s + SETTLE_S) + formation_timeout(layout) + 300)},
            roles=layout.roles,
            discovery={"rendezvous_timeout": "10m", "consul_address": f"127.0.0.1:{proxy.port}"},
        )
        path = workdir / f"{job_id}.json"
        path.write_text(json.dumps(spec))
        submitted = (time.time(), time.monotonic())
        submit(path)
        try:
            formation = measure_formation(layout, job_id, proxy, changes, submitted)
            for attempt in range(1, WINDOW_ATTEMPTS + 1):
                time.sleep(SETTLE_S)
                result = measure_window(layout, job_id, proxy, changes, window_s)
                result.formation = formation
                if not result.disturbed:
                    break
                print(f"  window {attempt}: {result.disturbed}; measuring again", file=sys.stderr, flush=True)
        finally:
            nomadtf("stop", job_id, "--purge")
            purge(job_id)
            # Keep the proxy up until the tasks are gone, so that they destroy their sessions.
            wait_until(lambda: not faults.processes(job_id), 60 + layout.tasks, "the job's processes to exit", interval=1.0)
    return result


# ---- formation -----------------------------------------------------------------------------


def formation_timeout(layout: Layout) -> float:
    return FORMATION_BASE_S + FORMATION_PER_TASK_S * layout.tasks


def measure_formation(
    layout: Layout, job_id: str, proxy: CountingProxy, changes: CheckChanges, submitted: tuple[float, float]
) -> Formation:
    """Wait until every task has started generation 1, then read the times from their logs
    and count the Consul requests up to the last start (plus the peers' debounced steps)."""
    wall, mono = submitted
    lines = wait_formed(layout, job_id)
    last_start = max(start[0] for _complete, start, _alloc in lines.values()) - wall
    ended = mono + last_start + FORMATION_TAIL_S
    time.sleep(max(0.0, ended - time.monotonic()))
    counted = [r for r in proxy.requests if mono <= r[0] <= ended]
    by_endpoint = Counter(endpoint(m, t, job_id) for _t, m, t in counted)
    generations = sorted(int(start[1][1]) for _complete, start, _alloc in lines.values())
    notes = []
    errors = [text for t, text in proxy.errors if mono <= t <= ended]
    if errors:
        notes.append(f"{len(errors)} Consul connections failed ({errors[0]})")
    if by_endpoint["PUT /v1/session/create"] > layout.tasks:
        notes.append(f"{by_endpoint['PUT /v1/session/create']} sessions for {layout.tasks} tasks (Consul restarted?)")
    if generations[-1] != 1:
        notes.append(f"some tasks started generation {generations[-1]} first (a rendezvous was redone)")
    return Formation(
        nomad_started_s=max(last_task_start(alloc) for _complete, _start, alloc in lines.values()) - wall,
        complete_after_s=sorted(float(complete[1][1]) for complete, _start, _alloc in lines.values()),
        last_start_s=last_start,
        generations=generations,
        requests=len(counted),
        by_endpoint=dict(by_endpoint.most_common()),
        check_changes=changes.between(mono, ended),
        notes="; ".join(notes),
    )


Logged = tuple[float, re.Match]  # a supervisor line's time and what it said (bench/tasklog.py)


def wait_formed(layout: Layout, job_id: str) -> dict[str, tuple[Logged, Logged, dict]]:
    """alloc id -> (its "cluster complete" line, its first "generation N: starting" line, the
    allocation) once every task has logged both. Says early why when Nomad cannot place the
    job (a blocked evaluation) or an allocation failed, instead of waiting out the timeout.

    Logs are read only once every allocation runs (no task completes before that: each waits
    for all of its peers), and each task's only until both lines are there, so that the
    polling adds little to the two cores that the formation itself needs.
    """
    deadline = time.monotonic() + formation_timeout(layout)
    found: dict[str, tuple[Logged, Logged, dict]] = {}
    blocked_since = None
    state = "nothing placed"
    while time.monotonic() < deadline:
        allocs = allocations(job_id)
        failed = [a for a in allocs if a["ClientStatus"] in ("failed", "lost")]
        if failed:
            raise RuntimeError(failure(failed))
        running = [a for a in allocs if a["ClientStatus"] == "running"]
        if len(running) == layout.tasks:
            for alloc in running:
                if alloc["ID"] not in found:
                    lines = tasklog.parse(task_log(alloc["ID"], alloc["TaskGroup"], "stderr"), time.time())
                    complete, start = tasklog.first(lines, tasklog.COMPLETE), tasklog.first(lines, tasklog.START)
                    if complete and start:
                        found[alloc["ID"]] = (complete, start, alloc)
            if len(found) == layout.tasks:
                return found
        elif len(allocs) < layout.tasks:
            blocked_since = check_placement(job_id, blocked_since)
        state = f"{len(allocs)} allocations placed, {len(running)} running, {len(found)} tasks started generation 1"
        time.sleep(2.0)
    raise TimeoutError(f"{layout.tasks} tasks did not all start generation 1 within {formation_timeout(layout):.0f}s: {state}")


def failure(failed: list[dict]) -> str:
    """Why allocations failed: the one that ended first (the others often only followed the
    job state it recorded), with the end of its stderr, or of its stdout when that is empty."""
    first = min(failed, key=lambda a: max((s.get("FinishedAt") or "" for s in (a.get("TaskStates") or {}).values()), default=""))
    text = task_log(first["ID"], first["TaskGroup"], "stderr") or task_log(first["ID"], first["TaskGroup"], "stdout")
    events = [e.get("DisplayMessage", "") for s in (first.get("TaskStates") or {}).values() for e in s.get("Events", [])]
    return (
        f"{len(failed)} allocation(s) {first['ClientStatus']}; the first, {first['ID'][:8]} "
        f"({'; '.join(events[-3:])}); the job state in Consul: {job_state(first['JobID']) or '(none)'}; it logged "
        f"(Nomad's client removes a failed allocation's logs at once beyond gc_max_allocs, 50):\n{text[-2000:] or '(nothing)'}"
    )


def job_state(job_id: str) -> str:
    """What a failing task recorded for the whole job ("failed: <role>[<i>] ... <why>").

    GET /v1/kv/nomadtf/default/<job>/?recurse, on Consul itself
    """
    resp = requests.get(f"http://{consul_address()}/v1/kv/nomadtf/default/{job_id}/", params={"recurse": "true"}, timeout=10)
    items = resp.json() if resp.status_code == 200 else []
    return "; ".join(
        base64.b64decode(i["Value"]).decode(errors="replace") for i in items if i["Key"].endswith("/cluster/state") and i["Value"]
    )


def check_placement(job_id: str, blocked_since: float | None) -> float | None:
    """Say on stderr as soon as Nomad holds allocations back, and give up when it still does
    after BLOCKED_GRACE_S (capacity another session's job holds may come free meanwhile).
    Returns when the block was first seen, None while nothing is blocked."""
    problem = placement_problem(job_id)
    if not problem:
        return None
    if blocked_since is None:
        print(f"  Nomad cannot place every allocation yet: {problem}", file=sys.stderr, flush=True)
        return time.monotonic()
    if time.monotonic() - blocked_since > BLOCKED_GRACE_S:
        raise RuntimeError(f"Nomad could not place the job for {BLOCKED_GRACE_S:.0f}s: {problem}")
    return blocked_since


def placement_problem(job_id: str) -> str:
    """Why Nomad holds some of the job's allocations back ("" when it does not): a blocked
    evaluation, and which resource the latest failed placement found exhausted on how many nodes.

    GET /v1/job/<job>/evaluations
    """
    evals = sorted(nomad(f"job/{job_id}/evaluations"), key=lambda e: e["CreateIndex"], reverse=True)
    blocked = [e for e in evals if e["Status"] == "blocked"]
    if not blocked:
        return ""
    failures = next((e["FailedTGAllocs"] for e in evals if e.get("FailedTGAllocs")), {})
    why = []
    for group, metric in failures.items():
        exhausted = ", ".join(f"{dim} on {n}" for dim, n in (metric.get("DimensionExhausted") or {}).items()) or "nothing named"
        why.append(
            f"group {group}: {1 + metric.get('CoalescedFailures', 0)} allocations not placed; "
            f"{metric.get('NodesExhausted', 0)} of {metric.get('NodesEvaluated', 0)} nodes exhausted ({exhausted}), "
            f"{metric.get('NodesFiltered', 0)} filtered out"
        )
    return f"evaluation {blocked[0]['ID'][:8]} is blocked; " + ("; ".join(why) or "no failed placement recorded")


def last_task_start(alloc: dict) -> float:
    """When Nomad started the allocation's task: the latest StartedAt of its task states
    (RFC 3339 with nanoseconds, which datetime does not parse: cut to microseconds)."""
    times = []
    for state in (alloc.get("TaskStates") or {}).values():
        match = re.fullmatch(r"(.+T[\d:]+)(?:\.(\d+))?(Z|[+-][\d:]+)", state.get("StartedAt") or "")
        if match and not match.group(1).startswith("0001"):
            text = f"{match.group(1)}.{(match.group(2) or '0')[:6]:0<6}{match.group(3).replace('Z', '+00:00')}"
            times.append(datetime.fromisoformat(text).timestamp())
    return max(times, default=math.nan)


# ---- the steady window ---------------------------------------------------------------------


def measure_window(layout: Layout, job_id: str, proxy: CountingProxy, changes: CheckChanges, window_s: float) -> Result:
    """One window at steady state. It is `disturbed` when Consul was unreachable in it or a
    task had to open a new session (other tests restart the shared Consul)."""
    procs = supervisors(job_id)
    if len(procs) != layout.tasks:
        raise RuntimeError(f"{len(procs)} of {layout.tasks} supervisors found: one restarted")
    before = {key: p.cpu_times() for key, p in procs.items()}
    started = time.monotonic()
    time.sleep(window_s)
    after = {key: p.cpu_times() for key, p in procs.items()}
    ended = time.monotonic()
    per_task = []
    for (role, index), proc in sorted(procs.items()):
        if not proc.is_running():  # also catches a reused pid
            raise RuntimeError(f"{role}[{index}]'s nomadtf task (pid {proc.pid}) exited during the window")
        cpu = (after[(role, index)].user + after[(role, index)].system) - (before[(role, index)].user + before[(role, index)].system)
        rss = proc.memory_info().rss / 2**20
        per_task.append(TaskFigures(proc.pid, role, index, " ".join(proc.cmdline()), cpu, rss, peak_rss_mib(proc)))
    counted = [r for r in proxy.requests if started <= r[0] < ended]
    errors = Counter(text for t, text in proxy.errors if started <= t < ended)
    by_endpoint = Counter(endpoint(m, t, job_id) for _t, m, t in counted)
    disturbed = []
    if errors:
        disturbed.append(", ".join(f"{n}x {text}" for text, n in errors.items()))
    if by_endpoint["PUT /v1/session/create"]:
        disturbed.append(f"{by_endpoint['PUT /v1/session/create']} new sessions (Consul restarted)")
    return Result(
        layout=layout.label,
        strategy=layout.strategy,
        tasks=layout.tasks,
        window_s=ended - started,
        per_task=per_task,
        requests=len(counted),
        by_endpoint=dict(by_endpoint.most_common()),
        check_changes=changes.between(started, ended),
        disturbed="; ".join(disturbed),
    )


# ---- report --------------------------------------------------------------------------------


def print_report(results: list[Result | Failed], window_s: float) -> None:
    measured = [r for r in results if isinstance(r, Result)]
    print_steady(measured, window_s)
    print_formation(measured)
    print_growth({r.tasks: r for r in measured if r.strategy == "multi_worker_mirrored" and r.formation})
    for r in results:
        if isinstance(r, Failed):
            print(f"\n{r.layout} tasks: NOT MEASURED: {r.reason}")
    for r in measured:
        print_endpoints(r)


def print_steady(results: list[Result], window_s: float) -> None:
    cores = psutil.cpu_count()
    print(f"nomadtf task overhead at steady state (probe children sleeping), {window_s:.0f} s window, {cores}-core machine")
    head = (
        f"{'tasks':<9}{'CPU s/min':>10}{'% core mean/max':>18}{'target':>8}{'RSS MiB mean/max':>19}{'target':>9}"
        f"{'peak +child':>13}{'Consul req/task/min':>21}{'req/s (job)':>13}{'checks changed/min':>20}"
    )
    print(head)
    for r in results:
        cpu = f"{_mean(r.cpu_pct):.2f} / {max(r.cpu_pct):.2f}"
        rss = f"{_mean(r.rss):.1f} / {max(r.rss):.1f}"
        print(
            f"{r.layout:<9}{_mean(r.cpu_pct) * 0.6:>10.3f}{cpu:>18}{'< 1':>8}{rss:>19}{'< 60':>9}"
            f"{max(t.peak_mib for t in r.per_task):>13.1f}{r.requests_per_task_min:>21.1f}{r.requests_per_s:>13.2f}"
            f"{r.check_changes / (r.window_s / 60.0):>20.1f}"
            + ("  (not steady state, see below)" if r.disturbed else "")
        )
    print(f"peak +child: the highest VmHWM of a nomadtf task plus its child's, MiB (mirrored layouts ask {PROBE_MEMORY_MB} MB)")
    print("checks changed/min: changes of any check in Consul, other jobs' included (the tasks watch only their own services)")


def print_formation(results: list[Result]) -> None:
    formed = [r for r in results if r.formation]
    if not formed:
        return
    print("\nFormation: seconds after submission (`nomadtf run --detach`); Consul requests up to the last start"
          f" + {FORMATION_TAIL_S} s")
    print(f"{'tasks':<9}{'Nomad started last':>19}{'cluster complete after med/max':>32}{'last gen-1 start':>18}"
          f"{'Consul req':>12}{'req/task':>10}{'checks changed':>16}")
    for r in formed:
        f = r.formation
        complete = f"{statistics.median(f.complete_after_s):.1f} / {max(f.complete_after_s):.1f}"
        print(f"{r.layout:<9}{f.nomad_started_s:>19.1f}{complete:>32}{f.last_start_s:>18.1f}{f.requests:>12}{f.requests / r.tasks:>10.1f}{f.check_changes:>16}"
              + (f"  ({f.notes})" if f.notes else ""))
    print("  cluster complete after: each task's own wait for its peers, from its start to the complete cluster")


GROWTH_FIGURES = (
    # name, figure, whether it is a per-task figure (constant when the total grows linearly)
    ("formation time (last gen-1 start)", lambda r: r.formation.last_start_s, False),
    ("cluster complete after, median", lambda r: statistics.median(r.formation.complete_after_s), False),
    ("formation requests, total", lambda r: r.formation.requests, False),
    ("formation requests per task", lambda r: r.formation.requests / r.tasks, True),
    ("steady requests per task per minute", lambda r: r.requests_per_task_min, True),
    ("steady requests per second (job)", lambda r: r.requests_per_s, False),
)


def print_growth(mirrored_runs: dict[int, Result]) -> None:
    """Ratios between consecutive sizes and the exponent k with which a total grows as N^k
    (a per-task figure that stays constant is k = 1 for its total; N^2 is k = 2)."""
    sizes = sorted(mirrored_runs)
    pairs = list(zip(sizes, sizes[1:], strict=False))
    if not pairs:
        return
    print("\nGrowth (multi_worker_mirrored): ratio, and k of N^k for the job's total (1 linear, 2 quadratic)")
    print(f"{'':<38}" + "".join(f"{f'{b}/{a} tasks':>22}" for a, b in pairs))
    for name, figure, per_task in GROWTH_FIGURES:
        cells = []
        for a, b in pairs:
            ratio = figure(mirrored_runs[b]) / figure(mirrored_runs[a]) if figure(mirrored_runs[a]) else math.inf
            k = math.log(ratio * (b / a if per_task else 1)) / math.log(b / a)
            cells.append(f"{ratio:.2f} (k={k:.2f})")
        print(f"{name:<38}" + "".join(f"{c:>22}" for c in cells))
    for a, b in pairs:
        print_verdict(mirrored_runs[a], mirrored_runs[b])


def growth_exponent(before: float, after: float, n_before: int, n_after: int) -> float:
    return math.log(after / before) / math.log(n_after / n_before) if before and after else math.nan


def verdict(k: float) -> str:
    if k <= 1.25:
        return "linear at worst"
    if k < 1.75:
        return "WORSE than linear"
    return "QUADRATIC"


def print_verdict(a: Result, b: Result) -> None:
    """One line per total: linear or worse, and for formation requests the endpoints whose
    count per task grew the most (the ones every registration makes every task repeat)."""
    k_time = growth_exponent(a.formation.last_start_s, b.formation.last_start_s, a.tasks, b.tasks)
    k_formation = growth_exponent(a.formation.requests, b.formation.requests, a.tasks, b.tasks)
    k_steady = growth_exponent(a.requests, b.requests, a.tasks, b.tasks)
    print(f"{a.tasks} -> {b.tasks} tasks: formation time {verdict(k_time)} (k={k_time:.2f}); "
          f"formation requests {verdict(k_formation)} (k={k_formation:.2f}, per task x{b.formation.requests / b.tasks / (a.formation.requests / a.tasks):.2f}); "
          f"steady requests {verdict(k_steady)} (k={k_steady:.2f}; checks changed/min in Consul "
          f"{a.check_changes / (a.window_s / 60):.0f} -> {b.check_changes / (b.window_s / 60):.0f})")
    if k_formation > 1.25:
        grown = sorted(
            ((b.formation.by_endpoint.get(name, 0) / b.tasks, a.formation.by_endpoint.get(name, 0) / a.tasks, name) for name in b.formation.by_endpoint),
            reverse=True,
        )[:4]
        print("  per task, the formation's largest endpoints " + f"({a.tasks} -> {b.tasks} tasks):")
        for per_b, per_a, name in grown:
            print(f"    {per_a:>7.1f} -> {per_b:>7.1f}  {name}")


def print_endpoints(r: Result) -> None:
    minutes = r.window_s / 60.0
    print(f"\n{r.layout} tasks, Consul requests per task per minute at steady state, by endpoint:")
    for name, count in r.by_endpoint.items():
        print(f"  {count / r.tasks / minutes:>7.2f}  {name}")
    if r.disturbed:
        print(f"  NOT steady state after {WINDOW_ATTEMPTS} windows: {r.disturbed}")
    if r.formation:
        print(f"{r.layout} tasks, Consul requests per task during formation, by endpoint:")
        for name, count in r.formation.by_endpoint.items():
            print(f"  {count / r.tasks:>7.1f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured at steady state")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="multi_worker_mirrored task counts (default: 4,16,64)")
    parser.add_argument("--quick", action="store_true", help="a 20 s window, the 4-task job only")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args()
    window = 20.0 if args.quick else args.window
    sizes = [4] if args.quick else [int(n) for n in args.sizes.split(",")]
    layouts = [mirrored(n) for n in sizes] + ([] if args.quick else [PARAMETER_SERVER])
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        results: list[Result | Failed] = []
        for layout in layouts:
            print(f"measuring {layout.tasks} tasks ({layout.strategy}) ...", file=sys.stderr, flush=True)
            try:
                results.append(measure(layout, window, Path(tmp)))
            except (RuntimeError, TimeoutError, AssertionError) as exc:
                # The other layouts' figures still count; the report says why this one has none.
                print(f"  {layout.tasks} tasks failed: {exc}", file=sys.stderr, flush=True)
                results.append(Failed(layout.label, layout.strategy, layout.tasks, str(exc)))
    print_report(results, window)
    print(f"\n(the whole bench took {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps([r.summary() for r in results], indent=2))


if __name__ == "__main__":
    main()
