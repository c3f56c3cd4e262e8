"""A job name run again, the way teams do on the real stack: after a success, after a
failure, while it still runs (`--replace`), `--resume`, and the same name in two namespaces
at once."""

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
        # --detach may return while the admission controller has yet to start it: running first.
        wait_until(lambda: any(a["ClientStatus"] == "running" for a in allocations(name)), 90, "the first run to run")
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
    assert out.returncode == 2  # a usage error
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
