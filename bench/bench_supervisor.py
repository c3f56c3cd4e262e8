"""What `nomadtf task` itself costs while training runs: CPU, memory and Consul requests.

For each layout it submits a job of `tests/jobs/probe.py` tasks (the probe prints what it
was given and sleeps, so the training process costs nothing), waits until the cluster has
formed and every child runs, lets it settle, and then measures over a window:

- CPU seconds of each `nomadtf task` process (its own user + system time, not its child's),
  per minute and as % of one core;
- RSS of each `nomadtf task` process at the end of the window;
- every Consul HTTP request the tasks make, counted exactly by a TCP proxy in front of
  Consul that the job's tasks are pointed at (`discovery.consul_address`), broken down by
  endpoint.

The 4- and 16-task layouts are `multi_worker_mirrored`, where every task runs the probe
(16 bare TensorFlow servers would not fit beside the other work on a 2-core machine); the
full run adds a 4-task `parameter_server` job (chief, 2 workers, ps), whose tasks watch three
services instead of one. The targets are printed beside the figures, never asserted.

Needs the local stack: `nomadtf dev up && eval "$(nomadtf dev env)"`, then
`python bench/bench_supervisor.py [--window 60] [--quick] [--json FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil
import requests

from nomadtf import wire
from tests import faults
from tests.helpers import nomadtf, probe_job, purge, unique, wait_until

WINDOW_ATTEMPTS = 3  # a window that a Consul restart disturbed is measured again
SETTLE_S = 10.0  # after every child runs: the debounce (1.5 s) and the last generation writes pass
TARGET_CPU_PCT = 1.0
TARGET_RSS_MIB = 60.0
REQUEST_LINE = re.compile(rb"(GET|PUT|POST|DELETE|HEAD) (\S+) HTTP/1\.[01]")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


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


def mirrored(workers: int) -> Layout:
    return Layout("multi_worker_mirrored", {"worker": {"count": workers, "cpu": 100, "memory": 300}})


# Workers and ps run a bare TensorFlow server: more memory than the probe.
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


def endpoint(method: str, target: str, job_id: str) -> str:
    """A request's endpoint with the job and ids masked: `GET /v1/kv/nomadtf/default/<job>/
    cluster/?index (blocking)`. A query with `index` is a blocking query."""
    parts = urlsplit(target)
    path = UUID.sub("<id>", parts.path.replace(job_id, "<job>"))
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


@dataclass
class Result:
    layout: str
    strategy: str
    tasks: int
    window_s: float
    per_task: list[TaskFigures]
    requests: int
    formation_requests: int
    by_endpoint: dict[str, int]
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

    def summary(self) -> dict:
        return {
            **asdict(self),
            "cpu_pct_mean": _mean(self.cpu_pct),
            "cpu_pct_max": max(self.cpu_pct),
            "cpu_s_per_task_min": _mean(self.cpu_pct) * 0.6,
            "rss_mib_mean": _mean(self.rss),
            "rss_mib_max": max(self.rss),
            "requests_per_task_min": self.requests_per_task_min,
        }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def supervisors(job_id: str) -> dict[tuple[str, int], psutil.Process]:
    """(role, alloc index) -> the job's `nomadtf task` processes (found as tests/faults.py does)."""
    return {(role, index): psutil.Process(pid) for (kind, role, index), pid in faults.processes(job_id).items() if kind == "task"}


def children(job_id: str) -> int:
    return sum(1 for kind, _role, _index in faults.processes(job_id) if kind == "child")


def generation_written(job_id: str) -> bool:
    """Some run of the job has its generation key (the key path carries the run id).

    GET /v1/kv/nomadtf/default/<job>/?keys, on Consul itself (not the proxy)
    """
    prefix = wire.kv_job_prefix(wire.DEFAULT_NAMESPACE, job_id)
    resp = requests.get(f"http://{consul_address()}/v1/kv/{prefix}", params={"keys": "true"}, timeout=10)
    return resp.status_code == 200 and any(key.endswith("/cluster/generation") for key in resp.json())


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
    with CountingProxy(consul_address()) as proxy:
        spec = probe_job(
            job_id,
            layout.strategy,
            # Long enough for formation and the windows; ends by itself if this bench is killed.
            context={"sleep": int(WINDOW_ATTEMPTS * (window_s + SETTLE_S) + 600)},
            roles=layout.roles,
            discovery={"rendezvous_timeout": "5m", "consul_address": f"127.0.0.1:{proxy.port}"},
        )
        path = workdir / f"{job_id}.json"
        path.write_text(json.dumps(spec))
        submit(path)
        try:
            wait_until(
                lambda: len(supervisors(job_id)) == layout.tasks and children(job_id) == layout.tasks and generation_written(job_id),
                300,
                f"{layout.tasks} supervisors with their children running",
                interval=1.0,
            )
            formation = len(proxy.requests)
            for attempt in range(1, WINDOW_ATTEMPTS + 1):
                time.sleep(SETTLE_S)
                result = measure_window(layout, job_id, proxy, window_s)
                result.formation_requests = formation
                if not result.disturbed:
                    break
                print(f"  window {attempt}: {result.disturbed}; measuring again", file=sys.stderr, flush=True)
        finally:
            nomadtf("stop", job_id, "--purge")
            purge(job_id)
            # Keep the proxy up until the tasks are gone, so that they destroy their sessions.
            wait_until(lambda: not faults.processes(job_id), 60, "the job's processes to exit", interval=1.0)
    return result


def measure_window(layout: Layout, job_id: str, proxy: CountingProxy, window_s: float) -> Result:
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
        per_task.append(TaskFigures(proc.pid, role, index, " ".join(proc.cmdline()), cpu, rss))
    counted = [r for r in proxy.requests if started <= r[0] < ended]
    errors = Counter(text for t, text in proxy.errors if started <= t < ended)
    by_endpoint = Counter(endpoint(m, t, job_id) for _t, m, t in counted)
    disturbed = []
    if errors:
        disturbed.append(", ".join(f"{n}x {text}" for text, n in errors.items()))
    if by_endpoint["PUT /v1/session/create"]:
        disturbed.append(f"{by_endpoint['PUT /v1/session/create']} new sessions (Consul restarted)")
    return Result(
        layout.label,
        layout.strategy,
        layout.tasks,
        ended - started,
        per_task,
        len(counted),
        0,
        dict(by_endpoint.most_common()),
        "; ".join(disturbed),
    )


# ---- report --------------------------------------------------------------------------------


def print_report(results: list[Result], window_s: float) -> None:
    cores = psutil.cpu_count()
    print(f"nomadtf task overhead at steady state (probe children sleeping), {window_s:.0f} s window, {cores}-core machine")
    head = f"{'tasks':<9}{'CPU s/min':>10}{'% core mean/max':>18}{'target':>8}{'RSS MiB mean/max':>19}{'target':>9}{'Consul req/task/min':>21}{'formation req/task':>20}"
    print(head)
    for r in results:
        cpu = f"{_mean(r.cpu_pct):.2f} / {max(r.cpu_pct):.2f}"
        rss = f"{_mean(r.rss):.1f} / {max(r.rss):.1f}"
        print(
            f"{r.layout:<9}{_mean(r.cpu_pct) * 0.6:>10.3f}{cpu:>18}{'< 1':>8}{rss:>19}{'< 60':>9}"
            f"{r.requests_per_task_min:>21.1f}{r.formation_requests / r.tasks:>20.1f}"
            + ("  (not steady state, see below)" if r.disturbed else "")
        )
    mirrored_runs = {r.tasks: r for r in results if r.strategy == "multi_worker_mirrored"}
    if 4 in mirrored_runs and 16 in mirrored_runs:
        ratio = mirrored_runs[16].requests_per_task_min / mirrored_runs[4].requests_per_task_min
        print(f"Consul requests per task per minute, 16 tasks / 4 tasks: {ratio:.2f} (target: constant, about 1; N-squared growth would be 4)")
    for r in results:
        minutes = r.window_s / 60.0
        print(f"\n{r.layout} tasks, Consul requests per task per minute by endpoint:")
        for name, count in r.by_endpoint.items():
            print(f"  {count / r.tasks / minutes:>7.2f}  {name}")
        if r.disturbed:
            print(f"  NOT steady state after {WINDOW_ATTEMPTS} windows: {r.disturbed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured at steady state")
    parser.add_argument("--quick", action="store_true", help="a 20 s window, the 4-task job only")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args()
    window = 20.0 if args.quick else args.window
    layouts = [mirrored(4)] if args.quick else [mirrored(4), mirrored(16), PARAMETER_SERVER]
    with tempfile.TemporaryDirectory() as tmp:
        results = []
        for layout in layouts:
            print(f"measuring {layout.tasks} tasks ({layout.strategy}) ...", file=sys.stderr, flush=True)
            results.append(measure(layout, window, Path(tmp)))
    print_report(results, window)
    if args.json:
        args.json.write_text(json.dumps([r.summary() for r in results], indent=2))


if __name__ == "__main__":
    main()
