"""The tf.data service roles on the real stack (issue #34 item 1): two MWMS workers whose
Keras model reads every batch through a data_dispatcher and two data_workers train on
while a data worker's task is killed (Nomad restarts it; it registers again at its
address) and the dispatcher's server is killed (restarted in place from its journal); the
run succeeds, the training code never restarts, and the data roles stop at the end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.docs_commands import shown_argv
from tests.faults import processes
from tests.helpers import JOBS, allocations, nomadtf, purge, task_log, unique, wait_until, write_job

pytestmark = pytest.mark.stack


def _follow(job: Path) -> tuple[subprocess.Popen, list[str]]:
    """`nomadtf run JOB` in the background, its output collected line by line."""
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "nomadtf"), "run", str(job), "--timeout", "8m"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def test_training_reads_through_the_data_service_while_a_data_worker_and_the_dispatcher_die(stack, tmp_path):
    name = unique("dsvc")
    gate, step_file = tmp_path / "gate", tmp_path / "steps"
    spec = {
        "name": name,
        "strategy": "multi_worker_mirrored",
        "entrypoint": {"script": "data_service.py", "workdir": str(JOBS)},
        "context": {"until_file": str(gate), "step_file": str(step_file), "steps_after": 30, "step_pause": 0.05},
        "roles": {
            "worker": {"count": 2, "cpu": 300, "memory": 1200},
            "data_dispatcher": {"count": 1, "cpu": 100, "memory": 800},
            "data_worker": {"count": 2, "cpu": 200, "memory": 800},
        },
        "recovery": {"restart_attempts": 3, "restart_delay": "1s", "reschedule_attempts": 0},
        "discovery": {"rendezvous_timeout": "3m"},
    }
    nomad_addr = os.environ["NOMAD_ADDR"]

    def steps() -> int:
        try:
            return int(step_file.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def trains_on(what: str, more: int = 25) -> None:
        mark = steps()
        wait_until(lambda: steps() >= mark + more, 120, f"{more} more training steps {what}")

    def running(role: str) -> list[dict]:
        return sorted((a for a in allocations(name) if a["TaskGroup"] == role and a["ClientStatus"] == "running"), key=lambda a: a["Name"])

    def log_of(alloc: dict, stream: str = "stdout") -> str:
        return task_log(alloc["ID"], alloc["TaskGroup"], stream)

    proc, out = _follow(write_job(tmp_path, spec))
    try:
        wait_until(lambda: steps() >= 20, 300, "training to read through the service")
        workers, data_workers, dispatcher = running("worker"), running("data_worker"), running("data_dispatcher")
        assert len(workers) == 2 and len(data_workers) == 2 and len(dispatcher) == 1
        address = re.search(r"tf.data dispatcher data_dispatcher\[0\] at grpc://[^\s,]+", log_of(dispatcher[0]))
        assert address, log_of(dispatcher[0])
        for worker in workers:
            text = log_of(worker)
            assert "input: tf.data service at grpc://" in text, text  # NOMADTF_DATA_SERVICE reached the code
            assert re.search(r"grpc://([^\s,]+)", text)[1].split(":")[-1] == address[0].rsplit(":", 1)[1], (text, address[0])
        # Training starts with the first data worker to register; both do.
        wait_until(lambda: all(log_of(w).count("registered with grpc://") == 1 for w in data_workers), 120, "both data workers to register")

        # 1. A data worker's task is killed: Nomad restarts it and it registers again.
        victim = data_workers[0]
        requests.post(f"{nomad_addr}/v1/client/allocation/{victim['ID']}/signal",
                      json={"Signal": "SIGKILL", "Task": "data_worker"}, timeout=10).raise_for_status()
        wait_until(lambda: log_of(victim).count("registered with grpc://") >= 2, 120, "the killed data worker to register again")
        trains_on("after the data worker came back")

        # 2. The dispatcher's server dies: restarted in place, it reads back its journal.
        child = processes(name)[("child", "data_dispatcher", 0)]
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: log_of(dispatcher[0]).count("tf.data dispatcher data_dispatcher[0] at") >= 2, 120, "the dispatcher back")
        journal = log_of(dispatcher[0], "stderr")
        assert journal.count("restore dispatcher state from journal") >= 2 and journal.count("No journal found") == 1, journal
        trains_on("after the dispatcher came back")

        gate.touch()
        proc.wait(timeout=240)
        text = "".join(out)
        assert proc.returncode == 0, text
        assert "succeeded" in text, text
        assert "data_worker[1]" in text and "data_dispatcher[0]" in text, text  # shown like every role

        # The training code started once per worker: nothing of the service restarted it. The
        # first worker's code, whose end decides the outcome, ran to its end; another worker's
        # may still be leaving its last collective when the job succeeds, and is then stopped
        # after the straggler grace (runtime/policy.py), its last line unwritten.
        for worker in workers:
            stderr = log_of(worker, "stderr")
            assert len(re.findall(r"generation \d+: starting ", stderr)) == 1, stderr
            stopped_after_success = re.search(r"the job succeeded(; stopping our child| \d+s ago and our code is still running)", stderr)
            first = worker["Name"].endswith("worker[0]")
            assert "done after" in log_of(worker) or (not first and stopped_after_success), (log_of(worker), stderr[-3000:])
        # The data roles stopped with the training, cleanly (a failed one would be a warning).
        def data_roles_ended() -> bool:
            data = [a for a in allocations(name) if a["TaskGroup"].startswith("data_")]
            return bool(data) and all(a["ClientStatus"] == "complete" for a in data)

        wait_until(data_roles_ended, 60, "the data roles to stop")
        assert not [key for key in processes(name) if key[1].startswith("data_")]
        assert "outcome: succeeded" in nomadtf("status", name).stdout
    finally:
        proc.kill()
        proc.wait()
        purge(name)


def test_the_data_service_example_trains_through_the_service_to_the_end(stack):
    """examples/data-service as the guide runs it, a few steps of it."""
    name = unique("dsvc-example")
    try:
        out = nomadtf(*shown_argv(r"nomadtf run examples/data-service/job.json --var entrypoint.workdir=\$PWD/examples/data-service"),
                      "--var", f"name={name}", "--var", "context.steps=20", "--var", "context.heavy=5", "--var", "context.log_every=10", "--timeout", "6m")
        assert out.returncode == 0, out.stdout + out.stderr
        for worker in (a for a in allocations(name) if a["TaskGroup"] == "worker"):
            text = task_log(worker["ID"], "worker")
            assert "input: tf.data service at grpc://" in text and "step=20 " in text and "done" in text, text
    finally:
        purge(name)
