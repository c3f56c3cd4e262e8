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
printed with the targets of issue 14 beside them, never asserted.

Any script that prints lines with `step=<n>` works (`--script`, `--workdir`, `--context`);
lines are timestamped when they arrive (nomadtf rounds: through `nomadtf logs --follow`).

Needs the local stack: `nomadtf dev up && eval "$(nomadtf dev env)"`, then
`python bench/bench_overhead.py [--rounds 3] [--steps 500]`.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

import psutil

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


class StepClock:
    """Timestamps `step=` lines as they arrive on a stream, from `started`."""

    def __init__(self, stream, started: float):
        self.started = started
        self.steps: list[tuple[float, int]] = []
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
    chief.wait()
    result = Round("bare", whole_s=time.monotonic() - started)
    for proc in procs:
        proc.kill()
        proc.wait()
    clock.thread.join(timeout=5)
    clock.fill(result)
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
    started = time.monotonic()
    run = subprocess.Popen([NOMADTF, "run", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logs = None
    cpu: dict[int, float] = {}
    rss: dict[int, float] = {}
    while run.poll() is None:
        found = faults.processes(name)
        if logs is None and ("task", "chief", 0) in found:
            # The chief's task runs: stream its stdout (unbuffered, so lines arrive when printed).
            logs = subprocess.Popen([NOMADTF, "logs", name, "--role", "chief", "--follow"], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            clock = StepClock(logs.stdout, started)
        for (kind, _role, _index), pid in found.items():
            if kind != "task":
                continue
            try:
                proc = psutil.Process(pid)
                times = proc.cpu_times()
                cpu[pid] = times.user + times.system
                rss[pid] = max(rss.get(pid, 0.0), proc.memory_info().rss / 2**20)
            except psutil.Error:
                continue
        time.sleep(0.5)
    result = Round("nomadtf", whole_s=time.monotonic() - started, task_cpu_s=list(cpu.values()), task_rss_mib=list(rss.values()))
    if run.returncode != 0:
        print(f"  nomadtf run exited {run.returncode}: see `nomadtf status {name}`", file=sys.stderr)
    if logs is not None:
        logs.wait(timeout=30)
        clock.thread.join(timeout=5)
        clock.fill(result)
    subprocess.run([NOMADTF, "stop", name, "--purge"], capture_output=True)
    return result


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]  # drop NaN
    return statistics.median(values) if values else float("nan")


def report(rounds: list[Round]) -> None:
    bare = [r for r in rounds if r.mode == "bare"]
    ours = [r for r in rounds if r.mode == "nomadtf"]
    print(f"\n{'':<28}{'bare':>10}{'nomadtf':>10}{'ratio':>8}  target")
    for label, attr, target in (("submit -> first step (s)", "first_step_s", "<= 1.10"),
                                ("whole job (s)", "whole_s", "<= 1.10"),
                                ("training speed (steps/s)", "steps_per_s", ">= 0.97")):
        b, n = median([getattr(r, attr) for r in bare]), median([getattr(r, attr) for r in ours])
        print(f"{label:<28}{b:>10.2f}{n:>10.2f}{n / b:>8.2f}  {target}")
    cpu = [c for r in ours for c in r.task_cpu_s]
    rss = [m for r in ours for m in r.task_rss_mib]
    if cpu:
        whole = median([r.whole_s for r in ours])
        print(f"nomadtf task: CPU {median(cpu):.2f} s per task over the whole job, start-up included "
              f"({100 * median(cpu) / whole:.2f} % of a core; steady state: bench_supervisor.py), peak RSS {max(rss):.1f} MiB (target < 60)")
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
