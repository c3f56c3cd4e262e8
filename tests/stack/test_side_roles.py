"""Side roles are side roles (issue #20): an evaluator whose code raises at start and a
TensorBoard that cannot start are restarted on their own budget, reported as warnings
with their own traceback, and training succeeds all the same; an evaluator killed and a
TensorBoard moved come back without restarting the chief."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.helpers import (
    JOBS,
    allocations,
    nomadtf,
    probe_job,
    purge,
    task_log,
    unique,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.stack


def _follow(job: Path) -> tuple[subprocess.Popen, list[str]]:
    """`nomadtf run JOB` in the background, its output (stdout and stderr) collected line by line."""
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "nomadtf"), "run", str(job), "--timeout", "5m"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def test_a_crashing_evaluator_and_a_tensorboard_that_cannot_start_never_touch_training(stack, tmp_path):
    name = unique("side")
    gate = tmp_path / "gate"  # the worker (whose exit decides the training) finishes once it exists
    # The cheapest cluster: one worker running the probe, no TensorFlow server.
    spec = probe_job(name, "multi_worker_mirrored", context={"until_file": str(gate), "raise_in_roles": ["evaluator"]})
    spec["roles"]["worker"]["count"] = 1
    spec["roles"]["evaluator"] = {"count": 1, "cpu": 100, "memory": 300}
    spec["roles"]["tensorboard"] = {"count": 1, "cpu": 100, "memory": 300, "env": {"PYTHONPATH": str(JOBS / "broken_tensorboard")}}
    # One restart in place of its own, then Nomad's one restart; the exit code 1 the
    # evaluator's code exits with is a permanent one for a training role.
    spec["recovery"] = {"restart_attempts": 1, "restart_delay": "1s", "reschedule_attempts": 0, "permanent_exit_codes": [1, 2]}
    proc, out = _follow(write_job(tmp_path, spec))

    def failed(role: str) -> bool:
        return any(a["TaskGroup"] == role and a["ClientStatus"] == "failed" for a in allocations(name))

    try:
        wait_until(lambda: failed("evaluator") and failed("tensorboard"), 180, "the evaluator and TensorBoard to fail")
        worker = next(a for a in allocations(name) if a["TaskGroup"] == "worker")
        assert worker["ClientStatus"] == "running", worker["ClientStatus"]
        assert sum(s.get("Restarts", 0) for s in (worker.get("TaskStates") or {}).values()) == 0
        worker_log = task_log(worker["ID"], "worker", "stderr")
        assert len(re.findall(r"generation \d+: starting ", worker_log)) == 1 and "the job failed" not in worker_log, worker_log
        evaluator = next(a for a in allocations(name) if a["TaskGroup"] == "evaluator")
        # Restarted on its own budget (in place by its supervisor), never recorded as the job's failure.
        evaluator_log = task_log(evaluator["ID"], "evaluator", "stderr")
        assert evaluator_log.count("RuntimeError: evaluator cannot start") >= 2, evaluator_log
        assert "marking the job failed" not in evaluator_log, evaluator_log
        gate.touch()
        proc.wait(timeout=180)
        text = "".join(out)
        assert proc.returncode == 0, text
        assert "succeeded" in text, text
        warning = text.split("evaluator[0] failed (exit 1); training goes on:", 1)
        assert len(warning) == 2, text
        assert "RuntimeError: evaluator cannot start: boom from side-role code" in warning[1], text
        assert "Traceback (most recent call last):" in warning[1], text
        board = text.split("tensorboard[0] failed (exit 1); training goes on:", 1)
        assert len(board) == 2 and "RuntimeError: TensorBoard cannot start" in board[1], text
        status = nomadtf("status", name)
        assert "outcome: succeeded" in status.stdout, status.stdout
    finally:
        proc.kill()
        proc.wait()
        purge(name)


def test_the_evaluator_and_tensorboard_come_and_go_without_touching_training(stack, tmp_path):
    """Killing the evaluator's task and moving TensorBoard (its allocation stopped and
    replaced) neither restart the chief's code nor hold it up."""
    name = unique("soft")
    gate = tmp_path / "gate"
    spec = probe_job(name, context={"until_file": str(gate)})
    spec["recovery"] = {"restart_attempts": 2, "restart_delay": "1s", "reschedule_attempts": 1}
    spec["roles"]["evaluator"] = {"count": 1, "cpu": 200, "memory": 600}
    spec["roles"]["tensorboard"] = {"count": 1, "cpu": 200, "memory": 300}
    nomad_addr = os.environ["NOMAD_ADDR"]

    def running(role: str) -> dict | None:
        return next((a for a in allocations(name) if a["TaskGroup"] == role and a["ClientStatus"] == "running"), None)

    def chief_starts() -> int:
        return len(re.findall(r"generation \d+: starting ", nomadtf("logs", name, "--role", "chief", "--stderr").stdout))

    try:
        assert nomadtf("run", str(write_job(tmp_path, spec)), "--detach").returncode == 0
        wait_until(lambda: chief_starts() >= 1 and running("evaluator") and running("tensorboard"), 120, "chief, evaluator and tensorboard")
        chief_pid_line = nomadtf("logs", name, "--role", "chief").stdout.splitlines()[0]
        # The evaluator's supervisor is killed (Nomad restarts the task); TensorBoard moves.
        evaluator, board = running("evaluator"), running("tensorboard")
        requests.post(f"{nomad_addr}/v1/client/allocation/{evaluator['ID']}/signal", json={"Signal": "SIGKILL", "Task": "evaluator"}, timeout=10)
        requests.post(f"{nomad_addr}/v1/allocation/{board['ID']}/stop", timeout=10).raise_for_status()
        wait_until(lambda: (b := running("tensorboard")) and b["ID"] != board["ID"], 120, "TensorBoard on a new allocation")
        wait_until(lambda: running("evaluator") and nomadtf("logs", name, "--role", "evaluator").stdout.count("TF_CONFIG=") >= 2,
                   120, "the evaluator back")
        assert chief_starts() == 1, nomadtf("logs", name, "--role", "chief", "--stderr").stdout
        assert nomadtf("logs", name, "--role", "chief").stdout.splitlines()[0] == chief_pid_line
        chief = next(a for a in allocations(name) if a["TaskGroup"] == "chief")
        assert sum(s.get("Restarts", 0) for s in (chief.get("TaskStates") or {}).values()) == 0
        gate.write_text("go")
        wait_until(lambda: requests.get(f"{nomad_addr}/v1/job/{name}", timeout=10).json()["Status"] == "dead", 120, "the job to end")
        assert "outcome: succeeded" in nomadtf("status", name).stdout
    finally:
        purge(name)
