"""Steps lost to a preemption, with and without the checkpoint request (issue 32, "Measured").

Each round runs, on the local stack with its admission controller and `"preemption": true`,
a priority-30 run of `tests/jobs/preemptible.py` holding 65 % of the CPU (a step every
0.25 s, a checkpoint every 120 steps: 30 s, longer than the 20 s kill timeout; each step
logged in its model dir), and, once its chief
has reached a step that falls at a different point of the checkpoint cycle each round, a
priority-90 run needing 65 %. The low run is preempted: asked to checkpoint (SIGUSR1), then
suspended whole once it reports the checkpoint or after its kill timeout (20 s). Measured
from the low run's own log and Nomad's allocation times:

- **steps lost**: the last step it reached before it was stopped, less the step it will
  resume from (its last checkpoint);
- **room made in**: from the high run's submission to its first allocation.

The rounds run twice: code that saves on the request (`progress.on_checkpoint_request`) and
the same code ignoring it (as code written without the helper; the task then does not pass
the signal on, and the run goes at its kill timeout). Prints both side by side.

Needs the local single-node stack without ACLs with its admission controller:
`nomadtf dev up && eval "$(nomadtf dev env)"`, then
`PYTHONPATH=$PWD python bench/bench_preemption.py [--rounds 3]`; a round takes 30-60 s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_sharing import NOMAD, nomad, policy_swap, usable_cpu  # noqa: E402
from tests.helpers import nomadtf, unique, wait_until, write_job  # noqa: E402

STEP_S = 0.25
NAMESPACE = "bench-preempt"


def job(name: str, cpu: int, priority: int, model_dir: Path, script: str, **context: Any) -> dict[str, Any]:
    roles = {"chief": {"count": 1, "cpu": max(10, cpu - 100)}, "worker": {"count": 1, "cpu": 50}, "ps": {"count": 1, "cpu": 50}}
    for role in roles.values():
        role["memory"] = 300
    return {
        "name": name, "namespace": NAMESPACE, "strategy": "parameter_server", "priority": priority, "model_dir": str(model_dir),
        # The worker and ps serve nobody here (the chief's steps are what is measured): the probe
        # jobs' stand-in for TensorFlow's server spares two TensorFlow imports per run.
        "entrypoint": {"script": script, "workdir": str(REPO / "tests" / "jobs"), "pythonpath": [str(REPO / "tests" / "jobs" / "stand_in")]},
        "context": context, "roles": roles,
        "recovery": {"restart_attempts": 0, "reschedule_attempts": 0}, "discovery": {"rendezvous_timeout": "2m"},
    }  # fmt: skip


def chief_steps(model_dir: Path) -> list[int]:
    path = model_dir / "log"
    return [int(n) for n in re.findall(r"^chief step (\d+)$", path.read_text(), re.M)] if path.exists() else []


def first_alloc_s(name: str) -> float | None:
    allocs = nomad("get", f"job/{name}/allocations", params={"namespace": NAMESPACE})
    return min((a["CreateTime"] for a in allocs), default=0) / 1e9 or None


def stopped(name: str) -> bool:
    allocs = nomad("get", f"job/{name}/allocations", params={"namespace": NAMESPACE})
    return bool(allocs) and not any(a["ClientStatus"] in ("pending", "running") for a in allocs)


def one_round(index: int, on_request: bool, cpu: int, scratch: Path, every: int) -> tuple[int, float]:
    """(steps lost, seconds until the high run's first allocation)."""
    low, high = unique(f"bp-low{index}"), unique(f"bp-high{index}")
    model_dir = scratch / low
    at = every + 5 + (index * 37) % max(1, every - 10)  # a different point of the cycle each round
    try:
        spec = job(low, int(cpu * 0.65), 30, model_dir, "preemptible.py", steps=10_000, step_s=STEP_S,
                   checkpoint_every=every, on_request=on_request, log_steps=True)  # fmt: skip
        out = nomadtf("run", str(write_job(scratch, spec)), "--detach", timeout=120)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: max(chief_steps(model_dir), default=0) >= at, 120 + at * STEP_S * 2, f"{low} to reach step {at}", interval=0.2)
        submitted = time.time()
        spec = job(high, int(cpu * 0.65), 90, scratch / high, "probe.py", sleep=1)
        out = nomadtf("run", str(write_job(scratch, spec)), "--detach", timeout=120)
        assert out.returncode == 0, out.stderr
        started = wait_until(lambda: first_alloc_s(high), 120, f"{high} to start", interval=0.5)
        wait_until(lambda: stopped(low), 60, f"{low} to stop")
        saved = int((model_dir / "step").read_text()) if (model_dir / "step").exists() else 0
        return max(chief_steps(model_dir)) - saved, started - submitted
    finally:
        for name in (low, high):
            requests.delete(f"{NOMAD}/v1/job/{name}", params={"namespace": NAMESPACE, "purge": "true"}, timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per kind of code")
    parser.add_argument("--checkpoint-every", type=int, default=120, help="steps between the code's own checkpoints")
    args = parser.parse_args()
    nomad("post", "namespace", json={"Name": NAMESPACE, "Description": "bench/bench_preemption.py"})
    before = policy_swap({"preemption": True})
    results: dict[bool, list[tuple[int, float]]] = {True: [], False: []}
    try:
        time.sleep(12)  # the controller reads the policy every 10 s
        cpu = usable_cpu()
        with tempfile.TemporaryDirectory(prefix="bench-preemption-") as scratch:
            for index in range(args.rounds):
                for on_request in (True, False):
                    lost, waited = one_round(index, on_request, cpu, Path(scratch), args.checkpoint_every)
                    results[on_request].append((lost, waited))
                    print(f"round {index + 1} {'saves on request' if on_request else 'ignores request'}: {lost} steps lost, room in {waited:.1f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
    finally:
        policy_swap(json.loads(before) if before else None)
        requests.delete(f"{NOMAD}/v1/namespace/{NAMESPACE}", timeout=30)
    print(f"preemption of a run checkpointing every {args.checkpoint_every} steps of {STEP_S:g} s, {args.rounds} round(s) each:")
    for on_request, label in ((True, "code that saves on the request"), (False, "code that ignores it        ")):
        lost = [r[0] for r in results[on_request]]
        waited = [r[1] for r in results[on_request]]
        print(f"{label}: steps lost mean {statistics.mean(lost):.1f} max {max(lost)}; room made in mean {statistics.mean(waited):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
