"""Role-aware recovery where a task moves or never trains, on the real local stack (raw_exec).

A worker rescheduled onto another port: the chief rebuilds its TF_CONFIG and resumes from its
checkpoint while the others keep their processes. Code that raises on every start fails the
run in bounded time. The faults a task heals from in place (kill -9 of each role's code and
of its `nomadtf task`, a hang, a Consul restart) are proven one after another in one job by
the soak (tests/stack/test_soak.py): after each, only the processes the recovery policy
restarts may be new, and Nomad may restart only a killed `nomadtf task`.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from nomadtf.client.follow import Follower
from nomadtf.client.runview import versions_of_run
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.servers.nomad import NomadAPI
from tests import faults
from tests.helpers import (
    EXAMPLES,
    allocations,
    nomadtf,
    probe_job,
    purge,
    task_log,
    unique,
    wait_until,
    write_job,
)

pytestmark = [pytest.mark.stack, pytest.mark.tf]

ACCURACY_FLOOR = 0.85


def _spec(name: str, strategy: str = "parameter_server", **context) -> dict:
    spec = json.loads((EXAMPLES / "digits" / ("job.json" if strategy == "parameter_server" else "job-mwms.json")).read_text())
    spec["name"] = name
    spec["entrypoint"]["workdir"] = str(EXAMPLES / "digits")
    spec["context"].update({"steps": 2500, "log_every": 50, "checkpoint_every": 50, **context})
    spec["recovery"] = {"restart_attempts": 3, "restart_delay": "1s", "reschedule_attempts": 2, "reschedule_delay": "5s"}
    spec["discovery"] = {"rendezvous_timeout": "3m"}
    return spec


def follow_detached(job_id: str, eval_prefix: str, reschedule_attempts: int, timeout: float) -> None:
    """Follow a run started with --detach to its outcome, as `nomadtf run` would have:
    its own run id, its recorded state in Consul. Raises the outcome's error unless it succeeded."""
    api = NomadAPI.from_env()
    # "" for a run the admission controller admitted: its placement is the controller's to
    # judge, and the follower starts at its allocations (as `nomadtf run` does).
    eval_id = [e for e in api.evaluations(job_id) if e.id.startswith(eval_prefix)][0].id if eval_prefix else ""
    job = api.job(job_id)
    run_id = job.run_id if job else ""
    first = min(versions_of_run(api.versions(job_id), run_id), default=0)
    Follower(
        api, job_id, timeout, reschedule_attempts, lambda _v: None, lambda _e: None,
        recorded_state=ConsulDiscovery(job_id, api.namespace, run_id=run_id).job_state, first_version=first, run_id=run_id,
    ).follow(eval_id)


class Run:
    """A detached job plus the follower that decides its outcome."""

    def __init__(self, tmp_path: Path, spec: dict):
        self.job_id = spec["name"]
        self.spec = spec
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach")
        assert out.returncode == 0, out.stderr
        found = re.search(r"evaluation ([0-9a-f]{8})", out.stderr)  # none for a run the admission controller starts
        self.eval_id = found[1] if found else ""

    def wait_for_step(self, target: int, timeout: float = 240) -> int:
        # Never beyond the last step: a fast run may be near its end when a fault is over.
        target = min(target, self.spec["context"]["steps"])
        return wait_until(lambda: faults.step(self.job_id) >= target and faults.step(self.job_id), timeout, f"training step {target}")

    def finish(self, timeout: float = 420) -> str:
        follow_detached(self.job_id, self.eval_id, self.spec["recovery"]["reschedule_attempts"], timeout)
        stdout = faults.chief_stdout(self.job_id)
        accuracy = float(re.findall(r"final_accuracy=([0-9.]+)", stdout)[-1])
        assert accuracy >= ACCURACY_FLOOR, accuracy
        return stdout


def _resumed_from(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"resumed from step (\d+)", stdout)]


def _unchanged(before: dict, after: dict, keys) -> None:
    for key in keys:
        assert before.get(key) == after.get(key), f"{key} changed: {before.get(key)} -> {after.get(key)}"


@pytest.fixture
def job(tmp_path, stack):
    runs = []

    def start(spec: dict) -> Run:
        run = Run(tmp_path, spec)
        runs.append(run)
        return run

    yield start
    for run in runs:
        purge(run.job_id)


def test_worker_rescheduled_on_a_new_port_rejoins_through_the_chief(job):
    run = job(_spec(unique("rec-move")))
    run.wait_for_step(300)
    procs = faults.processes(run.job_id)
    worker = [a for a in allocations(run.job_id) if a["Name"].endswith("worker[1]") and a["ClientStatus"] == "running"][0]
    NomadAPI.from_env().stop_allocation(worker["ID"])
    wait_until(lambda: _resumed_from(faults.chief_stdout(run.job_id)), 120, "the chief to rebuild its TF_CONFIG and resume")
    _unchanged(procs, faults.processes(run.job_id), [("child", "ps", 0), ("child", "worker", 0), ("task", "chief", 0)])
    resumed = _resumed_from(run.finish())
    assert resumed and resumed[-1] >= 250, resumed


def test_code_that_raises_on_every_start_fails_in_bounded_time(stack, tmp_path):
    name = unique("rec-raise")
    spec = probe_job(name, context={"raise": True})
    spec["recovery"] = {"restart_attempts": 2, "restart_delay": "1s", "reschedule_attempts": 1, "reschedule_delay": "5s"}
    started = time.monotonic()
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "5m")
    try:
        assert out.returncode == 1, out.stderr
        assert "ValueError: boom from user code" in out.stderr
        chief_allocs = [a for a in allocations(name) if a["TaskGroup"] == "chief"]
        # The first placement, and at most the one reschedule configured: the recorded
        # permanent failure usually ends the run before Nomad reschedules.
        assert 1 <= len(chief_allocs) <= 2
        assert time.monotonic() - started < 240
    finally:
        purge(name)


def test_code_that_said_done_is_not_taken_for_hung_while_it_ends(stack, tmp_path):
    """Code that reported a step, then called `progress.done()`, and then takes longer than
    hang_timeout to end (a final evaluation, TensorFlow's shutdown) runs to its end once: no
    hang, no restart, the run succeeds. Without `done()` the same silence is a hang."""
    name = unique("rec-done")
    spec = probe_job(name, context={"report_step": 7, "done": True, "sleep": 12})
    spec["recovery"] = {"restart_attempts": 1, "restart_delay": "1s", "reschedule_attempts": 0, "hang_timeout": "3s"}
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "4m")
    try:
        assert out.returncode == 0, out.stderr
        chief = [a for a in allocations(name) if a["TaskGroup"] == "chief"]
        stdout = "".join(task_log(a["ID"], "chief") for a in chief)
        stderr = "".join(task_log(a["ID"], "chief", "stderr") for a in chief)
        assert stdout.count("probe reported step 7 and done") == 1 and "probe finished" in stdout, stdout
        assert "(hang)" not in stderr, stderr[-3000:]
    finally:
        purge(name)
