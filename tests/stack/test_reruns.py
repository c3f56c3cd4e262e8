"""Runs, the way teams use them on the real stack: the same job name run again (after a
success, after a failure, while it still runs), `--resume`, and the same name in two
namespaces at once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.helpers import (
    allocations,
    consul_kv_dump,
    nomadtf,
    probe_job,
    purge,
    unique,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.stack


def _run_id(out: subprocess.CompletedProcess) -> str:
    match = re.search(r"submitted \S+ run (\w+)", out.stdout + out.stderr)
    assert match, out.stdout + out.stderr
    return match[1]


def _model_dir(job_id: str, namespace: str = "default") -> str:
    """The chief's model_dir as the probe printed it, from `nomadtf logs`."""
    out = nomadtf("logs", job_id, "--role", "chief", "--namespace", namespace)
    assert out.returncode == 0, out.stderr
    return re.findall(r"model_dir=(\S+)", out.stdout)[-1]


def test_the_same_job_run_twice_reports_each_runs_own_outcome(stack, tmp_path):
    name = unique("rerun")
    job = write_job(tmp_path, probe_job(name, context={"sleep": 2}))
    try:
        first = nomadtf("run", str(job), "--timeout", "3m")
        assert first.returncode == 0, first.stderr
        first_dir = _model_dir(name)
        second = nomadtf("run", str(job), "--timeout", "3m")
        assert second.returncode == 0, second.stderr
        assert _run_id(first) != _run_id(second)
        # The second run was followed to its own end: it trained (its chief ran its code),
        # in a fresh model_dir, and took as long as a run takes, not "0s".
        assert re.search(r"succeeded in ([3-9]|\d\d+)s", second.stderr), second.stderr
        assert _model_dir(name) != first_dir and _run_id(second) in _model_dir(name)
        status = nomadtf("status", name)
        assert status.returncode == 0, status.stderr
        assert f"run {_run_id(second)}" in status.stdout and "outcome: succeeded" in status.stdout
        # Only the current run's three allocations are shown, the first run's are not.
        assert len(re.findall(r"^\s+(chief|worker|ps)\[\d\] ", status.stdout, re.M)) == 3, status.stdout
        assert len(allocations(name)) == 6
    finally:
        purge(name)


def test_a_fixed_rerun_after_a_failure_succeeds(stack, tmp_path):
    name = unique("refix")
    try:
        broken = nomadtf("run", str(write_job(tmp_path, probe_job(name, context={"raise": True}))), "--timeout", "3m")
        assert broken.returncode == 1 and "boom from user code" in broken.stderr, broken.stderr
        fixed = nomadtf("run", str(write_job(tmp_path, probe_job(name))), "--timeout", "3m")
        assert fixed.returncode == 0, fixed.stderr
        assert "succeeded" in fixed.stderr
        assert "outcome: succeeded" in nomadtf("status", name).stdout
    finally:
        purge(name)


def test_a_running_job_is_refused_unless_replace(stack, tmp_path):
    name = unique("replace")
    try:
        forever = nomadtf("run", str(write_job(tmp_path, probe_job(name, context={"sleep": -1}))), "--detach")
        assert forever.returncode == 0, forever.stderr
        again = nomadtf("run", str(write_job(tmp_path, probe_job(name))), "--timeout", "3m")
        assert again.returncode == 1
        assert "already running" in again.stderr and "--replace" in again.stderr, again.stderr
        replaced = nomadtf("run", str(write_job(tmp_path, probe_job(name))), "--replace", "--timeout", "3m")
        assert replaced.returncode == 0, replaced.stderr
        assert f"stopped the running run {_run_id(forever)}" in replaced.stderr
        # Nothing of the first run runs on.
        assert all(a["ClientStatus"] != "running" for a in allocations(name))
    finally:
        purge(name)


def test_resume_trains_on_in_the_previous_runs_model_dir(stack, tmp_path):
    name = unique("resume")
    try:
        first = nomadtf("run", str(write_job(tmp_path, probe_job(name, context={"checkpoint_step": 600}))), "--timeout", "3m")
        assert first.returncode == 0, first.stderr
        first_dir = _model_dir(name)
        resumed = nomadtf("run", str(write_job(tmp_path, probe_job(name))), "--resume", "--timeout", "3m")
        assert resumed.returncode == 0, resumed.stderr
        assert f"resuming run {_run_id(first)}" in resumed.stderr and "at step 600" in resumed.stderr, resumed.stderr
        assert _model_dir(name) == first_dir
        # A resume of the resumed run still continues the same directory.
        again = nomadtf("run", str(write_job(tmp_path, probe_job(name))), "--resume", "--timeout", "3m")
        assert again.returncode == 0, again.stderr
        assert _model_dir(name) == first_dir
        fresh = nomadtf("run", str(write_job(tmp_path, probe_job(name))), "--timeout", "3m")
        assert fresh.returncode == 0 and _model_dir(name) != first_dir
    finally:
        purge(name)


def test_resume_without_an_earlier_run_is_a_clear_error(stack, tmp_path):
    name = unique("noresume")
    out = nomadtf("run", str(write_job(tmp_path, probe_job(name))), "--resume")
    assert out.returncode == 1
    assert f"job {name} has no earlier run" in out.stderr, out.stderr
    assert requests.get(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}", timeout=10).status_code == 404  # nothing submitted


def test_the_same_name_in_two_namespaces_at_once(stack, tmp_path):
    namespace = unique("team")
    requests.post(f"{os.environ['NOMAD_ADDR']}/v1/namespace", json={"Name": namespace}, timeout=10).raise_for_status()
    name = unique("twins")
    gate = tmp_path / "gate"
    jobs = {}
    for ns in ("default", namespace):
        jobs[ns] = tmp_path / f"{ns}.json"
        jobs[ns].write_text(json.dumps({**probe_job(name, context={"until_file": str(gate)}), "namespace": ns}))
    exe = str(Path(sys.executable).parent / "nomadtf")
    procs = {ns: subprocess.Popen([exe, "run", str(path), "--timeout", "3m"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for ns, path in jobs.items()}
    try:
        # Both are up at the same time, each with its own keys.
        def slots(ns: str) -> set[str]:
            return set(re.findall(rf"^nomadtf/{re.escape(ns)}/{name}/\w+/cluster/slots/(\w+/\d)=", consul_kv_dump(), re.M))

        # Both are up at the same time: each job holds its own three slots, never shared.
        wait_until(lambda: all(slots(ns) == {"chief/0", "worker/0", "ps/0"} for ns in jobs), 120, "both jobs' slots in Consul")
        gate.write_text("go")
        results = {ns: proc.communicate(timeout=180) for ns, proc in procs.items()}
        for ns, proc in procs.items():
            assert proc.returncode == 0, (ns, results[ns][1])
        for ns in jobs:
            status = nomadtf("status", name, env={"NOMAD_NAMESPACE": ns})
            assert status.returncode == 0 and "outcome: succeeded" in status.stdout, (ns, status.stdout, status.stderr)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        purge(name)
        requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}", params={"purge": "true", "namespace": namespace}, timeout=10)


def _chief_tf_configs(name: str) -> list[dict]:
    out = nomadtf("logs", name, "--role", "chief")
    return [json.loads(line.split("=", 1)[1]) for line in out.stdout.splitlines() if line.startswith("TF_CONFIG=")]


def test_scale_resizes_the_workers_and_restarts_the_chief_once_per_change(stack, tmp_path):
    name = unique("scale")
    gate = tmp_path / "gate"
    spec = probe_job(name, context={"until_file": str(gate)})
    spec["roles"]["worker"]["count"] = 2
    spec["recovery"] = {"restart_attempts": 2, "reschedule_attempts": 0}
    try:
        follower = subprocess.Popen(
            [str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, spec)), "--timeout", "5m"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        wait_until(lambda: _chief_tf_configs(name), 180, "the chief's first TF_CONFIG")
        assert len(_chief_tf_configs(name)[-1]["cluster"]["worker"]) == 2
        for count in (3, 1):
            out = nomadtf("scale", name, f"worker={count}")
            assert out.returncode == 0, out.stderr
            wait_until(lambda c=count: len(_chief_tf_configs(name)[-1]["cluster"]["worker"]) == c, 180, f"{count} workers in TF_CONFIG")
        configs = _chief_tf_configs(name)
        assert [len(c["cluster"]["worker"]) for c in configs] == [2, 3, 1]  # one restart per change, no more
        gate.write_text("go")
        stdout, stderr = follower.communicate(timeout=180)
        assert follower.returncode == 0, stderr
        status = nomadtf("status", name)
        assert "worker      wanted 1" in status.stdout, status.stdout
        bad = nomadtf("scale", name, "worker=2")
        assert bad.returncode == 1 and "not running" in bad.stderr
    finally:
        follower.kill()
        follower.wait()
        purge(name)


def test_all_workers_success_waits_for_the_last_worker(stack, tmp_path):
    """success = all_workers: worker 0 finishing first does not end the job; worker 1's code
    runs to its own end and its exit marks the job succeeded."""
    name = unique("allw")
    spec = probe_job(name, strategy="multi_worker_mirrored", context={"sleep_by_index": {"1": 6}}, success="all_workers")
    try:
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "3m")
        assert out.returncode == 0, out.stderr
        first = nomadtf("logs", name, "--role", "worker", "--index", "0", "--stderr").stdout
        last = nomadtf("logs", name, "--role", "worker", "--index", "1", "--stderr").stdout
        assert "the job succeeds once every worker has" in first, first
        assert "job marked succeeded" in last, last
        assert "probe finished" in nomadtf("logs", name, "--role", "worker", "--index", "1").stdout
    finally:
        purge(name)


def test_a_detached_job_whose_chief_fails_for_good_stops_itself_and_says_why(stack, tmp_path):
    """Nobody follows: the job's own tasks end it (peers stop, exit 0) and record the reason."""
    name = unique("detfail")
    spec = probe_job(name, context={"raise": True})
    spec["recovery"] = {"restart_attempts": 1, "restart_delay": "1s", "reschedule_attempts": 0}
    try:
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach")
        assert out.returncode == 0, out.stderr
        wait_until(
            lambda: (allocs := allocations(name)) and all(a["ClientStatus"] in ("complete", "failed") for a in allocs),
            90, "every allocation of the job to stop",
        )
        by_role = {a["TaskGroup"]: a["ClientStatus"] for a in allocations(name)}
        assert by_role == {"chief": "failed", "worker": "complete", "ps": "complete"}, by_role
        status = nomadtf("status", name)
        assert "outcome: failed: chief[0] exited 1" in status.stdout, status.stdout
    finally:
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
