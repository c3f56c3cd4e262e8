"""The digits examples, run as bare local processes the way nomadtf's supervisor runs them.

No Nomad here: each task is a plain child process with the same environment the supervisor
gives it (TF_CONFIG, NOMADTF_*). For parameter-server strategy the ps and worker tasks are
bare tf.distribute.Server processes, as nomadtf runs them; only the chief runs user code.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES

pytestmark = pytest.mark.tf

DIGITS = EXAMPLES / "digits"
TIMEOUT_S = 300
# What nomadtf itself starts for ps and worker tasks, and for legacy_server tasks.
SERVER = ["-m", "nomadtf.usercode.tfserver", "server"]
LEGACY = ["-m", "nomadtf.usercode.tfserver", "legacy", "legacy_main:main"]


def free_ports(count):
    """Ports the OS just handed out; held open together so they are distinct."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def make_cluster(**sizes):
    ports = iter(free_ports(sum(sizes.values())))
    return {job: [f"localhost:{next(ports)}" for _ in range(n)] for job, n in sizes.items()}


def task_env(cluster, role, index, model_dir, context):
    env = dict(os.environ)
    env.update(
        TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}),
        NOMADTF_ROLE=role,
        NOMADTF_INDEX=str(index),
        NOMADTF_JOB_ID="digits-test",
        NOMADTF_MODEL_DIR=str(model_dir),
        NOMADTF_CONTEXT=json.dumps(context),
        TF_CPP_MIN_LOG_LEVEL="2",  # keep the captured output readable on failure
    )
    return env


def start(args, env, log_path):
    """A child process whose output goes to a file, so no unread pipe can ever block it."""
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, *args], env=env, stdout=log, stderr=subprocess.STDOUT)


def stop(processes):
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def wait_all(processes, log_paths):
    """(returncode, output) of each process, all under one shared deadline."""
    deadline = time.monotonic() + TIMEOUT_S
    for process in processes:
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    return [(p.returncode, Path(log).read_text()) for p, log in zip(processes, log_paths, strict=True)]


def final_accuracy(output):
    found = re.findall(r"^final_accuracy=([0-9.]+)$", output, re.MULTILINE)
    assert len(found) == 1, output
    return float(found[0])


def test_parameter_server_chief_trains_checkpoints_and_resumes(tmp_path):
    cluster = make_cluster(chief=1, worker=1, ps=1)  # one worker proves it: each more is a TensorFlow import
    model_dir = tmp_path / "model"
    servers, chiefs = [], []

    def run_chief(context, log):
        env = task_env(cluster, "chief", 0, model_dir, context)
        chiefs.append(start([str(DIGITS / "train_ps.py")], env, log))
        [result] = wait_all(chiefs[-1:], [log])
        return result

    try:
        for role in ("ps", "worker"):
            for index in range(len(cluster[role])):
                env = task_env(cluster, role, index, model_dir, {})
                servers.append(start(SERVER, env, tmp_path / f"{role}{index}.log"))
        first = run_chief({"steps": 300}, tmp_path / "chief.log")
        # A restarted chief (as after a Nomad task restart) meets the same live servers and
        # must carry on from the last checkpoint.
        second = run_chief({"steps": 350}, tmp_path / "chief-restarted.log")
    finally:
        stop(servers + chiefs)

    returncode, output = first
    assert returncode == 0, output
    assert re.search(r"^step=300 loss=[0-9.]+$", output, re.MULTILINE), output
    assert final_accuracy(output) >= 0.85, output
    assert (model_dir / "checkpoint").exists()

    returncode, output = second
    assert returncode == 0, output
    assert re.search(r"^resumed from step 300$", output, re.MULTILINE), output
    assert "step=300 " not in output and re.search(r"^step=350 ", output, re.MULTILINE), output
    assert final_accuracy(output) >= 0.85, output


def test_multi_worker_mirrored_every_worker_trains(tmp_path):
    cluster = make_cluster(worker=2)
    context = {"steps": 200}
    model_dir = tmp_path / "model"
    logs = [tmp_path / f"worker{index}.log" for index in range(2)]
    workers = []
    try:
        for index, log in enumerate(logs):
            env = task_env(cluster, "worker", index, model_dir, context)
            workers.append(start([str(DIGITS / "train_mwms.py")], env, log))
        results = wait_all(workers, logs)
    finally:
        stop(workers)

    for returncode, output in results:
        assert returncode == 0, output
        assert re.search(r"^step=200 loss=[0-9.]+$", output, re.MULTILINE), output
    assert final_accuracy(results[0][1]) >= 0.85, results[0][1]
    assert "final_accuracy" not in results[1][1]
    assert (model_dir / "checkpoint").exists()


def test_legacy_main_gets_a_ready_server(tmp_path):
    cluster = make_cluster(chief=1, ps=1, worker=1)
    context = {"greeting": "hi"}
    ps, chief = None, None
    try:
        ps = start(LEGACY, task_env(cluster, "ps", 0, tmp_path, context), tmp_path / "ps0.log")
        env = task_env(cluster, "chief", 0, tmp_path, context)
        env["PYTHONPATH"] = str(DIGITS)  # nomadtf puts entrypoint.workdir there
        chief = start(LEGACY, env, tmp_path / "chief.log")
        [(returncode, output)] = wait_all([chief], [tmp_path / "chief.log"])
    finally:
        stop([p for p in (ps, chief) if p])

    assert returncode == 0, output
    assert "cluster_jobs=chief,ps,worker" in output, output
    assert f"context={json.dumps(context)}" in output
    assert "ps_result=[2.0, 4.0, 6.0]" in output, output
    assert "legacy_ok" in output
