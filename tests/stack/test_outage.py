"""Decisions survive outages: a real `nomadtf task` (Nomad's part played by the test, as in
test_runtime_consul.py) reaches the local stack's Consul through a proxy the test can cut.
A success or a permanent failure decided while Consul is away is recorded when it returns,
never dropped, never stuck. And one restart budget per allocation, across Nomad's restarts."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from nomadtf import wire
from nomadtf.discovery import ConsulDiscovery
from nomadtf.spec import normalize
from tests.helpers import probe_job, unique, wait_until
from tests.stack.test_task import FakeAlloc

pytestmark = pytest.mark.stack

OUTAGE_S = 70  # longer than the minute a Consul call used to be retried before it was dropped


class CuttableProxy:
    """A TCP proxy to Consul's HTTP port that can be cut (every connection reset, nothing
    listening) and restored on the same port: Consul's outage as one task sees it, while the
    shared stack's Consul keeps serving everyone else."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 8500)):
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.restore()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        if self.listener is not None:
            try:
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it (Linux)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        with self.lock:
            for conn in self.conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self.conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass


class ProxiedAlloc(FakeAlloc):
    def __init__(self, *args, consul_address: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.consul_address = consul_address

    def env(self) -> dict[str, str]:
        return {**super().env(), "CONSUL_HTTP_ADDR": self.consul_address}


def _one_worker_job(name: str, context: dict) -> dict:
    spec = probe_job(name, strategy="multi_worker_mirrored", context=context, discovery={"rendezvous_timeout": "5m"})
    spec["roles"]["worker"]["count"] = 1
    return normalize(spec)


def test_a_success_and_a_permanent_failure_decided_while_consul_is_away_are_recorded_when_it_returns(stack, tmp_path):
    proxy = CuttableProxy()
    gate = tmp_path / "gate"
    jobs = {
        "succeeds": _one_worker_job(unique("out-ok"), {"until_file": str(gate)}),
        "fails": _one_worker_job(unique("out-fail"), {"until_file": str(gate), "exit": 2}),  # 2: permanent by default
    }
    tasks = {k: ProxiedAlloc(tmp_path, spec, "worker", consul_address=proxy.address).register().start() for k, spec in jobs.items()}
    try:
        for task in tasks.values():
            wait_until(lambda t=task: "generation 1: starting" in t.output(), 60, "the task's child")
        proxy.cut()
        gate.write_text("go")  # both children end now, while Consul cannot be reached
        time.sleep(OUTAGE_S)
        for key, task in tasks.items():
            assert task.proc.poll() is None, f"{key}: the task gave up while Consul was away:\n{task.output()}"
        proxy.restore()
        assert tasks["succeeds"].wait(timeout=60) == 0, tasks["succeeds"].output()
        assert tasks["fails"].wait(timeout=90) == 2, tasks["fails"].output()
        assert ConsulDiscovery(jobs["succeeds"]["name"]).job_state() == wire.STATE_SUCCEEDED
        assert (ConsulDiscovery(jobs["fails"]["name"]).job_state() or "").startswith("failed: worker[0] exited 2")
    finally:
        proxy.cut()
        for spec, task in zip(jobs.values(), tasks.values(), strict=True):
            task.stop()
            ConsulDiscovery(spec["name"]).delete_job_keys()


def test_a_task_nomad_restarts_spends_the_allocations_one_budget(stack, tmp_path):
    """recovery.restart_attempts bounds the recoveries of an allocation, whoever performs
    them: a supervisor started again in the same task directory (Nomad's restart) with the
    budget spent starts no code and fails the allocation at once."""
    spec = _one_worker_job(unique("budget"), {"sleep": -1})
    spec["recovery"] = {**spec["recovery"], "restart_attempts": 2, "restart_interval": "5m"}
    task = FakeAlloc(tmp_path, spec, "worker").register()
    now = time.time()
    (task.task_dir / wire.RECOVERIES_FILE).write_text(json.dumps({"spent": [now - 20, now - 10]}))
    task.start()
    try:
        assert task.wait(timeout=30) == 1, task.output()
        assert "restart budget of this allocation is spent" in task.output()
        assert "generation 1: starting" not in task.output()
    finally:
        task.stop()
        ConsulDiscovery(spec["name"]).delete_job_keys()
