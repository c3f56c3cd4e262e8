"""The local stack is real and wired together: Nomad runs raw_exec jobs, registers their
services in Consul, hands out Vault tokens from OpenBao, and serves its UI."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import uuid

import hvac
import pytest
import requests

from nomadtf.devstack import stack as stack_mod
from tests.helpers import nomad, purge, submit_raw, wait_until

pytestmark = pytest.mark.stack


def _batch_job(job_id: str, task: dict, services: list | None = None) -> dict:
    return {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Type": "batch",
            "Datacenters": ["*"],
            "TaskGroups": [
                {
                    "Name": "main",
                    "Count": 1,
                    "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
                    "Services": services or [],
                    "RestartPolicy": {"Attempts": 0, "Mode": "fail"},
                    "ReschedulePolicy": {"Attempts": 0, "Unlimited": False},
                    "Tasks": [{"Name": "main", "Driver": "raw_exec", **task}],
                }
            ],
        }
    }


def _wait_complete(job_id: str, timeout: float = 60) -> dict:
    def done():
        allocs = nomad(f"job/{job_id}/allocations")
        finished = [a for a in allocs if a["ClientStatus"] in ("complete", "failed", "lost")]
        return finished[0] if finished else None

    return wait_until(done, timeout, f"job {job_id} to finish")


def test_raw_exec_job_runs_and_its_service_is_in_consul(stack):
    job_id = f"wired-{uuid.uuid4().hex[:6]}"
    service = f"{job_id}-svc"
    job = _batch_job(
        job_id,
        {"Config": {"command": "/bin/sh", "args": ["-c", "sleep 6; echo finished"]}},
        services=[{"Name": service, "PortLabel": "http", "Provider": "consul", "Tags": ["nomadtf-test"]}],
    )
    submit_raw(job)
    try:
        def registered():
            resp = requests.get(f"http://{stack_mod.CONSUL_ADDR}/v1/catalog/service/{service}", timeout=5)
            return resp.json()

        entries = wait_until(registered, 30, f"{service} in the Consul catalog")
        assert entries[0]["ServiceTags"] == ["nomadtf-test"]
        assert entries[0]["ServicePort"] > 0
        alloc = _wait_complete(job_id)
        assert alloc["ClientStatus"] == "complete", alloc["TaskStates"]
        assert alloc["TaskStates"]["main"]["Events"][-1]["ExitCode"] == 0
    finally:
        purge(job_id)


def test_vault_block_gives_the_task_a_working_token(stack):
    value = secrets.token_hex(16)
    path = f"nomadtf-test/{uuid.uuid4().hex[:6]}"
    client = hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())
    client.secrets.kv.v2.create_or_update_secret(path=path, secret={"password": value}, mount_point="secret")
    client.sys.create_or_update_policy("nomadtf-test-read", 'path "secret/data/nomadtf-test/*" { capabilities = ["read"] }')
    # The task proves it read the value by printing its digest; the value itself is never in the job.
    reader = (
        "import hashlib, json, os, urllib.request as u;"
        f"r = u.Request(os.environ['VAULT_ADDR'] + '/v1/secret/data/{path}', headers={{'X-Vault-Token': os.environ['VAULT_TOKEN']}});"
        "v = json.load(u.urlopen(r))['data']['data']['password'];"
        "print('digest=' + hashlib.sha256(v.encode()).hexdigest())"
    )
    job_id = f"vault-{uuid.uuid4().hex[:6]}"
    job = _batch_job(
        job_id,
        {
            "Config": {"command": sys.executable, "args": ["-c", reader]},
            "Env": {"VAULT_ADDR": stack_mod.VAULT_ADDR},
            "Vault": {"Policies": ["nomadtf-test-read"], "Env": True, "ChangeMode": "noop"},
        },
    )
    submit_raw(job)
    try:
        alloc = _wait_complete(job_id)
        logs = requests.get(
            f"{os.environ['NOMAD_ADDR']}/v1/client/fs/logs/{alloc['ID']}",
            params={"task": "main", "type": "stdout", "plain": "true"},
            timeout=10,
        ).text
        assert alloc["ClientStatus"] == "complete", (alloc["TaskStates"], logs)
        assert f"digest={hashlib.sha256(value.encode()).hexdigest()}" in logs
        stored = json.dumps(nomad(f"job/{job_id}"))
        assert value not in stored
        assert value not in logs
    finally:
        purge(job_id)


def test_nomad_serves_its_real_web_ui(stack):
    resp = requests.get(f"{stack_mod.NOMAD_ADDR}/ui/", timeout=10)
    assert resp.status_code == 200
    assert "UI is disabled" not in resp.text
    assert "nomad-ui/config/environment" in resp.text  # the Ember app's config meta tag


def test_up_twice_is_a_noop_and_status_hides_the_token(stack):
    before = [c.pid for c in stack.components()]
    assert stack.up(progress=lambda _m: None) is False
    assert [c.pid for c in stack.components()] == before
    out = subprocess.run([sys.executable, "-m", "nomadtf", "dev", "status"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "nomad" in out.stdout and "consul" in out.stdout and "openbao" in out.stdout
    assert stack.root_token() not in out.stdout + out.stderr
    assert oct(stack.token_path.stat().st_mode & 0o777) == "0o600"
    env = subprocess.run([sys.executable, "-m", "nomadtf", "dev", "env"], capture_output=True, text=True).stdout
    assert "export NOMAD_ADDR=http://127.0.0.1:4646" in env


def test_a_taken_port_is_a_clear_error(tmp_path, stack):
    other = stack_mod.DevStack(tmp_path / "other")
    with pytest.raises(stack_mod.PortInUseError, match=r"port \d+ .* already taken"):
        other.up(progress=lambda _m: None)


def test_down_leaves_no_process_and_up_comes_back(stack):
    pids = [c.pid for c in stack.components()]
    out = subprocess.run([sys.executable, "-m", "nomadtf", "dev", "down"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert not any(stack_mod.pid_alive(p) for p in pids)
    assert stack_mod._processes_under(stack.state_dir) == []
    assert str(stack.state_dir) not in open("/proc/self/mounts").read()  # tasks' tmpfs mounts too
    assert not stack.state_dir.exists()
    # Bring it back for the tests that follow; the session fixture still owns it.
    assert stack.up(progress=lambda _m: None) is True
    os.environ.update(stack.env())
