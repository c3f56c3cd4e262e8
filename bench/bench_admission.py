"""Admission on the local stack: how fast the admission controller admits suspended runs, how
soon it admits the next run once room is released, and what each admission costs it in
requests to Nomad and Consul, with 10, 100 or 1,000 runs waiting (issue 31, item 8).

The stack's deployed controller (Nomad service job `nomadtf-admission`) is purged for the
bench and one Controller runs in this process instead, so its own request counter
(`controller.requests`) and every HTTP request its thread sends can be read; the deployed one is redeployed at the end (`nomadtf admission
deploy --count 2`), whatever happens. The runs are tiny (one group, count 1, raw_exec, 16 MB,
10 MB of disk), registered suspended (suspension.suspend, the way `nomadtf run` registers
them) round-robin in 20 namespaces created for the bench, by 4 threads. Room is held by plain
Nomad batch jobs nomadtf did not start, whose one task waits on a FIFO: writing to it ends
the task, as a job that finishes gives its room back (`--release stop` or `purge` ends them
with `DELETE /v1/job/:id` instead).

For each queue length Q (`--queued`), each round (`--rounds`):

1. **One at a time.** A blocker holds the node's CPU but for `--releases` slots, each held by
   a slot job of exactly one run's CPU (20 MHz), and less than one run's CPU free; Q +
   releases runs (`sleep`, so an admitted run keeps its room) are queued, so at least Q wait
   at every release. One slot at a time is released; latency = release -> the controller's
   "admitted" event for the next run (its own on_event timestamp, taken once both scale
   calls returned); the admitted run is checked to be the head of the queue, and is left to
   be placed before the next release.
2. **Burst.** Q runs (`/bin/true`, CPU shrunk so that all Q fit at once: 20 MHz up to 100
   runs on the stack's node, 5 MHz for 1,000) are queued behind a blocker holding all but
   half a run's CPU; the blocker is released; admissions/s = Q / (release -> the last
   "admitted" event).

Requests per admission = `controller.requests` delta / admissions, over each window (for a
burst: from the release until every admitted run was placed); the endpoint table splits the
controller thread's HTTP requests the same way, with the KB they moved (both ways) and the ms
they took; KB/adm is what they moved in all. Step ms is the controller's step (read, decide,
act, publish) time, median over the window. `--release purge` shows what a purged holder
costs: the controller's blocking query is on the job list, which a purged job's allocation
stopping does not change.
p50 / p99 are nearest rank over every release of every round; admissions/s is the median
of the rounds. Targets from the issue are printed beside the figures, never asserted.

Needs the local single-node stack without ACLs: `nomadtf dev up && eval "$(nomadtf dev env)"`,
then `PYTHONPATH=$PWD python bench/bench_admission.py [--queued 10,100,1000] [--rounds 1]
[--releases 20] [--release exit|stop|purge]`. At 1,000 it registers and purges ~2,000 jobs:
count minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
import requests.adapters

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nomadtf import wire  # noqa: E402
from nomadtf.admission import fit, suspension  # noqa: E402
from nomadtf.admission.board import MAX_LINES  # noqa: E402
from nomadtf.admission.controller import Controller  # noqa: E402
from nomadtf.client.queued import read_board  # noqa: E402
from nomadtf.servers.consulhttp import consul_client  # noqa: E402
from nomadtf.servers.nomad import NomadAPI  # noqa: E402
from nomadtf.servers.nomadhttp import NomadSettings  # noqa: E402

NOMADTF = str(Path(sys.executable).parent / "nomadtf")
NOMAD = NomadSettings.from_env().address
NAMESPACES = [f"bench-admission-{i:02d}" for i in range(20)]
CONTROLLER_THREAD = "bench-admission-controller"
NAME = f"bench {socket.gethostname()} pid {os.getpid()}"
RUN_CPU, RUN_MEMORY, RUN_DISK = 20, 16, 10  # MHz, MB, MB
LOGS = {"MaxFiles": 1, "MaxFileSizeMB": 1}  # under the 10 MB disk (Nomad's default logs want 100 MB)
GANG_TIMEOUT_S = 600  # the most suspension allows: an admitted run is never given back here
# The controller's event line for an admission: "<ns>/<job> run <id>: admitted after ..."
# (earlier controllers: "admitted <ns>/<job> run <id> after ...").
ADMITTED = (re.compile(r"^([^/\s]+)/(\S+) run \S+: admitted\b"), re.compile(r"^admitted ([^/\s]+)/(\S+) run "))
ENDPOINTS = ("jobs list", "job read", "scale", "nodes", "allocations", "lead", "board", "admitted", "other")
TARGETS = "targets (issue 31): >= 10 admissions/s, release -> admission p99 < 1 s, requests per admission flat in Q"

HTTP = threading.local()


def http() -> requests.Session:
    """One session per thread (the registering pool's threads too)."""
    if not hasattr(HTTP, "session"):
        HTTP.session = requests.Session()
    return HTTP.session


def nomad(method: str, path: str, **kwargs: Any) -> Any:
    resp = http().request(method, f"{NOMAD}/v1/{path}", timeout=30, **kwargs)
    if not resp.ok:
        raise SystemExit(f"{method.upper()} /v1/{path}: {resp.status_code} {resp.text.strip()[:500]}")
    return resp.json() if resp.content else None


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def percentile(values: list[float], pct: float) -> float:
    """Nearest rank. Pure."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


# ---- what the controller's thread sends ------------------------------------------------------


def endpoint(path: str) -> str:
    if path == "/v1/jobs":
        return "jobs list"
    if path.startswith("/v1/job/"):
        return "scale" if path.endswith("/scale") else "job read"
    if path.startswith("/v1/nodes"):
        return "nodes"
    if path.startswith("/v1/allocations"):
        return "allocations"
    if path.startswith(f"/v1/kv/{wire.KV_ADMISSION_LEADER}"):
        return "lead"
    if path.startswith(f"/v1/kv/{wire.KV_ADMISSION_BOARD}"):
        return "board"
    if path.startswith(f"/v1/kv/{wire.KV_ADMISSION_ADMITTED}"):
        return "admitted"
    return "other"


class Traffic:
    """Every HTTP request the controller's thread sends, by endpoint: how many, the bytes moved
    both ways (the request body and the response body) and the seconds they took (a blocking
    query's wait included)."""

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.bytes: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        original = requests.adapters.HTTPAdapter.send
        traffic = self

        def send(adapter: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            resp = original(adapter, request, *args, **kwargs)
            if threading.current_thread().name == CONTROLLER_THREAD:
                took = time.perf_counter() - started
                body = request.body or b""
                size = len(body) + (0 if kwargs.get("stream") else len(resp.content))
                kind = endpoint(urlsplit(request.url).path)
                with traffic.lock:
                    traffic.requests[kind] += 1
                    traffic.bytes[kind] += size
                    traffic.seconds[kind] += took
            return resp

        requests.adapters.HTTPAdapter.send = send

    def snapshot(self) -> tuple[collections.Counter[str], ...]:
        with self.lock:
            return collections.Counter(self.requests), collections.Counter(self.bytes), collections.Counter(self.seconds)


# ---- the controller in this process ------------------------------------------------------------


class InProcess:
    """The deployed controller purged, ours leading; `close` gives the stack its own back."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str]] = []
        self.admitted: dict[tuple[str, str], float] = {}
        self.steps: list[tuple[float, float]] = []  # (when it ended, seconds)
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.controller = Controller(NomadAPI.from_env(namespace="*"), consul_client(), NAME, on_event=self._event)
        step = self.controller.step

        def timed(*args: Any, **kwargs: Any) -> None:
            started = time.perf_counter()
            try:
                step(*args, **kwargs)
            finally:
                self.steps.append((time.time(), time.perf_counter() - started))

        self.controller.step = timed  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.controller.serve, args=(self.stop,), name=CONTROLLER_THREAD, daemon=True)

    def _event(self, line: str) -> None:
        now = time.time()
        with self.changed:
            self.events.append((now, line))
            match = ADMITTED[0].match(line) or ADMITTED[1].match(line)
            if match:
                self.admitted[(match[1], match[2])] = now
            self.changed.notify_all()

    def start(self) -> None:
        nomad("delete", f"job/{wire.ADMISSION_SERVICE_JOB}", params={"purge": "true", "namespace": wire.DEFAULT_NAMESPACE})
        wait_until(lambda: not deployed_leader(), 90, "the deployed controller to hand the lead on", interval=1.0)
        self.thread.start()
        wait_until(lambda: any(line == f"{NAME} leads admission" for _, line in self.events), 90, "this process's controller to lead")

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=60)

    def wait_admitted(self, keys: Iterable[tuple[str, str]], after: float, timeout: float) -> dict[tuple[str, str], float]:
        """Until every one of `keys` was admitted after `after` (or `timeout`): those that were."""
        wanted = set(keys)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                done = {k: t for k, t in self.admitted.items() if k in wanted and t >= after}
                left = deadline - time.monotonic()
                if len(done) == len(wanted) or left <= 0:
                    return done
                self.changed.wait(min(left, 1.0))

    def next_admitted(self, after: float, mine: set[tuple[str, str]], timeout: float) -> tuple[tuple[str, str], float] | None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                done = sorted((t, k) for k, t in self.admitted.items() if k in mine and t >= after)
                if done:
                    return done[0][1], done[0][0]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(min(left, 1.0))

    def settled(self, keys: Iterable[tuple[str, str]]) -> bool:
        """None of `keys` is admitted and still being placed. Someone else's run in flight
        (another test's, on a shared stack) may wait out its gang timeout: not ours to wait on."""
        return not any(key in self.controller.in_flight for key in keys)

    def step_ms(self, start: float, end: float) -> float:
        inside = [s * 1000 for t, s in list(self.steps) if start <= t <= end]
        return statistics.median(inside) if inside else float("nan")


def deployed_leader() -> str:
    out = subprocess.run([NOMADTF, "admission", "status"], capture_output=True, text=True, timeout=60)
    match = re.search(r"^leader: (.*)$", out.stdout, re.M)
    return "" if match is None or match[1].startswith("none") else match[1]


def redeploy() -> None:
    out = subprocess.run([NOMADTF, "admission", "deploy", "--count", "2"], capture_output=True, text=True, timeout=180)
    if out.returncode:
        print(f"could not redeploy the stack's controller: {out.stderr.strip()}", file=sys.stderr)
        return
    wait_until(lambda: (leader := deployed_leader()) and leader != NAME, 120, "the redeployed controller to lead", interval=1.0)


# ---- jobs -------------------------------------------------------------------------------------


def tiny_run(job_id: str, namespace: str, cpu: int, memory: int, command: list[str]) -> dict[str, Any]:
    """A one-group, count-1 raw_exec run, suspended as `nomadtf run` registers one."""
    task = {"Name": "run", "Driver": "raw_exec", "Config": {"command": command[0], "args": command[1:]},
            "Resources": {"CPU": cpu, "MemoryMB": memory}, "LogConfig": LOGS}  # fmt: skip
    group = {"Name": "run", "Count": 1, "Tasks": [task], "EphemeralDisk": {"SizeMB": RUN_DISK},
             "RestartPolicy": {"Attempts": 0, "Mode": "fail"}, "ReschedulePolicy": {"Attempts": 0, "Unlimited": False}}  # fmt: skip
    body = {"Job": {"ID": job_id, "Namespace": namespace, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [group],
                    "Meta": {wire.META_VERSION: "bench", wire.META_RUN: uuid.uuid4().hex[:8]}}}  # fmt: skip
    return suspension.suspend(body, gang_timeout_s=GANG_TIMEOUT_S)


@dataclass
class Holder:
    """A plain batch job (nomadtf did not start it) whose one task holds `cpu` until its FIFO
    is written to."""

    job_id: str
    cpu: int
    fifo: Path

    def body(self) -> dict[str, Any]:
        task = {"Name": "hold", "Driver": "raw_exec", "Config": {"command": "/bin/sh", "args": ["-c", f"read line < {self.fifo}"]},
                "Resources": {"CPU": self.cpu, "MemoryMB": RUN_MEMORY}, "LogConfig": LOGS}  # fmt: skip
        group = {"Name": "hold", "Count": 1, "Tasks": [task], "EphemeralDisk": {"SizeMB": RUN_DISK},
                 "RestartPolicy": {"Attempts": 0, "Mode": "fail"}, "ReschedulePolicy": {"Attempts": 0, "Unlimited": False}}  # fmt: skip
        return {"Job": {"ID": self.job_id, "Namespace": wire.DEFAULT_NAMESPACE, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [group]}}

    def release(self, how: str) -> float:
        """End it; when that began (time.time())."""
        if how != "exit":
            started = time.time()
            nomad("delete", f"job/{self.job_id}", params={"purge": str(how == "purge").lower()})
            return started
        deadline = time.monotonic() + 10
        while True:
            try:
                started = time.time()
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until the task opened it
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{self.job_id}'s task never opened {self.fifo}") from None
                time.sleep(0.05)
                continue
            os.write(fd, b"go\n")
            os.close(fd)
            return started


def holders(folder: Path, tag: str, cpus: dict[str, int]) -> list[Holder]:
    """Register and wait until each runs."""
    made = []
    for name, cpu in cpus.items():
        fifo = folder / f"{tag}-{name}"
        os.mkfifo(fifo)
        made.append(Holder(f"bench-admission-{tag}-{name}", cpu, fifo))
    for holder in made:
        nomad("post", "jobs", json=holder.body())

    def running() -> bool:
        for holder in made:
            allocs = nomad("get", f"job/{holder.job_id}/allocations")
            if not any(a["ClientStatus"] == "running" for a in allocs):
                return False
        return True

    wait_until(running, 120, "the blockers to run", interval=0.5)
    return made


def register(bodies: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """POST /v1/jobs each (4 threads); (namespace, job) -> the JobModifyIndex it was registered at."""

    def one(body: dict[str, Any]) -> tuple[tuple[str, str], int]:
        job = body["Job"]
        reply = nomad("post", "jobs", params={"namespace": job["Namespace"]}, json=body)
        return (job["Namespace"], job["ID"]), int(reply["JobModifyIndex"])

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, bodies))


def purge_all(keys: Iterable[tuple[str, str]]) -> None:
    def one(key: tuple[str, str]) -> None:
        try:
            http().delete(f"{NOMAD}/v1/job/{key[1]}", params={"purge": "true", "namespace": key[0]}, timeout=30)
        except requests.RequestException as exc:
            print(f"could not purge {key[0]}/{key[1]}: {exc}", file=sys.stderr)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, list(keys)))


def free_room(api: NomadAPI) -> tuple[int, int]:
    """(MHz, MB) the one usable node has free, as the controller reckons it."""
    rooms = [r for r in fit.node_rooms(api.nodes(), api.cluster_allocations()[0]) if r.usable]
    if len(rooms) != 1:
        raise SystemExit(f"this bench needs the single-node local stack; {len(rooms)} usable nodes")
    return rooms[0].cpu, rooms[0].memory


def queued_runs(q: int, tag: str, cpu: int, memory: int, command: list[str]) -> list[dict[str, Any]]:
    return [tiny_run(f"bench-admission-{tag}-{i:04d}", NAMESPACES[i % len(NAMESPACES)], cpu, memory, command) for i in range(q)]


def others(ctl: InProcess, mine: Iterable[tuple[str, str]]) -> int:
    """Suspended runs the controller sees that are not the bench's (someone else's work on
    the stack: it shares the controller's time and may stand ahead in the queue)."""
    return len(set(ctl.controller.seen) - set(mine))


def wait_queued(ctl: InProcess, keys: Iterable[tuple[str, str]]) -> int:
    """Until the controller has read every run, put it on its board and admitted none; the
    board's size in bytes."""
    keys = list(keys)
    wait_until(lambda: all(k in ctl.controller.seen and ctl.controller.seen[k].job for k in keys), 120 + len(keys) / 5,
               "the controller to read every queued run", interval=0.5)  # fmt: skip
    tickets = {wire.queue_ticket(ns, job, ctl.controller.seen[(ns, job)].job.run_id) for ns, job in keys}  # type: ignore[union-attr]
    consul = consul_client()

    def on_board() -> int:
        _, item = consul.kv.get(wire.KV_ADMISSION_BOARD)
        raw = (item or {}).get("Value") or b"{}"
        board = json.loads(raw)
        listed = {line.get("ticket") for line in board.get("lines") or []}
        # The board lists the first MAX_LINES runs and counts the rest.
        shown = tickets <= listed or (len(listed) >= MAX_LINES and int(board.get("length") or 0) >= len(tickets))
        return len(raw) if shown and ctl.settled(keys) else 0

    try:
        return wait_until(on_board, 120, "every queued run on the board", interval=0.5)
    except SystemExit as exc:
        _, item = consul.kv.get(wire.KV_ADMISSION_BOARD)
        board = json.loads((item or {}).get("Value") or b"{}")
        listed = {line.get("ticket") for line in board.get("lines") or []}
        flying = sorted(f"{ns}/{job}" for ns, job in ctl.controller.in_flight)
        raise SystemExit(f"{exc}: {len(tickets - listed)} of {len(tickets)} not listed, board of {len(listed)} lines; "
                         f"in flight: {', '.join(flying) or 'none'}") from None  # fmt: skip


def clean_up(ctl: InProcess, keys: list[tuple[str, str]]) -> None:
    """Purge `keys`; wait until the controller forgot them and none of their allocations
    holds room any more."""
    purge_all(keys)
    api, mine = NomadAPI.from_env(), set(keys)

    def freed() -> bool:
        allocs = api.cluster_allocations()[0]
        return not any(a.key in mine and a.holds_resources for a in allocs)

    try:
        wait_until(lambda: not any(k in ctl.controller.seen for k in keys), 120 + len(keys) / 5, "the controller to forget the purged runs", interval=0.5)
        wait_until(freed, 120 + len(keys) / 5, "the purged jobs' allocations to stop", interval=1.0)
    except SystemExit as exc:
        print(f"  ({exc}; going on)", file=sys.stderr)


# ---- the two measurements ---------------------------------------------------------------------


@dataclass
class Window:
    """What the controller spent over one measured window."""

    admissions: int = 0
    requests: int = 0
    http: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: collections.Counter[str] = field(default_factory=collections.Counter)
    step_ms: list[float] = field(default_factory=list)

    def add(self, admissions: int, requests_: int, before: tuple[collections.Counter, ...], after: tuple[collections.Counter, ...],
            step_ms: float) -> None:  # fmt: skip
        self.admissions += admissions
        self.requests += requests_
        self.http += after[0] - before[0]
        self.bytes += after[1] - before[1]
        self.seconds += after[2] - before[2]
        self.step_ms.append(step_ms)

    def per_admission(self) -> float:
        return self.requests / self.admissions if self.admissions else float("nan")

    def kb_per_admission(self) -> float:
        return sum(self.bytes.values()) / 1024 / self.admissions if self.admissions else float("nan")


@dataclass
class Figures:
    queued: int
    burst_cpu: int = 0
    rates: list[float] = field(default_factory=list)
    firsts: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    out_of_order: int = 0
    missed: int = 0
    extra: int = 0
    others: int = 0  # runs not the bench's that the controller saw suspended while it measured
    board_kb: float = 0.0
    one: Window = field(default_factory=Window)
    burst: Window = field(default_factory=Window)


def published_head(tickets: dict[str, tuple[str, str]], seen: set[tuple[str, str]]) -> tuple[str, str] | None:
    """The first of the bench's runs on the board, once the board no longer lists one already
    admitted (it is published at most once a second)."""

    def head() -> tuple[str, str] | None:
        lines = sorted((line for line in read_board().lines if line.ticket in tickets), key=lambda line: line.place)
        if any(tickets[line.ticket] in seen for line in lines):
            return None
        return tickets[lines[0].ticket] if lines else None

    try:
        return wait_until(head, 10, "the board to show the next head", interval=0.2)
    except SystemExit:
        return None


def one_at_a_time(ctl: InProcess, traffic: Traffic, figures: Figures, releases: int, how: str, folder: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    api = NomadAPI.from_env()
    free_cpu, _ = free_room(api)
    blocker_cpu = free_cpu - releases * RUN_CPU - RUN_CPU // 2
    held: list[Holder] = []
    keys: list[tuple[str, str]] = []
    try:
        held = holders(folder, tag, {"blocker": blocker_cpu, **{f"slot-{i:02d}": RUN_CPU for i in range(releases)}})
        slots = held[1:]
        bodies = queued_runs(figures.queued + releases, tag, RUN_CPU, RUN_MEMORY, ["/bin/sleep", "3600"])
        indexes = register(bodies)
        keys = list(indexes)
        figures.board_kb = max(figures.board_kb, wait_queued(ctl, keys) / 1024)
        mine = set(keys)
        tickets = {wire.queue_ticket(ns, job, ctl.controller.seen[(ns, job)].job.run_id): (ns, job) for ns, job in keys}  # type: ignore[union-attr]
        requests0, traffic0, start = ctl.controller.requests, traffic.snapshot(), time.time()
        seen: set[tuple[str, str]] = set()
        for slot in slots:
            # The head of the line as the controller published it (its fair order moves as
            # namespaces are admitted): the run the release must admit.
            head = published_head(tickets, seen)
            released = slot.release(how)
            got = ctl.next_admitted(released, mine - seen, timeout=30)
            if got is None:
                figures.missed += 1
                continue
            key, when = got
            figures.latencies.append(when - released)
            figures.out_of_order += key != head
            seen.add(key)
            wait_until(lambda: ctl.settled(mine), 60, f"{key[0]}/{key[1]} to be placed")
            time.sleep(0.2)
        end = time.time()
        figures.others = max(figures.others, others(ctl, keys))
        admitted = sum(1 for k, t in list(ctl.admitted.items()) if k in mine and t >= start)
        figures.extra += admitted - len(seen)
        figures.one.add(admitted, ctl.controller.requests - requests0, traffic0, traffic.snapshot(), ctl.step_ms(start, end))
    finally:
        clean_up(ctl, [(wire.DEFAULT_NAMESPACE, h.job_id) for h in held] + keys)


def burst(ctl: InProcess, traffic: Traffic, figures: Figures, how: str, folder: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    q = figures.queued
    api = NomadAPI.from_env()
    free_cpu, free_memory = free_room(api)
    cpu = min(RUN_CPU, (free_cpu - 20) // q)
    memory = min(RUN_MEMORY, (free_memory - 256) // q)
    if cpu < 1 or memory < 10:
        raise SystemExit(f"{q} runs of 1 MHz and 10 MB do not fit the node at once ({free_cpu} MHz, {free_memory} MB free)")
    figures.burst_cpu = cpu
    held: list[Holder] = []
    keys: list[tuple[str, str]] = []
    try:
        held = holders(folder, tag, {"blocker": free_cpu - cpu // 2})
        indexes = register(queued_runs(q, tag, cpu, memory, ["/bin/true"]))
        keys = list(indexes)
        figures.board_kb = max(figures.board_kb, wait_queued(ctl, keys) / 1024)
        requests0, traffic0 = ctl.controller.requests, traffic.snapshot()
        released = held[0].release(how)
        done = ctl.wait_admitted(keys, released, timeout=max(120.0, q * 0.5))
        if len(done) < q:
            figures.missed += q - len(done)
        if done:
            figures.rates.append(len(done) / (max(done.values()) - released))
            figures.firsts.append(min(done.values()) - released)
        wait_until(lambda: ctl.settled(keys), 300, "every admitted run to be placed", interval=0.5)
        end = time.time()
        figures.others = max(figures.others, others(ctl, keys))
        figures.burst.add(len(done), ctl.controller.requests - requests0, traffic0, traffic.snapshot(), ctl.step_ms(released, end))
    finally:
        clean_up(ctl, [(wire.DEFAULT_NAMESPACE, h.job_id) for h in held] + keys)


# ---- the report -------------------------------------------------------------------------------


def report(all_figures: list[Figures], args: argparse.Namespace) -> None:
    nan = float("nan")
    print()
    print(f"admission on the local stack: {args.rounds} round(s) per queue length, {args.releases} releases a round, "
          f"release by {args.release}; runs of {RUN_CPU} MHz (burst: as shown), {RUN_MEMORY} MB, in {len(NAMESPACES)} namespaces")  # fmt: skip
    print(TARGETS)
    print(f"{'queued':<8}{'burst MHz':>10}{'admissions/s':>14}{'first (s)':>11}{'latency p50 (s)':>17}{'p99 (s)':>9}"
          f"{'req/adm burst':>15}{'req/adm one':>13}{'KB/adm burst':>14}{'KB/adm one':>12}{'step ms burst':>15}{'step ms one':>13}")  # fmt: skip
    for f in all_figures:
        rate = statistics.median(f.rates) if f.rates else nan
        first = statistics.median(f.firsts) if f.firsts else nan
        steps_burst = statistics.median(f.burst.step_ms) if f.burst.step_ms else nan
        steps_one = statistics.median(f.one.step_ms) if f.one.step_ms else nan
        print(f"{f.queued:<8}{f.burst_cpu:>10}{rate:>14.1f}{first:>11.2f}{percentile(f.latencies, 50):>17.3f}{percentile(f.latencies, 99):>9.3f}"
              f"{f.burst.per_admission():>15.2f}{f.one.per_admission():>13.2f}{f.burst.kb_per_admission():>14.1f}{f.one.kb_per_admission():>12.1f}"
              f"{steps_burst:>15.1f}{steps_one:>13.1f}")  # fmt: skip
    print()
    print("per admission, by endpoint: the controller thread's HTTP requests (KB they moved, ms they took; a blocking query's wait included)")
    print(f"{'queued / window':<16}" + "".join(f"{name:>23}" for name in ENDPOINTS))
    for f in all_figures:
        for label, window in (("burst", f.burst), ("one", f.one)):
            n = window.admissions or 1
            cells = "".join(f"{f'{window.http[e] / n:.2f} ({window.bytes[e] / 1024 / n:.1f}, {window.seconds[e] * 1000 / n:.0f})':>23}" for e in ENDPOINTS)
            print(f"{f'{f.queued} {label}':<16}{cells}")
    print()
    for f in all_figures:
        print(f"{f.queued} queued: {len(f.latencies)} releases timed, {f.missed} admissions missed, {f.out_of_order} out of order, "
              f"{f.extra} admitted beside the one released for; board {f.board_kb:.0f} KB at its longest; "
              f"{f.others} suspended runs of others seen")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", default="10,100,1000", help="queue lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--releases", type=int, default=20, help="slots released one at a time, a round")
    parser.add_argument("--release", choices=("exit", "stop", "purge"), default="exit",
                        help="how a holder gives its room back: its task ends (default), DELETE /v1/job/:id, or with ?purge=true")  # fmt: skip
    args = parser.parse_args()
    traffic = Traffic()
    ctl = InProcess()
    results: list[Figures] = []
    made: list[str] = []
    try:
        for namespace in NAMESPACES:
            nomad("post", "namespace", json={"Name": namespace, "Description": "bench/bench_admission.py"})
            made.append(namespace)
        print(f"taking the lead from the deployed {wire.ADMISSION_SERVICE_JOB} ...", file=sys.stderr, flush=True)
        ctl.start()
        with tempfile.TemporaryDirectory(prefix="bench-admission-") as tmp:
            for q in [int(c) for c in args.queued.split(",") if c]:
                figures = Figures(q)
                for number in range(1, args.rounds + 1):
                    print(f"{q} queued, round {number}: one at a time ...", file=sys.stderr, flush=True)
                    one_at_a_time(ctl, traffic, figures, args.releases, args.release, Path(tmp))
                    print(f"{q} queued, round {number}: burst ...", file=sys.stderr, flush=True)
                    burst(ctl, traffic, figures, args.release, Path(tmp))
                results.append(figures)
    finally:
        ctl.close()
        for namespace in made:
            for _ in range(20):
                resp = http().delete(f"{NOMAD}/v1/namespace/{namespace}", timeout=30)
                if resp.ok:
                    break
                time.sleep(1)
            else:
                print(f"could not delete namespace {namespace}: {resp.text.strip()}", file=sys.stderr)
        print(f"redeploying {wire.ADMISSION_SERVICE_JOB} ...", file=sys.stderr, flush=True)
        redeploy()
    lost = [line for _, line in ctl.events if "lost the lead" in line or line.startswith(f"{NAME}:")]
    if lost:
        print(f"the in-process controller said: {'; '.join(lost[:5])}", file=sys.stderr)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
