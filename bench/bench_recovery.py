"""MTTR per role and the cost of one fault, on the digits example, in one run.

For each fault (a worker's TF server, the parameter server, the chief, a worker's
`nomadtf task`, all `kill -9` at the same training step) it measures the time from the kill
to the next training step the chief completes (MTTR), and the whole job's time against the
same job without faults, printed as a ratio.

Needs the local stack: `nomadtf dev up && eval "$(nomadtf dev env)"`, then
`python bench/bench_recovery.py [--steps 2500]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

from tests import faults
from tests.helpers import EXAMPLES, nomadtf, purge, unique, wait_until

KILL_AT_STEP = 300
FAULTS = {
    "none": None,
    "worker TF server": ("child", "worker", 0),
    "parameter server": ("child", "ps", 0),
    "chief": ("child", "chief", 0),
    "worker's nomadtf task": ("task", "worker", 0),
}


def spec(name: str, steps: int) -> dict:
    data = json.loads((EXAMPLES / "digits" / "job.json").read_text())
    data["name"] = name
    data["entrypoint"]["workdir"] = str(EXAMPLES / "digits")
    data["context"].update({"steps": steps, "log_every": 10, "checkpoint_every": 50})
    data["recovery"] = {"restart_attempts": 3, "restart_delay": "1s"}
    return data


def step_lines(job_id: str) -> int:
    """How many training steps the chief has reported (a restarted chief adds to them)."""
    return len(re.findall(r"step=(\d+)", faults.chief_stdout(job_id)))


def run_one(fault: tuple[str, str, int] | None, steps: int, workdir: Path) -> tuple[float, float | None]:
    job_id = unique("bench-rec")
    path = workdir / f"{job_id}.json"
    path.write_text(json.dumps(spec(job_id, steps)))
    started = time.monotonic()
    out = nomadtf("run", str(path), "--detach")
    assert out.returncode == 0, out.stderr
    mttr = None
    try:
        if fault:
            wait_until(lambda: faults.step(job_id) >= KILL_AT_STEP, 300, "the kill step")
            seen = step_lines(job_id)
            os.kill(faults.processes(job_id)[fault], signal.SIGKILL)
            killed = time.monotonic()
            wait_until(lambda: step_lines(job_id) > seen, 300, "the next step", interval=0.1)
            mttr = time.monotonic() - killed
        wait_until(lambda: "final_accuracy=" in faults.chief_stdout(job_id), 600, "the end of training", interval=0.2)
        return time.monotonic() - started, mttr
    finally:
        nomadtf("stop", job_id, "--purge")
        purge(job_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run_one(fault, args.steps, Path(tmp)) for name, fault in FAULTS.items()}
    baseline = results["none"][0]
    print(f"digits example, {args.steps} steps, kill -9 at step {KILL_AT_STEP}; baseline {baseline:.1f}s without faults")
    print(f"{'fault':<24}{'MTTR':>8}{'total':>9}{'vs none':>9}")
    for name, (total, mttr) in results.items():
        shown = f"{mttr:.1f}s" if mttr is not None else "-"
        print(f"{name:<24}{shown:>8}{total:>8.1f}s{total / baseline:>8.2f}x")


if __name__ == "__main__":
    main()
