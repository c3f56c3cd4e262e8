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


class LineClock:
    """Stamps each line of the chief's stdout with the time this process first saw it
    (Nomad's logs carry no timestamps). Polled every 0.1 s."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.seen: list[tuple[float, str]] = []
        self.text = ""

    def read(self) -> str:
        return faults.chief_stdout(self.job_id)

    def poll(self) -> str:
        text = self.read()
        if len(text) > len(self.text):
            now = time.monotonic()
            self.seen += [(now, line) for line in text[len(self.text):].splitlines() if line.strip()]
            self.text = text
        return text

    def recovered_after(self, killed: float) -> float:
        """Seconds from the kill to the first training step that counts: after the chief's
        last "resumed from step" line when it restarted, else the first step after the kill."""
        after = [(t, line) for t, line in self.seen if t >= killed]
        resumed = [i for i, (_t, line) in enumerate(after) if line.startswith("resumed from step")]
        start = resumed[-1] + 1 if resumed else 0
        steps = [t for t, line in after[start:] if line.startswith("step=")]
        return steps[0] - killed


def run_one(fault: tuple[str, str, int] | None, steps: int, workdir: Path) -> tuple[float, float | None]:
    job_id = unique("bench-rec")
    path = workdir / f"{job_id}.json"
    path.write_text(json.dumps(spec(job_id, steps)))
    started = time.monotonic()
    out = nomadtf("run", str(path), "--detach")
    assert out.returncode == 0, out.stderr
    clock = LineClock(job_id)
    killed = None
    try:
        if fault:
            wait_until(lambda: faults.step(job_id) >= KILL_AT_STEP, 300, "the kill step")
            clock.poll()
            os.kill(faults.processes(job_id)[fault], signal.SIGKILL)
            killed = time.monotonic()
        wait_until(lambda: "final_accuracy=" in clock.poll(), 600, "the end of training", interval=0.1)
        total = time.monotonic() - started
        return total, clock.recovered_after(killed) if killed else None
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
