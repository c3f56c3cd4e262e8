"""The TensorFlow processes nomadtf starts itself (nomadtf.usercode.tfserver): a bare server is a real
gRPC server where TF_CONFIG says; the DC/OS legacy contract hands main() what it promises."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from nomadtf.usercode import tfserver

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The real TensorFlow, and the stand-in the probe jobs of the stack tests put first on their
# PYTHONPATH (tests/jobs/stand_in): it must serve as TensorFlow's server does, or those tests
# would prove less than they say.
TENSORFLOWS = [
    pytest.param([], "(TensorFlow 2.", id="tensorflow"),
    pytest.param([os.path.join(ROOT, "jobs", "stand_in")], "(TensorFlow stand-in)", id="stand-in"),
]


@pytest.mark.parametrize("path, version", TENSORFLOWS)
def test_a_bare_server_listens_where_tf_config_puts_it_until_it_is_stopped(path, version):
    port = _free_port()
    tf_config = {"cluster": {"ps": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{_free_port()}"]}, "task": {"type": "ps", "index": 0}}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, ROOT]), "TF_CONFIG": json.dumps(tf_config), "NOMADTF_ROLE": "ps",
           "NOMADTF_INDEX": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "nomadtf.usercode.tfserver", "server"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # printed once the server has started
        assert line.startswith("nomadtf: TensorFlow server ps[0] at grpc://") and version in line, line
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # gRPC accepts on the port TF_CONFIG gave our task
        time.sleep(0.5)
        assert proc.poll() is None  # join(): it serves until nomadtf task stops it
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class Server:
    def __init__(self):
        self.joined = False

    def join(self):
        self.joined = True


@pytest.fixture
def contract(tmp_path, monkeypatch):
    """A DC/OS-style module `legacy_job.main(server, log_dir, context)` that records its call."""
    (tmp_path / "legacy_job.py").write_text(
        "calls = []\n"
        "def main(server, log_dir, context):\n"
        "    calls.append((server, log_dir, context))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NOMADTF_MODEL_DIR", "/models/run-1")
    monkeypatch.setenv("NOMADTF_CONTEXT", json.dumps({"steps": 5}))
    server = Server()
    monkeypatch.setattr(tfserver, "_server", lambda: server)
    yield server
    sys.modules.pop("legacy_job", None)


def test_legacy_gives_every_task_in_the_cluster_its_server_and_the_contracts_arguments(contract, monkeypatch):
    monkeypatch.setenv("NOMADTF_ROLE", "worker")
    assert tfserver.legacy("legacy_job:main") == 0
    import legacy_job

    assert legacy_job.calls == [(contract, "/models/run-1", {"steps": 5})]
    assert not contract.joined


def test_legacy_gives_the_evaluator_no_server_and_a_ps_only_joins(contract, monkeypatch):
    monkeypatch.setenv("NOMADTF_ROLE", "evaluator")  # not in the cluster: it reads checkpoints
    monkeypatch.delenv("NOMADTF_CONTEXT")
    assert tfserver.legacy("legacy_job:main") == 0
    import legacy_job

    assert legacy_job.calls == [(None, "/models/run-1", {})]
    monkeypatch.setenv("NOMADTF_ROLE", "ps")
    assert tfserver.legacy("legacy_job:main") == 0
    assert contract.joined and len(legacy_job.calls) == 1  # the ps runs no code of the job's
