"""`nomadtf run` and the in-allocation supervisor on the real local stack (raw_exec): the
examples train to the end, failures and placement are said, `--detach`, `stop`, `logs` and
`scale`, and the `all_workers` success rule."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import hvac
import pytest
import requests

from nomadtf.devstack import stack as stack_mod
from tests.docs_commands import shown_argv
from tests.helpers import (
    all_logs,
    allocations,
    consul_kv_dump,
    nomad,
    nomadtf,
    probe_job,
    purge,
    task_log,
    unique,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.stack

ACCURACY_FLOOR = 0.85  # an untrained 10-class model scores about 0.1


def _assert_all_complete(job_id: str) -> None:
    job = nomad(f"job/{job_id}")
    assert job["Status"] == "dead", job["Status"]
    allocs = allocations(job_id)
    assert allocs and all(a["ClientStatus"] == "complete" for a in allocs), [(a["Name"], a["ClientStatus"]) for a in allocs]


def _chief_alloc(job_id: str) -> dict:
    return [a for a in allocations(job_id) if a["TaskGroup"] == "chief"][-1]


def _run_example(pattern: str, job_id: str, *overrides: str, timeout: str = "8m"):
    """The docs' `nomadtf run` of an example (tests/docs_commands.py RUN_BY `pattern`), under
    the test's own job name and with its overrides."""
    args = shown_argv(pattern) + ["--var", f"name={job_id}"]
    for override in overrides:
        args += ["--var", override]
    return nomadtf(*args, "--timeout", timeout)


@pytest.mark.tf
def test_parameter_server_example_trains_to_the_end(stack):
    job_id = unique("digits")
    started = time.monotonic()
    out = _run_example(r"nomadtf run examples/digits/job.json --var entrypoint.workdir=\$PWD/examples/digits", job_id)
    wall = time.monotonic() - started
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        accuracy = float(re.search(r"final_accuracy=([0-9.]+)", out.stdout)[1])
        assert accuracy >= ACCURACY_FLOOR
        assert "Nomad UI: http://127.0.0.1:4646/ui/jobs/" in out.stderr
        _assert_all_complete(job_id)
        chief_out = task_log(_chief_alloc(job_id)["ID"], "chief")
        losses = [float(x) for x in re.findall(r"loss=([0-9.]+)", chief_out)]
        assert len(losses) >= 3 and losses[-1] < losses[0], losses
        chief_err = task_log(_chief_alloc(job_id)["ID"], "chief", "stderr")
        assert "cluster complete after" in chief_err
        print(f"\n[measure] PS example: {wall:.1f}s wall, accuracy {accuracy}")
        # Logs stay readable after the job finished.
        logs = nomadtf(*shown_argv(r"nomadtf logs digits --role chief", {"digits": job_id}))
        assert logs.returncode == 0 and "final_accuracy=" in logs.stdout
        status = nomadtf(*shown_argv(r"nomadtf status digits", {"digits": job_id}))
        assert status.returncode == 0 and "chief" in status.stdout and "complete" in status.stdout
        listing = nomadtf("status")
        assert job_id in listing.stdout
    finally:
        purge(job_id)


@pytest.mark.tf
def test_multi_worker_mirrored_example_trains_and_completes(stack):
    job_id = unique("mwms")
    out = _run_example(r"nomadtf run examples/digits/job-mwms.json --var entrypoint.workdir=\$PWD/examples/digits", job_id, "context.steps=200")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        _assert_all_complete(job_id)
        assert float(re.search(r"final_accuracy=([0-9.]+)", all_logs(job_id))[1]) >= ACCURACY_FLOOR
    finally:
        purge(job_id)


@pytest.mark.tf
def test_legacy_server_main_gets_the_server_and_context(stack, tmp_path):
    job_id = unique("legacy")
    out = _run_example(r"nomadtf run examples/legacy/job.json --var entrypoint.workdir=\$PWD/examples/digits", job_id,
                       'context={"team": "vision", "lr": 0.1}', timeout="6m")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        logs = all_logs(job_id)
        assert "cluster_jobs=" in logs and "ps" in re.search(r"cluster_jobs=(\S+)", logs)[1]
        assert '"team": "vision"' in logs
        assert "legacy_ok" in logs
        _assert_all_complete(job_id)
    finally:
        purge(job_id)


def test_secrets_reach_the_code_and_nowhere_else(stack, tmp_path):
    value_env = secrets.token_hex(20)
    value_file = secrets.token_hex(20)
    path = f"nomadtf-it/{uuid.uuid4().hex[:6]}"
    client = hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())
    client.secrets.kv.v2.create_or_update_secret(path=path, secret={"token": value_env, "key": value_file}, mount_point="secret")
    client.sys.create_or_update_policy("nomadtf-it-read", 'path "secret/data/nomadtf-it/*" { capabilities = ["read"] }')
    job_id = unique("secrets")
    spec = probe_job(
        job_id,
        secrets=[
            {"path": f"secret/{path}", "key": "token", "env": "PROBE_SECRET"},
            {"path": f"secret/{path}", "key": "key", "file": "probe.key"},
        ],
        vault={"policies": ["nomadtf-it-read"], "address": stack_mod.VAULT_ADDR},
    )
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "4m")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        import hashlib

        logs = all_logs(job_id)
        assert "secret_env_sha256=" + hashlib.sha256(value_env.encode()).hexdigest() in logs
        assert f"secret_file_sha256={hashlib.sha256(value_file.encode()).hexdigest()} mode=0o600" in logs
        assert "vault_token_visible=False" in logs and "vault_token_file=False" in logs  # read and removed by the supervisor
        stored = json.dumps(nomad(f"job/{job_id}"))
        for value in (value_env, value_file):
            assert value not in stored
            assert value not in logs
            assert value not in out.stdout + out.stderr
            assert value not in consul_kv_dump()
    finally:
        purge(job_id)


@pytest.mark.parametrize("mode", ["watch", "template"])
def test_moving_a_parameter_server_rebuilds_the_chiefs_tf_config(stack, tmp_path, mode):
    job_id = unique(f"move-{mode}")
    spec = probe_job(job_id, context={"sleep": -1}, discovery={"reconfigure": mode, "rendezvous_timeout": "2m"})
    spec["recovery"] = {"restart_attempts": 2, "reschedule_attempts": 2, "reschedule_delay": "5s"}
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach")
    assert out.returncode == 0, out.stderr
    try:
        def chief_configs():
            allocs = [a for a in allocations(job_id) if a["TaskGroup"] == "chief"]
            text = task_log(allocs[-1]["ID"], "chief") if allocs else ""
            return [json.loads(line.split("=", 1)[1]) for line in text.splitlines() if line.startswith("TF_CONFIG=")]

        first = wait_until(lambda: chief_configs(), 120, "the chief's first TF_CONFIG")[0]
        old_ps = first["cluster"]["ps"][0]
        # The chief can read the ps from Consul before the ps client's batched status update
        # reaches the servers (CI saw it still pending there), so wait for Nomad to say running.
        ps_alloc = wait_until(
            lambda: [a for a in allocations(job_id) if a["TaskGroup"] == "ps" and a["ClientStatus"] == "running"],
            60, "the ps allocation running in Nomad",
        )[0]
        moved_at = time.monotonic()
        requests.post(f"{stack_mod.NOMAD_ADDR}/v1/allocation/{ps_alloc['ID']}/stop", timeout=10).raise_for_status()
        configs = wait_until(lambda: [c for c in chief_configs() if c["cluster"]["ps"][0] != old_ps], 120, "a TF_CONFIG with the new ps")
        elapsed = time.monotonic() - moved_at
        assert configs[-1]["cluster"]["worker"] == first["cluster"]["worker"]
        assert configs[-1]["task"] == {"type": "chief", "index": 0}
        print(f"\n[measure] {mode}: ps moved -> chief TF_CONFIG rebuilt in {elapsed:.1f}s")
    finally:
        nomadtf(*shown_argv(r"nomadtf stop digits --purge", {"digits": job_id}))




def test_code_that_raises_fails_the_run_with_its_error(stack, tmp_path):
    job_id = unique("raises")
    spec = probe_job(job_id, context={"raise": True})
    started = time.monotonic()
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "4m")
    try:
        assert out.returncode == 1, out.stdout + out.stderr
        assert "ValueError: boom from user code" in out.stderr
        assert time.monotonic() - started < 200
    finally:
        purge(job_id)


def test_a_job_that_cannot_be_placed_fails_fast_with_the_reason(stack, tmp_path):
    job_id = unique("toobig")
    spec = probe_job(job_id)
    spec["roles"]["worker"]["memory"] = 10_000_000
    started = time.monotonic()
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "2m")
    try:
        assert out.returncode == 1, out.stdout + out.stderr
        assert "cannot be placed" in out.stderr and "memory" in out.stderr
        assert time.monotonic() - started < 60
    finally:
        purge(job_id)


def test_detach_returns_at_once_and_stop_stops_only_that_job(stack, tmp_path):
    job_id = unique("detach")
    other = unique("other")
    for name in (job_id, other):
        spec = probe_job(name, context={"sleep": -1})
        started = time.monotonic()
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach")
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - started < 15
        assert f"nomadtf status {name}" in out.stdout
    try:
        stopped = nomadtf(*shown_argv(r"nomadtf stop digits", {"digits": job_id}))
        assert stopped.returncode == 0, stopped.stderr
        assert nomad(f"job/{job_id}")["Stop"] is True
        assert nomad(f"job/{other}")["Stop"] is False
    finally:
        purge(job_id)
        purge(other)


def test_stop_refuses_a_job_nomadtf_did_not_start(stack):
    job_id = unique("foreign")
    job = {"Job": {"ID": job_id, "Name": job_id, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [
        {"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["60"]}}]}]}}
    requests.post(f"{stack_mod.NOMAD_ADDR}/v1/jobs", json=job, timeout=10).raise_for_status()
    try:
        out = nomadtf("stop", job_id)
        assert out.returncode == 1 and "not started by nomadtf" in out.stderr
        assert nomad(f"job/{job_id}")["Stop"] is False
    finally:
        purge(job_id)


def test_unreachable_nomad_is_one_clear_line(tmp_path):
    spec = probe_job(unique("nowhere"))
    out = nomadtf("run", str(write_job(tmp_path, spec)), env={"NOMAD_ADDR": "http://127.0.0.1:1"})
    assert out.returncode == 1
    assert "cannot reach Nomad at http://127.0.0.1:1" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_logs_follow_streams_until_the_task_ends(stack, tmp_path):
    job_id = unique("follow")
    out = nomadtf("run", str(write_job(tmp_path, probe_job(job_id, context={"sleep": 8}))), "--detach")
    assert out.returncode == 0, out.stderr
    try:
        wait_until(lambda: [a for a in allocations(job_id) if a["TaskGroup"] == "chief" and a["ClientStatus"] == "running"], 60, "the chief to run")
        started = time.monotonic()
        follow = nomadtf(*shown_argv(r"nomadtf logs digits --role chief --follow", {"digits": job_id}), timeout=120)
        assert follow.returncode == 0, follow.stderr
        assert "TF_CONFIG=" in follow.stdout and f"job={job_id}" in follow.stdout
        assert time.monotonic() - started < 100  # it returned when the task ended, not at the timeout
        err = nomadtf("logs", job_id, "--role", "ps", "--stderr")
        assert err.returncode == 0 and "nomadtf task ps" in err.stdout
    finally:
        purge(job_id)


def test_evaluator_and_tensorboard_roles(stack, tmp_path):
    job_id = unique("roles")
    release = tmp_path / "release"  # the probes (chief, evaluator) finish once it exists
    spec = probe_job(job_id, context={"until_file": str(release)})
    spec["roles"]["evaluator"] = {"count": 1, "cpu": 200, "memory": 600}
    spec["roles"]["tensorboard"] = {"count": 1, "cpu": 200, "memory": 600}
    # `run` names TensorBoard's address as soon as its task runs.
    follower = subprocess.Popen(
        [str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, spec)), "--timeout", "5m"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url = None
        for line in follower.stdout:
            if "TensorBoard: " in line:
                url = line.split("TensorBoard: ", 1)[1].strip()
                break
        assert url and url.startswith("http://127.0.0.1:"), url
        page = wait_until(lambda: _get_or_none(url), 90, "TensorBoard to answer")
        assert "TensorBoard" in page
        release.touch()
        rest, _ = follower.communicate(timeout=180)
        assert follower.returncode == 0, rest
        _assert_all_complete(job_id)  # tensorboard and evaluator stopped on their own, exit 0
        evaluator = [a for a in allocations(job_id) if a["TaskGroup"] == "evaluator"][0]
        config = json.loads(task_log(evaluator["ID"], "evaluator").split("TF_CONFIG=", 1)[1].splitlines()[0])
        assert config["task"] == {"type": "evaluator", "index": 0}
        assert "evaluator" not in config["cluster"] and set(config["cluster"]) == {"chief", "worker", "ps"}
    finally:
        follower.kill()
        follower.wait()
        purge(job_id)


def _get_or_none(url: str) -> str | None:
    try:
        resp = requests.get(url, timeout=5)
    except requests.RequestException:
        return None
    return resp.text if resp.status_code == 200 else None


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
        for count in (3, 1):  # the docs' `scale digits worker=3`, then down to one
            out = nomadtf(*shown_argv(r"nomadtf scale digits worker=3", {"digits": name, "worker=3": f"worker={count}"}))
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
        last = nomadtf(*shown_argv(r"nomadtf logs digits --role worker --index 1 --stderr", {"digits": name})).stdout
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
