"""Decisions survive outages: a real `nomadtf task` (Nomad's part played by the test, as in
test_runtime_consul.py) reaches the local stack's Consul through a proxy the test can cut.
A success or a permanent failure decided while Consul is away is recorded when it returns,
never dropped, never stuck. A task cut off for one session TTL stops its code (fences)
before a replacement may take its index, and starts it again if the index is still its own
once Consul answers. And one restart budget per allocation, across Nomad's restarts."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time

import psutil
import pytest

from nomadtf import wire
from nomadtf.devstack import processes
from nomadtf.job.validate import normalize
from nomadtf.servers.consul import ConsulDiscovery
from tests.helpers import probe_job, unique, wait_until
from tests.stack.test_task import FakeAlloc

pytestmark = pytest.mark.stack

OUTAGE_S = 70  # longer than the minute a Consul call used to be retried before it was dropped
FENCE_LINE = "no Consul session renewal for 15s: stopping our code before a replacement may take worker[0]"
STARTING = re.compile(r"generation (\d+): starting")


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


def _code(task: FakeAlloc) -> psutil.Process:
    """The task's child: the probe, not a helper process of the supervisor's."""
    return wait_until(
        lambda: next((p for p in psutil.Process(task.proc.pid).children(recursive=True) if "probe.py" in " ".join(p.cmdline())), None),
        10, "the task's code",
    )


def _keep_passing(*tasks: FakeAlloc) -> None:
    """Nomad's side: each task's registration passes its check (a 30 s TTL) all along."""
    for task in tasks:
        task.consul.agent.check.ttl_pass(f"service:{task.service_id}")


def test_a_task_cut_off_from_consul_stops_its_code_before_a_replacement_may_take_its_index(stack, tmp_path):
    """Nomad places a replacement of a task whose node it lost (here: a second allocation of
    worker[0] reaching Consul directly); the replacement waits for the index until Consul lets
    the cut-off task's session lapse (2 x TTL after its last renewal). The cut-off task's code
    stops first, one TTL after the last renewal, while its session still holds the index: the
    two never run at once. When Consul answers again, the index is taken: the task ends, 0."""
    proxy = CuttableProxy()
    spec = _one_worker_job(unique("out-fence"), {"sleep": -1, "report_sigterm": True})
    old = ProxiedAlloc(tmp_path, spec, "worker", consul_address=proxy.address).register().start()
    new = FakeAlloc(tmp_path, spec, "worker")
    direct = ConsulDiscovery(spec["name"])
    try:
        wait_until(lambda: STARTING.search(old.output()), 60, "the task's code")
        code = _code(old)
        session = direct.slots()[("worker", 0)].session
        proxy.cut()
        cut_at = time.monotonic()
        new.register().start()

        def fenced_or_replaced() -> bool:
            _keep_passing(old, new)
            return not processes.running(code) or bool(STARTING.search(new.output()))

        wait_until(fenced_or_replaced, 40, "the cut-off task's code to stop, or the replacement's to start")
        fenced_after = time.monotonic() - cut_at
        assert not STARTING.search(new.output()), f"the replacement started beside the cut-off code:\n{new.output()}"
        assert direct.consul.session.info(session)[1] is not None, "the code stopped only after its session lapsed"
        assert FENCE_LINE in old.output() and "probe got SIGTERM" in old.output(), old.output()
        assert wire.TASK_SESSION_TTL_S - 6 < fenced_after < wire.TASK_SESSION_TTL_S + 3, fenced_after

        def replaced() -> bool:
            _keep_passing(new)
            return bool(STARTING.search(new.output()))

        wait_until(replaced, 40, "the replacement's code")
        replaced_after = time.monotonic() - cut_at
        assert direct.slots()[("worker", 0)].alloc_id == new.alloc_id
        sys.stderr.write(f"[outage] cut off: code stopped after {fenced_after:.1f}s, the replacement's started after {replaced_after:.1f}s\n")
        proxy.restore()
        assert old.wait(timeout=30) == 0, old.output()
        assert f"worker[0] is held by allocation {new.alloc_id[:8]}" in old.output()
        assert len(STARTING.findall(old.output())) == 1, "the cut-off task started its code again"
    finally:
        proxy.cut()
        for task in (old, new):
            task.stop()
        direct.delete_job_keys()


def test_a_fenced_task_whose_index_is_still_its_own_starts_its_code_again(stack, tmp_path):
    """Cut off for one TTL (the code stops) but back before Consul lets the session lapse:
    the index is still the task's, so its code starts again in a new generation, with a new
    incarnation for the peers that depend on its state. No failure: no budget spent."""
    proxy = CuttableProxy()
    spec = _one_worker_job(unique("out-unfence"), {"sleep": -1})
    task = ProxiedAlloc(tmp_path, spec, "worker", consul_address=proxy.address).register().start()
    direct = ConsulDiscovery(spec["name"])
    try:
        wait_until(lambda: STARTING.search(task.output()), 60, "the task's code")
        code = _code(task)
        before = direct.slots()[("worker", 0)]
        proxy.cut()

        def fenced() -> bool:
            _keep_passing(task)
            return FENCE_LINE in task.output()

        wait_until(fenced, 25, "the fence")
        assert not processes.running(code)
        proxy.restore()

        def started_again() -> bool:
            _keep_passing(task)
            return len(STARTING.findall(task.output())) == 2

        wait_until(started_again, 20, "the code to start again")
        after = direct.slots()[("worker", 0)]
        assert (after.alloc_id, after.session) == (task.alloc_id, before.session)
        assert after.incarnation != before.incarnation
        numbers = [int(n) for n in STARTING.findall(task.output())]
        assert numbers[1] > numbers[0], numbers
        assert processes.running(_code(task)) and task.proc.poll() is None
        assert "recovering" not in task.output()  # no failure of the code: nothing spent
    finally:
        proxy.cut()
        task.stop()
        direct.delete_job_keys()


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
