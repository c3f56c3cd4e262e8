"""Keras 3 on JAX across tasks (strategy "jax"), on the real stack.

The example (examples/jax) trains a digits MLP with keras.distribution.DataParallel on two
workers, each one JAX process on CPU (gloo collectives), in its own Python environment
(jax, keras, scikit-learn; no TensorFlow) built with uv into the client's usual cache: the
first session on a machine downloads and builds it (a minute or two), every later one
reuses it at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import faults
from tests.docs_commands import shown_argv
from tests.helpers import EXAMPLES, allocations, nomadtf, purge, task_log, unique, wait_until, write_job

pytestmark = [pytest.mark.stack]

ACCURACY_FLOOR = 0.8


def _worker_logs(job_id: str) -> dict[int, dict[str, str]]:
    """worker index (its allocation's) -> {"stdout", "stderr"} of its last allocation."""
    logs: dict[int, dict[str, str]] = {}
    for alloc in sorted(allocations(job_id), key=lambda a: a["CreateIndex"]):
        index = int(re.search(r"\[(\d+)\]$", alloc["Name"])[1])
        logs[index] = {stream: task_log(alloc["ID"], "worker", stream) for stream in ("stdout", "stderr")}
    return logs


def test_keras_on_jax_trains_on_two_processes(stack):
    job_id = unique("keras-jax")
    started = time.monotonic()
    out = nomadtf(*shown_argv(r"nomadtf run examples/jax/job.json --var entrypoint.workdir=\$PWD/examples/jax"),
                  "--var", f"name={job_id}", "--var", "context.epochs=3", "--timeout", "12m", timeout=900)  # fmt: skip
    wall = time.monotonic() - started
    try:
        logs = _worker_logs(job_id)
        assert out.returncode == 0, out.stdout + out.stderr + "\n".join(v["stderr"][-3000:] for v in logs.values())
        assert sorted(logs) == [0, 1]
        # Each worker is its own JAX process of two, worker i being process i, and sees the
        # devices of both (one CPU device each): keras.distribution.initialize() read our names.
        for index in (0, 1):
            assert f"process {index} of 2;" in logs[index]["stdout"], logs[index]["stdout"][-2000:]
            assert f"as JAX process {index} of 2" in logs[index]["stderr"]
            assert "TF_CONFIG {" not in logs[index]["stderr"]
        # DataParallel all-reduces the gradients: both processes end on the same loss.
        losses = [re.search(r"final loss ([0-9.]+)", logs[i]["stdout"])[1] for i in (0, 1)]
        assert losses[0] == losses[1], losses
        accuracy = float(re.search(r"held-out accuracy ([0-9.]+) on 2 processes", logs[0]["stdout"])[1])
        assert accuracy >= ACCURACY_FLOOR, accuracy
        env_line = re.search(r"environment \w+ ready \((built|reused) in [0-9.]+ s\)", out.stdout + out.stderr)
        print(f"\n[measure] keras-jax example (2 processes, 3 epochs): {wall:.1f}s wall, accuracy {accuracy}, "
              f"losses {losses}, {env_line[0] if env_line else 'environment line not seen'}")  # fmt: skip
    finally:
        purge(job_id)


def test_a_jax_process_killed_restarts_every_process_and_the_run_succeeds(stack, tmp_path):
    """Like multi_worker_mirrored: JAX cannot take a process back into a running computation,
    so when worker 1's code dies, worker 0's restarts too and both form a new computation."""
    job_id = unique("keras-jax-kill")
    spec = json.loads((EXAMPLES / "jax" / "job.json").read_text())
    spec.update(name=job_id, recovery={"restart_attempts": 2, "restart_delay": "1s", "reschedule_attempts": 0})
    spec["entrypoint"]["workdir"] = str(EXAMPLES / "jax")
    spec["context"]["epochs"] = 40
    proc = subprocess.Popen([str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, spec)), "--timeout", "10m"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_until(lambda: "Epoch 3/" in _worker_logs(job_id).get(1, {}).get("stdout", ""), 300, "worker 1 in its third epoch")
        killed = faults.processes(job_id)[("child", "worker", 1)]
        os.kill(killed, signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
        logs = _worker_logs(job_id)
        assert proc.returncode == 0, out + "\n".join(v["stderr"][-3000:] for v in logs.values())
        for index in (0, 1):
            starts = re.findall(rf"generation (\d+): starting .* as JAX process {index} of 2", logs[index]["stderr"])
            assert len(starts) >= 2 and len(set(starts)) >= 2, (index, starts)  # worker 0 too: a new computation
        losses = [re.findall(r"final loss ([0-9.]+)", logs[i]["stdout"])[-1] for i in (0, 1)]
        assert losses[0] == losses[1], losses
        print(f"\n[measure] keras-jax: worker 1's code killed (pid {killed}) in epoch 3; both restarted, final loss {losses[0]}")
    finally:
        if proc.poll() is None:
            proc.kill()
        purge(job_id)
