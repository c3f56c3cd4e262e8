"""`nomadtf task` as a real process against the real Consul of the local stack, with Nomad's
part played by the test: the allocation's environment, the spec file Nomad's template
writes, and the service registrations Nomad would make (agent API, passing TTL checks).
Fast and exact where a whole Nomad job would be slow and blurry."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import consul
import pytest

from nomadtf import wire
from nomadtf.job.validate import normalize
from nomadtf.servers.consul import ConsulDiscovery
from tests.helpers import probe_job, unique, wait_until

pytestmark = pytest.mark.stack


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeAlloc:
    """One allocation as Nomad would run it: env, task dir with the spec file, and (when
    `register`) the service Nomad registers for it."""

    def __init__(self, tmp: Path, spec: dict, role: str, index: int = 0):
        self.spec, self.role, self.index = spec, role, index
        self.alloc_id = str(uuid.uuid4())
        self.task_dir = tmp / f"{role}{index}-{self.alloc_id[:6]}"
        self.task_dir.mkdir(parents=True)
        (self.task_dir / wire.SPEC_FILE).write_text(json.dumps(spec))
        self.tf_port, self.health_port = _free_port(), _free_port()
        self.proc: subprocess.Popen | None = None
        self.consul = consul.Consul()
        self.service_id = f"test-{self.alloc_id}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "NOMAD_JOB_ID": self.spec["name"],
            "NOMAD_ALLOC_ID": self.alloc_id,
            "NOMAD_ALLOC_INDEX": str(self.index),
            "NOMAD_PORT_tf": str(self.tf_port),
            "NOMAD_PORT_health": str(self.health_port),
            "NOMAD_TASK_DIR": str(self.task_dir),
            "NOMAD_SECRETS_DIR": str(self.task_dir),
            wire.ENV_TASK_ROLE: self.role,
        }

    def start(self) -> FakeAlloc:
        self.log = (self.task_dir / "stderr").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nomadtf", "task", "--role", self.role],
            env=self.env(), stdout=self.log, stderr=subprocess.STDOUT,
        )
        return self

    def register(self) -> FakeAlloc:
        """PUT /v1/agent/service/register, as Nomad does for the group's service."""
        name = wire.service_name(self.spec["namespace"], self.spec["name"], self.role)
        self.consul.agent.service.register(
            name, service_id=self.service_id, address="127.0.0.1", port=self.tf_port,
            tags=[wire.SERVICE_TAG, f"role={self.role}", f"alloc={self.alloc_id}"],
            check=consul.Check.ttl("30s"),
        )
        self.consul.agent.check.ttl_pass(f"service:{self.service_id}")
        return self

    def deregister(self) -> None:
        self.consul.agent.service.deregister(self.service_id)

    def output(self) -> str:
        return (self.task_dir / "stderr").read_text()

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.deregister()


@pytest.fixture
def job(stack, tmp_path):
    allocs: list[FakeAlloc] = []
    name = unique("rt")
    spec = normalize(probe_job(name, context={"sleep": -1}, discovery={"rendezvous_timeout": "2m", "debounce": "500ms"}))

    def make(role: str, index: int = 0, **changes) -> FakeAlloc:
        alloc = FakeAlloc(tmp_path, {**spec, **changes}, role, index)
        allocs.append(alloc)
        return alloc

    make.spec = spec
    make.discovery = ConsulDiscovery(name)
    yield make
    for alloc in allocs:
        alloc.stop()
    make.discovery.delete_job_keys()


def test_sigterm_while_every_index_is_taken_ends_the_claim_at_once(job):
    """The index claim is a retried step of the event loop, not a loop of its own."""
    squatter = ConsulDiscovery(job.spec["name"])
    squatter.open_session("squatter")
    try:
        assert squatter.claim_slot("worker", 1, "someone-else", 0, "x") == 0
        task = job("worker").start()
        wait_until(lambda: "nomadtf task worker" in task.output() or task.proc.poll() is not None, 30, "the task to start")
        time.sleep(1.5)
        assert task.proc.poll() is None  # still trying to claim
        started = time.monotonic()
        task.proc.send_signal(signal.SIGTERM)
        assert task.wait(timeout=10) == 0
        assert time.monotonic() - started < 3, task.output()
    finally:
        squatter.close()


def test_a_rendezvous_ends_when_the_job_already_succeeded(job):
    """A task still waiting for peers when the chief has finished must not wait for the
    rendezvous timeout (2 minutes here)."""
    task = job("ps").register().start()
    wait_until(lambda: "waiting for" in task.output(), 30, "the ps to wait for its peers")
    started = time.monotonic()
    job.discovery.set_job_state(wire.STATE_SUCCEEDED)
    assert task.wait(timeout=20) == 0
    assert time.monotonic() - started < 5
    assert "ended while we waited for the cluster (succeeded)" in task.output()


def test_a_failed_job_stops_waiting_tasks_and_restarted_ones(job):
    task = job("ps").register().start()
    wait_until(lambda: "waiting for" in task.output(), 30, "the ps to wait for its peers")
    job.discovery.set_job_state("failed: chief[0] exited 2, a permanent exit code")
    assert task.wait(timeout=20) == 0  # the ps did nothing wrong: it just ends
    again = job("chief").start()  # Nomad restarts the failed chief: it must not start anything
    assert again.wait(timeout=20) == 1
    assert "failed here before we started" in again.output()
    peer = job("worker").start()
    assert peer.wait(timeout=20) == 0 and "ended before we started" in peer.output()


def test_the_cluster_forms_runs_the_child_and_ends_cleanly_on_success(job):
    chief = job("chief").register().start()
    worker = job("worker").register().start()
    ps = job("ps").register().start()
    for task in (chief, worker, ps):
        wait_until(lambda t=task: "generation 1: starting" in t.output(), 60, f"{task.role} to start its child")
    # Every task got the same cluster; the chief runs the probe (user code), the others a server.
    tf_configs = {t.role: json.loads(t.output().split("with TF_CONFIG ")[1].splitlines()[0]) for t in (chief, worker, ps)}
    assert len({json.dumps(c["cluster"], sort_keys=True) for c in tf_configs.values()}) == 1
    assert tf_configs["chief"]["cluster"]["ps"] == [f"127.0.0.1:{ps.tf_port}"]
    job.discovery.set_job_state(wire.STATE_SUCCEEDED)
    assert worker.wait(timeout=30) == 0 and ps.wait(timeout=30) == 0
    chief.proc.send_signal(signal.SIGTERM)
    assert chief.wait(timeout=30) == 0
    assert [s for s in job.discovery.sessions()] == []


def test_a_hang_is_a_crash_new_incarnation_and_peers_told(job, tmp_path):
    """The chief's code reports one step and then stops making progress."""
    hang = tmp_path / "hang.py"
    hang.write_text(
        "import os, time\nfrom nomadtf import progress\n"
        "progress._last_write = -10\nprogress.report(step=1)\ntime.sleep(600)\n"
    )
    changes = {
        "entrypoint": {**job.spec["entrypoint"], "script": str(hang)},
        "recovery": {**job.spec["recovery"], "hang_timeout": "3s", "restart_attempts": 2},
    }
    chief = job("chief", **changes).register().start()
    job("worker", **changes).register().start()
    job("ps", **changes).register().start()
    wait_until(lambda: "generation 1: starting" in chief.output(), 60, "the chief's child")
    first = job.discovery.slots()[("chief", 0)].incarnation
    # The child imports TensorFlow before it runs the code (started ahead of the cluster).
    wait_until(lambda: "(hang)" in chief.output(), 90, "the hang to be detected")
    wait_until(lambda: job.discovery.slots()[("chief", 0)].incarnation != first, 10, "a new incarnation in Consul")
    wait_until(lambda: chief.output().count("starting -u") >= 2, 30, "the chief's child to start again")


def test_the_job_stops_itself_at_its_deadline_without_a_follower(job):
    """recovery.deadline counts from the submission and is enforced by the tasks: the
    deciding task (the chief) fails, its peers stop, the reason is recorded."""
    run = {"id": "r" + uuid.uuid4().hex[:7], "submitted_at": time.time()}
    changes = {"run": run, "recovery": {**job.spec["recovery"], "deadline": "8s"}}
    chief = job("chief", **changes).register().start()
    worker = job("worker", **changes).register().start()
    ps = job("ps", **changes).register().start()
    assert chief.wait(timeout=60) == 1
    assert worker.wait(timeout=30) == 0 and ps.wait(timeout=30) == 0
    assert time.time() - run["submitted_at"] < 40
    state = ConsulDiscovery(job.spec["name"], run_id=run["id"]).job_state()
    assert state.startswith("failed: chief[0]") and "recovery.deadline" in state, state
    assert ConsulDiscovery(job.spec["name"]).job_state() is None  # another run's keys are untouched
