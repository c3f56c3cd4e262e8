"""A client lost under training, per role: time to training again, whole job against none.

On the several-client stack: the time from a client's death to the job training again, and
the whole job's time against the same job without a fault.

The digits example (parameter-server strategy: a chief, a worker, a parameter server) runs
with the role under test on client 2 or 3 and the other two on client 1
(tests/node_loss.py). At the kill step the client holding the role dies at once
(`tests/faults.kill_client`: its Nomad and Consul agents and every task SIGKILLed), Nomad
marks it down and places the role on the other client, the chief restarts with the new
TF_CONFIG and resumes from its checkpoint. Per run: the node `down` after the kill, the first
training step that counts after the kill (after the chief's "resumed from step" line), the
steps lost (the last step printed before the restart minus the step it resumed from), and
submit -> the chief's final accuracy. The fault-free baseline runs in the same invocation,
in the same rounds; the killed client is restarted after each run. Medians, and the range
when there are several rounds; nothing is asserted.

Needs the several-client stack: `nomadtf dev up --clients 3`, then
`python bench/bench_node_loss.py [--rounds 1] [--steps 2000] [--kill-at 500]`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_recovery import LineClock

from nomadtf.devstack.cluster import ClusterStack
from tests import chaos, cluster_access, faults, node_loss
from tests.helpers import nomadtf, unique, wait_until, write_job

CHECKPOINT_EVERY = 50
LOG_EVERY = 10
FAULTS = {"none": None, "worker": "worker", "parameter server": "ps", "chief": "chief"}


@dataclass
class Result:
    total_s: float
    down_s: float | None = None
    training_again_s: float | None = None
    steps_lost: int | None = None
    accuracy: float | None = None


class ChiefClock(LineClock):
    """bench_recovery's line clock over the chief's stdout as the clients' disks hold it
    (also the stdout of a chief lost with its client)."""

    def __init__(self, stack: ClusterStack, job_id: str):
        super().__init__(job_id)
        self.stack = stack

    def read(self) -> str:
        return node_loss.chief_stdout(self.stack, self.job_id)


def node_status(name: str) -> str:
    """GET /v1/nodes: the newest entry of node `name`."""
    nodes = cluster_access.nomad_get(ClusterStack.default(), "nodes")
    mine = sorted((n for n in nodes if n["Name"] == name), key=lambda n: n["ModifyIndex"])
    return mine[-1]["Status"] if mine else "absent"


def run_one(stack: ClusterStack, role: str | None, steps: int, kill_at: int, workdir: Path) -> Result:
    job_id = unique("bench-loss")
    # The baseline has the same placement as a worker's run: a worker alone on client 2 or 3.
    spec = node_loss.spec(job_id, role or "worker", steps, CHECKPOINT_EVERY, LOG_EVERY)
    path = write_job(workdir, cluster_access.secured(spec, stack, workdir))  # as is on a plain stack
    env = stack.env()
    started = time.monotonic()
    out = nomadtf("run", str(path), "--detach", env=env)
    assert out.returncode == 0, out.stderr
    clock = ChiefClock(stack, job_id)
    victim = killed = down = None
    try:
        if role:
            wait_until(lambda: chaos.current_step(clock.poll()) >= kill_at, 300, "the kill step", interval=0.1)
            victim = node_loss.running_client(job_id, role)
            assert victim not in (None, node_loss.HOME_CLIENT), victim
            faults.kill_client(stack, victim)
            killed = time.monotonic()
        while "final_accuracy=" not in clock.poll():
            if killed is not None and down is None and node_status(f"client-{victim}") == "down":
                down = time.monotonic() - killed
            assert time.monotonic() - started < 600, "the job did not end in 10 minutes"
            time.sleep(0.1)
        total = time.monotonic() - started
        if not role:
            return Result(total, accuracy=node_loss.accuracy(clock.text))
        lost = [n for _resumed, n in chaos.resumes_with_loss(chaos.events(clock.text))]
        return Result(total, down, clock.recovered_after(killed), max(lost, default=None), node_loss.accuracy(clock.text))
    finally:
        nomadtf("stop", job_id, "--purge", env=env)
        if victim is not None:
            faults.restart_client(stack, victim)


def spread(values: list[float], unit: str = "s") -> str:
    """The median, with the range when there are several values."""
    if not values:
        return "-"
    text = f"{statistics.median(values):.1f} {unit}"
    return text if len(values) == 1 else f"{text} ({min(values):.1f}–{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--kill-at", type=int, default=500, help="the chief's step at which the client dies")
    args = parser.parse_args()
    stack = ClusterStack.default()
    if not stack.is_up():
        raise SystemExit("the several-client stack is not running: `nomadtf dev up --clients 3`")
    results: dict[str, list[Result]] = {name: [] for name in FAULTS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(1, args.rounds + 1):
            for name, role in FAULTS.items():
                result = run_one(stack, role, args.steps, args.kill_at, Path(tmp))
                results[name].append(result)
                print(f"round {round_} {name}: {result}", flush=True)
    baseline = statistics.median(r.total_s for r in results["none"])
    print(
        f"\ndigits example (chief, worker, ps on 2 clients), {args.steps} steps, checkpoint every "
        f"{CHECKPOINT_EVERY}, client killed at step {args.kill_at}; {args.rounds} round(s), medians (range)"
    )
    print("| client lost with | node down | training again | most steps lost | whole job | vs none | lowest accuracy |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        totals = [r.total_s for r in runs]
        lost = [r.steps_lost for r in runs if r.steps_lost is not None]
        accuracy = [r.accuracy for r in runs if r.accuracy is not None]
        lowest = f"{min(accuracy):.3f}" if accuracy else "-"
        print(
            f"| {name} | {spread([r.down_s for r in runs if r.down_s is not None])} "
            f"| {spread([r.training_again_s for r in runs if r.training_again_s is not None])} "
            f"| {'-' if not lost else max(lost)} | {spread(totals)} | {statistics.median(totals) / baseline:.2f}× "
            f"| {lowest} |"
        )


if __name__ == "__main__":
    main()
