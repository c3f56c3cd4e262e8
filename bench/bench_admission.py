"""Admission on the local stack: how soon a queued run gets the capacity a job gives back,
and what a queue of waiting runs costs Consul and Nomad.

1. **Capacity released.** A job holding 65 % of the cluster's CPU ends — it finishes, fails,
   is stopped (`nomadtf stop`) or passes its `recovery.deadline` — while a second 65 % run
   waits in the queue (`nomadtf run --detach`, which returns once admitted). From Nomad's
   own records: how long the first job took to free all of its allocations (first to last
   terminal), and from the last one freed to the waiting run's registration and to its
   allocations' creation.
2. **A queue's cost.** 1, 5 and 20 runs wait in-process behind a running job for a window;
   every HTTP request they make is counted (Consul: queue queries and session renewals
   apart; Nomad), per run per minute, and for the head (the one run that watches capacity)
   apart from the others. A queued run blocks on one KV prefix: nothing polls.

Prints the figures (medians over --rounds); judges nothing.

Needs the local stack: `nomadtf dev up && eval "$(nomadtf dev env)"`, then
`PYTHONPATH=$PWD python bench/bench_admission.py [--rounds 1] [--window 60] [--queued 1,5,20]`.
"""

from __future__ import annotations

import argparse
import calendar
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import requests
import requests.adapters

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nomadtf import capacity, wire  # noqa: E402
from nomadtf.admission import Admission  # noqa: E402
from nomadtf.errors import JobStopped  # noqa: E402
from nomadtf.run import Run  # noqa: E402

NOMADTF = str(Path(sys.executable).parent / "nomadtf")
PROBE_DIR = REPO / "tests" / "jobs"
NOMAD = os.environ.get("NOMAD_ADDR", "http://127.0.0.1:4646")
CONSUL = "http://" + os.environ.get("CONSUL_HTTP_ADDR", "127.0.0.1:8500").removeprefix("http://")
CASES = ("finished", "failed", "stopped", "timed_out")


def nomad(path: str, **params):
    resp = requests.get(f"{NOMAD}/v1/{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()


def cluster_cpu() -> int:
    nodes = capacity.node_capacities(nomad("nodes", resources="true"), {"Datacenters": ["*"]})
    return capacity.cluster_capacity(nodes).cpu


def share_job(name: str, share: float, context: dict, **extra) -> dict:
    """A probe job (tests/jobs/probe.py) whose three tasks ask `share` of the CPU in all."""
    cpu = cluster_cpu()
    roles = {"chief": share - 0.2, "worker": 0.1, "ps": 0.1}
    return {
        "name": name,
        "entrypoint": {"script": "probe.py", "workdir": str(PROBE_DIR)},
        "context": context,
        "roles": {role: {"count": 1, "cpu": int(cpu * part), "memory": 256} for role, part in roles.items()},
        "recovery": {"restart_attempts": 0, "reschedule_attempts": 0, **extra.pop("recovery", {})},
        **extra,
    }


def write(folder: Path, spec: dict) -> Path:
    path = folder / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    return path


def queue_length() -> int:
    resp = requests.get(f"{CONSUL}/v1/kv/{wire.KV_QUEUE_PREFIX}", params={"keys": "true"}, timeout=10)
    return 0 if resp.status_code == 404 else len(resp.json())


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def purge(job_id: str) -> None:
    requests.delete(f"{NOMAD}/v1/job/{job_id}", params={"purge": "true"}, timeout=10)


def running(job_id: str) -> bool:
    return sum(a["ClientStatus"] == "running" for a in nomad(f"job/{job_id}/allocations")) == 3


# ---- 1. capacity released ----------------------------------------------------------------


def finished_ns(alloc: dict) -> int:
    """When the allocation's last task ended (its TaskStates' FinishedAt), in ns since the
    epoch: the moment its resources went back (ModifyTime moves on with later updates)."""
    ends = []
    for state in (alloc.get("TaskStates") or {}).values():
        stamp = state.get("FinishedAt") or ""
        if stamp and not stamp.startswith("0001"):
            whole, _, fraction = stamp.rstrip("Z").partition(".")
            seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
            ends.append(seconds * 10**9 + int((fraction + "000000000")[:9]))
    return max(ends, default=alloc["ModifyTime"])


def release_round(case: str, folder: Path) -> dict[str, float]:
    """One blocker that ends by `case`, one run waiting behind it; seconds, from Nomad's times."""
    tag = uuid.uuid4().hex[:6]
    blocker, waiter = f"bench-hold-{tag}", f"bench-next-{tag}"
    context = {"finished": {"sleep": 6}, "failed": {"sleep": 6, "exit": 1}, "stopped": {"sleep": -1}, "timed_out": {"sleep": -1}}[case]
    extra = {"recovery": {"deadline": "8s"}} if case == "timed_out" else {}
    try:
        out = subprocess.run([NOMADTF, "run", str(write(folder, share_job(blocker, 0.65, context, **extra))), "--detach"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        if out.returncode:
            raise SystemExit(out.stderr)
        wait_until(lambda: running(blocker), 60, "the blocker to run")
        before = queue_length()
        follower = subprocess.Popen([NOMADTF, "run", str(write(folder, share_job(waiter, 0.65, {"sleep": 0}))), "--detach"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        wait_until(lambda: queue_length() > before, 60, "the second run to queue")
        if case == "stopped":
            subprocess.run([NOMADTF, "stop", blocker], capture_output=True, timeout=60)
        _, err = follower.communicate(timeout=180)
        if follower.returncode:
            raise SystemExit(err)
        ended = [finished_ns(a) for a in nomad(f"job/{blocker}/allocations")]
        registered = nomad(f"job/{waiter}")["SubmitTime"]
        wait_until(lambda: len(nomad(f"job/{waiter}/allocations")) == 3, 30, "the second run's allocations")
        created = min(a["CreateTime"] for a in nomad(f"job/{waiter}/allocations"))
        return {
            "freed (first to last allocation)": (max(ended) - min(ended)) / 1e9,
            "freed -> next registered": (registered - max(ended)) / 1e9,
            "freed -> next placed": (created - max(ended)) / 1e9,
        }
    finally:
        purge(blocker)
        purge(waiter)


# ---- 2. a queue's cost --------------------------------------------------------------------


class RequestCounter:
    """Counts every HTTP request of this process by thread and by server."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.lock = threading.Lock()
        self.nomad_port = urlsplit(NOMAD).port
        original = requests.adapters.HTTPAdapter.send
        counter = self

        def send(adapter, request, *args, **kwargs):
            url = urlsplit(request.url)
            kind = "nomad" if url.port == counter.nomad_port else "renew" if "/v1/session/renew" in url.path else "consul"
            with counter.lock:
                counter.counts[(threading.current_thread().name, kind)] += 1
            return original(adapter, request, *args, **kwargs)

        requests.adapters.HTTPAdapter.send = send

    def snapshot(self) -> collections.Counter[tuple[str, str]]:
        with self.lock:
            return collections.Counter(self.counts)


def queue_cost(count: int, window_s: float, folder: Path, counter: RequestCounter) -> dict[str, float]:
    """`count` runs wait behind a running job for `window_s`: requests per run per minute."""
    tag = uuid.uuid4().hex[:6]
    blocker = f"bench-hold-{tag}"
    names = [f"bench-wait-{tag}-{i}" for i in range(count)]
    errors: list[BaseException] = []
    out = subprocess.run([NOMADTF, "run", str(write(folder, share_job(blocker, 0.65, {"sleep": -1}))), "--detach"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    if out.returncode:
        raise SystemExit(out.stderr)
    try:
        wait_until(lambda: running(blocker), 60, "the blocker to run")
        before = queue_length()

        def wait_in_queue(path: Path) -> None:
            run = Run.from_job_file(path, [])
            try:
                run.submit(admission=Admission(run.api))
            except JobStopped:
                pass  # removed from the queue at the end of the window: what we expect
            except BaseException as exc:  # noqa: BLE001 - reported after the window
                errors.append(exc)

        threads = []
        for i, name in enumerate(names):
            thread = threading.Thread(target=wait_in_queue, args=(write(folder, share_job(name, 0.65, {"sleep": 0})),), name=f"waiter-{i}")
            thread.start()
            threads.append(thread)
            wait_until(lambda i=i: queue_length() >= before + i + 1, 60, f"waiter {i} to queue")
        time.sleep(2)  # the last arrival's wakes settle
        start = counter.snapshot()
        time.sleep(window_s)
        spent = counter.snapshot() - start
        requests.delete(f"{CONSUL}/v1/kv/{wire.kv_queue_prefix('default')}", params={"recurse": "true"}, timeout=10)
        for thread in threads:
            thread.join(timeout=60)
        if errors:
            raise SystemExit(f"a waiter failed: {errors[0]!r}")
        minutes = window_s / 60
        per_thread = collections.Counter()
        for (thread, kind), n in spent.items():
            if thread.startswith("waiter-") and kind != "renew":
                per_thread[thread] += n
        head = max(per_thread.values(), default=0)
        renewals = sum(n for (_t, kind), n in spent.items() if kind == "renew")
        return {
            "consul": sum(n for (t, kind), n in spent.items() if kind == "consul" and t.startswith("waiter-")) / count / minutes,
            "renewals": renewals / count / minutes,
            "nomad": sum(n for (t, kind), n in spent.items() if kind == "nomad" and t.startswith("waiter-")) / count / minutes,
            "head": head / minutes,
            "others": (sum(per_thread.values()) - head) / max(1, count - 1) / minutes,
        }
    finally:
        purge(blocker)
        for name in names:
            purge(name)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--queued", default="1,5,20")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the queued runs are watched")
    args = parser.parse_args()
    counter = RequestCounter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"capacity released -> next queued run (cluster cpu {cluster_cpu()} MHz; medians of {args.rounds})")
        print(f"{'how the first job ended':<24} {'freed, first to last (s)':>25} {'freed -> registered (s)':>24} {'freed -> placed (s)':>20}")
        for case in [c for c in args.cases.split(",") if c]:
            rounds = [release_round(case, folder) for _ in range(args.rounds)]
            values = [median([r[key] for r in rounds]) for key in rounds[0]]
            print(f"{case:<24} {values[0]:>25.2f} {values[1]:>24.2f} {values[2]:>20.2f}")
        print()
        print(f"a queue's cost: requests per queued run per minute, over {args.window:g} s")
        print(f"{'queued runs':<12} {'consul':>8} {'renewals':>9} {'nomad':>7} {'head':>7} {'others':>7}")
        for count in [int(c) for c in args.queued.split(",") if c]:
            cost = queue_cost(count, args.window, folder, counter)
            print(f"{count:<12} {cost['consul']:>8.2f} {cost['renewals']:>9.2f} {cost['nomad']:>7.2f} {cost['head']:>7.2f} {cost['others']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
