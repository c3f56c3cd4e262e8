"""nomadtf against bare TensorFlow, side by side: the same training code, the same cluster
shape, alternating rounds in one invocation.

- bare: every task started here as a plain process on 127.0.0.1 with a hand-written
  TF_CONFIG (the chief runs the script; workers and parameter servers run the same bare
  `tf.distribute.Server` nomadtf starts, `python -m nomadtf.usercode.tfserver server`);
- nomadtf: `nomadtf run job.json` of the same script on the local stack.

For each round: submit (or start) -> the chief's first training step, the whole job (to the
chief's exit, resp. `nomadtf run`'s), and steady training speed in steps/s (between the
first and the last step line the chief printed). In nomadtf rounds also, per task, the CPU
seconds and the peak RSS of `nomadtf task` itself. Medians and ratios (nomadtf / bare) are
printed with the targets beside them (issue 34: the first step <= 1.10, the whole job <= 1.15;
issue 14: the speed >= 0.97), never asserted.

Where nomadtf's time goes, per phase (medians over the nomadtf rounds, seconds from the one
before): read after each round from Nomad (the chief's allocation: created, task started,
finished; the job's last allocation to finish) and from the chief's own log lines (holding
its slot, the cluster complete, the cluster handed to the child), beside the step lines.
The bare rounds have two of these phases: start -> first step and last step -> chief's exit.

Any script that prints lines with `step=<n>` works (`--script`, `--workdir`, `--context`);
lines are timestamped when they arrive (nomadtf rounds: as the chief's tee writes them to
the run's archive, read every 50 ms, so the bench starts no process of its own there).

Needs the local stack: `nomadtf dev up && eval "$(nomadtf dev env)"`, then
`python bench/bench_overhead.py [--rounds 3] [--steps 500]`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import faults  # noqa: E402  (finds a job's `nomadtf task` processes)

STEP = re.compile(r"\bstep=(\d+)")
NOMADTF = str(Path(sys.executable).parent / "nomadtf")


@dataclass
class Round:
    mode: str
    first_step_s: float = float("nan")
    whole_s: float = float("nan")
    steps_per_s: float = float("nan")
    task_cpu_s: list[float] = field(default_factory=list)
    task_rss_mib: list[float] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds since the one before
    cpu_to_first_step: dict[str, float] = field(default_factory=dict)  # who -> CPU seconds, start -> first step
    cpu_training: dict[str, float] = field(default_factory=dict)  # who -> CPU seconds per second, first -> last step


# nomadtf's phases, in order: each is measured from the end of the one before it.
PHASES = (
    ("placed", "submit -> the chief's allocation created"),
    ("task started", "-> its task started (Nomad)"),
    ("slot held", "-> registered, holding chief[0]"),
    ("cluster complete", "-> every peer registered and healthy"),
    ("handed to child", "-> TF_CONFIG handed to the child started ahead"),
    ("first step", "-> the chief's first step"),
    ("last step", "-> its last step"),
    ("chief exited", "-> the chief's task finished"),
    ("job finished", "-> the job's last task finished"),
    ("run returned", "-> `nomadtf run` returned"),
)
BARE_PHASES = {"first step": "start -> the chief's first step", "chief exited": "last step -> the chief's exit"}
LOG_MARKS = {"slot held": "holding chief[0]", "cluster complete": "cluster complete after",
             "handed to child": "handed the cluster to the child"}


class StepClock:
    """Timestamps `step=` lines as they arrive on a stream, from `started`."""

    def __init__(self, stream, started: float):
        self.started = started
        self.steps: list[tuple[float, int]] = []  # (seconds since `started`, step)
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            match = STEP.search(line)
            if match:
                self.steps.append((time.monotonic() - self.started, int(match[1])))

    def fill(self, result: Round) -> None:
        if not self.steps:
            return
        result.first_step_s = self.steps[0][0]
        (t0, s0), (t1, s1) = self.steps[0], self.steps[-1]
        if t1 > t0:
            result.steps_per_s = (s1 - s0) / (t1 - t0)


class ArchiveClock:
    """Timestamps the chief's `step=` lines as its task's tee writes them to the run's archive
    (runtime/archive.py), read here every 50 ms: no `nomadtf logs --follow` process of the
    bench's own loads the two cores the round is measured on."""

    def __init__(self, job: str, started: float):
        self.pattern = f"/tmp/nomadtf/default/{job}/*/.nomadtf-archive/chief-0/*.stdout"
        self.started = started
        self.steps: list[tuple[float, int]] = []
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        offsets: dict[str, int] = {}
        pending = ""
        while not self._done.wait(0.05):
            for path in sorted(glob.glob(self.pattern)):
                with open(path, errors="replace") as file:
                    file.seek(offsets.get(path, 0))
                    pending += file.read()
                    offsets[path] = file.tell()
            *lines, pending = pending.split("\n")
            now = time.monotonic() - self.started
            for line in lines:
                match = STEP.search(line)
                if match:
                    self.steps.append((now, int(match[1])))

    def stop(self) -> None:
        time.sleep(0.2)  # the last lines
        self._done.set()
        self.thread.join(timeout=5)

    fill = StepClock.fill


class CpuWatch:
    """CPU seconds used by every process of the machine, by kind, sampled every 0.25 s: what
    the first step waits on besides TensorFlow on two cores. A process that ends between two
    samples loses its last 0.25 s (Nomad's executors and logmons of short tasks: few)."""

    KINDS = (("nomadtf task", "-m nomadtf task"), ("TensorFlow (code, servers)", "nomadtf.usercode"),
             ("TensorFlow (code, servers)", "train_"), ("nomadtf run", "nomadtf run"),
             ("nomad executor, logmon", "nomad executor"), ("nomad executor, logmon", "nomad logmon"),
             ("nomad agent", "nomad agent"), ("consul", "consul agent"), ("openbao", "bao server"))

    def __init__(self):
        self.base: dict[int, float] = {}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.kind: dict[int, str] = {}
        self.busy0 = self._busy()
        for proc in psutil.process_iter(["cpu_times"]):
            times = proc.info["cpu_times"]
            if times:
                self.base[proc.pid] = times.user + times.system
        self.sample()

    @staticmethod
    def _busy() -> float:
        times = psutil.cpu_times()
        return times.user + times.system + getattr(times, "nice", 0.0) + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)

    def _kind_of(self, proc: psutil.Process) -> str:
        if proc.pid not in self.kind:
            try:
                line = " ".join(proc.cmdline())
            except psutil.Error:
                line = ""
            self.kind[proc.pid] = next((kind for kind, text in self.KINDS if text in line), "other")
        return self.kind[proc.pid]

    def sample(self) -> None:
        used: dict[str, float] = {}
        for proc in psutil.process_iter(["cpu_times"]):
            times = proc.info["cpu_times"]
            if not times or proc.pid == os.getpid():
                continue
            kind = self._kind_of(proc)
            used[kind] = used.get(kind, 0.0) + times.user + times.system - self.base.get(proc.pid, 0.0)
        used["the whole machine"] = self._busy() - self.busy0
        self.samples.append((time.monotonic(), used))

    def until(self, at: float | None) -> dict[str, float]:
        """CPU seconds by kind from the start to the last sample before `at` (monotonic)."""
        if at is None:
            return {}
        before = [used for when, used in self.samples if when <= at]
        return before[-1] if before else {}

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds by kind per second of wall time between two moments (monotonic)."""
        first = next(((when, used) for when, used in self.samples if when >= start), None)
        last = next(((when, used) for when, used in reversed(self.samples) if when <= end), None)
        if first is None or last is None or last[0] <= first[0]:
            return {}
        span = last[0] - first[0]
        return {kind: (last[1].get(kind, 0.0) - first[1].get(kind, 0.0)) / span for kind in last[1]}


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for sock in sockets:
        sock.close()
    return ports


def bare_round(args: argparse.Namespace) -> Round:
    roles = [("chief", 0)] + [("worker", i) for i in range(args.workers)] + [("ps", i) for i in range(args.ps)]
    ports = dict(zip(roles, free_ports(len(roles)), strict=True))
    cluster: dict[str, list[str]] = {}
    for (role, _i), port in ports.items():
        cluster.setdefault(role, []).append(f"127.0.0.1:{port}")
    model_dir = tempfile.mkdtemp(prefix="bench-bare-")
    context = json.dumps({**json.loads(args.context), "steps": args.steps})
    started = time.monotonic()
    procs, chief = [], None
    for role, index in roles:
        env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}),
               "NOMADTF_CONTEXT": context, "NOMADTF_MODEL_DIR": model_dir, "NOMADTF_ROLE": role,
               "NOMADTF_INDEX": str(index), "PYTHONUNBUFFERED": "1", "PYTHONPATH": args.workdir}
        argv = [sys.executable, "-u", args.script] if role == "chief" else [sys.executable, "-m", "nomadtf.usercode.tfserver", "server"]
        out = subprocess.PIPE if role == "chief" else subprocess.DEVNULL
        proc = subprocess.Popen(argv, cwd=args.workdir, env=env, stdout=out, stderr=subprocess.DEVNULL, text=True)
        procs.append(proc)
        chief = proc if role == "chief" else chief
    clock = StepClock(chief.stdout, started)
    cpu_watch = CpuWatch()
    while chief.poll() is None:
        cpu_watch.sample()
        time.sleep(0.25)
    result = Round("bare", whole_s=time.monotonic() - started)
    for proc in procs:
        proc.kill()
        proc.wait()
    clock.thread.join(timeout=5)
    clock.fill(result)
    if clock.steps:
        result.phases = {"first step": clock.steps[0][0], "chief exited": result.whole_s - clock.steps[-1][0]}
    result.cpu_to_first_step = cpu_watch.until(clock.steps[0][0] + started if clock.steps else None)
    if clock.steps:
        result.cpu_training = cpu_watch.between(clock.steps[0][0] + started, clock.steps[-1][0] + started)
    return result


def nomadtf_round(args: argparse.Namespace, number: int) -> Round:
    name = f"bench-ovh-{os.getpid()}-{number}"
    job = {
        "name": name,
        "strategy": "parameter_server",
        "entrypoint": {"script": args.script, "workdir": args.workdir},
        "context": {**json.loads(args.context), "steps": args.steps},
        "roles": {"chief": {"count": 1, "cpu": 1000, "memory": 1536},
                  "worker": {"count": args.workers, "cpu": 500, "memory": 1024},
                  "ps": {"count": args.ps, "cpu": 300, "memory": 1024}},
    }
    path = Path(tempfile.mkdtemp(prefix="bench-ovh-")) / "job.json"
    path.write_text(json.dumps(job))
    started, wall = time.monotonic(), time.time()
    run = subprocess.Popen([NOMADTF, "run", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    clock = ArchiveClock(name, started)
    cpu_watch = CpuWatch()
    cpu: dict[int, float] = {}
    rss: dict[int, float] = {}
    while run.poll() is None:
        cpu_watch.sample()
        for (kind, _role, _index), pid in faults.processes(name).items():
            if kind != "task":
                continue
            try:
                proc = psutil.Process(pid)
                times = proc.cpu_times()
                cpu[pid] = times.user + times.system
                rss[pid] = max(rss.get(pid, 0.0), proc.memory_info().rss / 2**20)
            except psutil.Error:
                continue
        time.sleep(0.25)
    result = Round("nomadtf", whole_s=time.monotonic() - started, task_cpu_s=list(cpu.values()), task_rss_mib=list(rss.values()))
    if run.returncode != 0:
        print(f"  nomadtf run exited {run.returncode}: see `nomadtf status {name}`", file=sys.stderr)
    clock.stop()
    clock.fill(result)
    result.phases = nomadtf_phases(name, wall, [wall + t for t, _ in clock.steps], wall + result.whole_s)
    result.cpu_to_first_step = cpu_watch.until(clock.steps[0][0] + started if clock.steps else None)
    if clock.steps:
        result.cpu_training = cpu_watch.between(clock.steps[0][0] + started, clock.steps[-1][0] + started)
    subprocess.run([NOMADTF, "stop", name, "--purge"], capture_output=True)
    return result


def nomadtf_phases(name: str, submitted: float, step_times: list[float], returned: float) -> dict[str, float]:
    """Each phase's length (seconds after the one before), from Nomad's record of the job and
    the chief's log lines. A mark that is missing leaves its phase and the next one out."""
    nomad = os.environ.get("NOMAD_ADDR", "http://127.0.0.1:4646")
    allocs = requests.get(f"{nomad}/v1/job/{name}/allocations", timeout=10).json()
    chief = next((a for a in allocs if a["TaskGroup"] == "chief"), None)
    marks: dict[str, float] = {}
    if chief is not None:
        marks["placed"] = chief["CreateTime"] / 1e9
        state = (chief.get("TaskStates") or {}).get("chief") or {}
        marks["task started"] = rfc3339(state.get("StartedAt"))
        marks["chief exited"] = rfc3339(state.get("FinishedAt"))
    ends = [rfc3339(s.get("FinishedAt")) for a in allocs for s in (a.get("TaskStates") or {}).values()]
    marks["job finished"] = max(ends, default=float("nan"))
    stderr = subprocess.run([NOMADTF, "logs", name, "--role", "chief", "--stderr"], capture_output=True, text=True).stdout
    for phase, text in LOG_MARKS.items():
        line = next((line for line in stderr.splitlines() if text in line), "")
        marks[phase] = log_time(line, submitted)
    if step_times:
        marks["first step"], marks["last step"] = step_times[0], step_times[-1]
    marks["run returned"] = returned
    phases, before = {}, submitted
    for phase, _label in PHASES:
        at = marks.get(phase, float("nan"))
        phases[phase] = at - before
        before = at
    return phases


def rfc3339(stamp: str | None) -> float:
    """Nomad's "2026-12-06T21:58:03.123456789Z" as epoch seconds (nanoseconds cut to micro)."""
    if not stamp or stamp.startswith("0001-"):
        return float("nan")
    match = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-].*)$", stamp)
    if not match:
        return float("nan")
    fraction = (match[2] or ".0")[:7]
    zone = "+00:00" if match[3] == "Z" else match[3]
    return datetime.fromisoformat(match[1] + fraction + zone).timestamp()


def log_time(line: str, near: float) -> float:
    """A task log line's "HH:MM:SS.mmm" (UTC, no date) as epoch seconds, on the day of `near`."""
    match = re.match(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) ", line)
    if not match:
        return float("nan")
    day = datetime.fromtimestamp(near, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    at = day + int(match[1]) * 3600 + int(match[2]) * 60 + int(match[3]) + int(match[4]) / 1000
    return at + 86400 if at < near - 43200 else at  # the round crossed midnight


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def report(rounds: list[Round]) -> None:
    bare = [r for r in rounds if r.mode == "bare"]
    ours = [r for r in rounds if r.mode == "nomadtf"]
    print(f"\n{'':<28}{'bare':>10}{'nomadtf':>10}{'ratio':>8}  target")
    for label, attr, target in (("submit -> first step (s)", "first_step_s", "<= 1.10"),
                                ("whole job (s)", "whole_s", "<= 1.15"),
                                ("training speed (steps/s)", "steps_per_s", ">= 0.97")):
        b, n = median([getattr(r, attr) for r in bare]), median([getattr(r, attr) for r in ours])
        print(f"{label:<28}{b:>10.2f}{n:>10.2f}{n / b:>8.2f}  {target}")
    cpu = [c for r in ours for c in r.task_cpu_s]
    rss = [m for r in ours for m in r.task_rss_mib]
    if cpu:
        whole = median([r.whole_s for r in ours])
        print(f"nomadtf task: CPU {median(cpu):.2f} s per task over the whole job, start-up included "
              f"({100 * median(cpu) / whole:.2f} % of a core; steady state: bench_supervisor.py), peak RSS {max(rss):.1f} MiB (target < 60)")
    print("\nwhere the time goes (medians, seconds after the phase before):")
    print(f"  {'phase':<52}{'bare':>8}{'nomadtf':>9}")
    for phase, label in PHASES:
        b = median([r.phases.get(phase, float("nan")) for r in bare]) if phase in BARE_PHASES else float("nan")
        n = median([r.phases.get(phase, float("nan")) for r in ours])
        cell = f"{b:>8.2f}" if b == b else f"{'':>8}"
        print(f"  {label:<52}{cell}{n:>9.2f}" + (f"   bare: {BARE_PHASES[phase]}" if phase in BARE_PHASES else ""))
    kinds = sorted({k for r in rounds for k in r.cpu_to_first_step}, key=lambda k: (k == "the whole machine", k))
    if kinds:
        print("\nCPU by kind (medians; two cores): seconds from the start to the chief's first step | cores while it trains")
        print(f"  {'':<30}{'bare':>8}{'nomadtf':>9}  |{'bare':>8}{'nomadtf':>9}")
        for kind in kinds:
            b = median([r.cpu_to_first_step.get(kind, 0.0) for r in bare])
            n = median([r.cpu_to_first_step.get(kind, 0.0) for r in ours])
            bt = median([r.cpu_training.get(kind, 0.0) for r in bare])
            nt = median([r.cpu_training.get(kind, 0.0) for r in ours])
            print(f"  {kind:<30}{b:>8.2f}{n:>9.2f}  |{bt:>8.2f}{nt:>9.2f}")
    for r in rounds:
        print(f"  {r.mode:<8} first step {r.first_step_s:6.1f}s  whole {r.whole_s:6.1f}s  {r.steps_per_s:6.1f} steps/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (alternating)")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--script", default="train_ps.py", help="the chief's script, relative to --workdir")
    parser.add_argument("--workdir", default=str(REPO / "examples" / "digits"))
    parser.add_argument("--context", default='{"batch_size": 64, "learning_rate": 0.1, "checkpoint_every": 50}')
    args = parser.parse_args()
    rounds = []
    for number in range(args.rounds):
        for mode in ("bare", "nomadtf"):
            print(f"round {number + 1}: {mode} ...", file=sys.stderr, flush=True)
            rounds.append(bare_round(args) if mode == "bare" else nomadtf_round(args, number))
    report(rounds)


if __name__ == "__main__":
    main()
