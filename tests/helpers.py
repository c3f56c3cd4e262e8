"""Helpers for integration tests that drive nomadtf the way a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
JOBS = Path(__file__).resolve().parent / "jobs"
# A stand-in for TensorFlow's bare servers in probe jobs (its docstring says why).
STAND_IN = JOBS / "stand_in"
# The one extra TensorFlow version the tests use, beside this installation's: an environment
# (test_environments.py) and an image (test_docker.py; conftest.py builds it).
OTHER_TF = "2.20.0"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def nomadtf(*args: str, timeout: float = 600, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the console script as a user would."""
    exe = Path(sys.executable).parent / "nomadtf"
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd
    )


def write_job(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    return path


def probe_job(name: str, strategy: str = "parameter_server", context: dict | None = None, **extra) -> dict:
    roles = {
        "parameter_server": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}},
        "multi_worker_mirrored": {"worker": {"count": 2}},
    }[strategy]
    for role in roles.values():
        role.update(cpu=200, memory=600)
    spec = {
        "name": name,
        "strategy": strategy,
        # The ps and worker of a parameter-server probe job run bare servers nobody talks to:
        # the stand-in serves there, without TensorFlow's import (tests/jobs/stand_in).
        "entrypoint": {"script": "probe.py", "workdir": str(JOBS), "pythonpath": [str(STAND_IN)]},
        "context": context or {},
        "roles": roles,
        "recovery": {"restart_attempts": 0, "reschedule_attempts": 0},
        "discovery": {"rendezvous_timeout": "2m"},
    }
    spec.update(extra)
    return spec


def nomad(path: str, **params):
    resp = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()


def task_log(alloc_id: str, task: str, stream: str = "stdout") -> str:
    resp = requests.get(
        f"{os.environ['NOMAD_ADDR']}/v1/client/fs/logs/{alloc_id}",
        params={"task": task, "type": stream, "plain": "true"},
        timeout=10,
    )
    return resp.text if resp.status_code == 200 else ""


def allocations(job_id: str, namespace: str = "default") -> list[dict]:
    return nomad(f"job/{job_id}/allocations", namespace=namespace)


def all_logs(job_id: str, namespace: str = "default") -> str:
    text = []
    for alloc in allocations(job_id, namespace):
        for stream in ("stdout", "stderr"):
            text.append(task_log(alloc["ID"], alloc["TaskGroup"], stream))
    return "\n".join(text)


def consul_kv_dump(prefix: str = "nomadtf/") -> str:
    resp = requests.get(f"http://{os.environ['CONSUL_HTTP_ADDR']}/v1/kv/{prefix}", params={"recurse": "true"}, timeout=10)
    if resp.status_code == 404:
        return ""
    import base64

    return "\n".join(f"{i['Key']}={base64.b64decode(i['Value'] or b'').decode(errors='replace')}" for i in resp.json())


def purge(job_id: str, namespace: str = "default") -> None:
    requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{job_id}", params={"purge": "true", "namespace": namespace}, timeout=10)


def wait_until(check, timeout: float, what: str = "condition", interval: float = 0.3):
    """Poll `check` until it returns something truthy (tests only; nomadtf itself blocks)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def submit_raw(job: dict) -> str:
    """POST /v1/jobs with a hand-written job (tests of the stack itself)."""
    resp = requests.post(f"{os.environ['NOMAD_ADDR']}/v1/jobs", json=job, timeout=10)
    resp.raise_for_status()
    return resp.json()["EvalID"]


# Two teams on one client (issue #33): their namespaces, each with its code user.
TEAM_UIDS = {"team-a": 10001, "team-b": 10002}


def two_teams(nomad_url: str, tmp_path: Path) -> dict[str, str]:
    """Namespaces team-a and team-b on the stack, and a cluster profile that runs each team's
    code as its own uid (code_users): the environment `nomadtf` is run with."""
    for namespace in TEAM_UIDS:
        requests.post(f"{nomad_url}/v1/namespace/{namespace}", json={"Name": namespace}, timeout=10).raise_for_status()
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"code_users": {ns: f"{uid}:{uid}" for ns, uid in TEAM_UIDS.items()}}))
    return {"NOMADTF_CLUSTER_PROFILE": str(profile)}


def code_process(job_id: str, uid: int):
    """The process of `job_id`'s code that runs as `uid` on this machine (read as root from
    /proc); None while there is none."""
    import psutil

    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == uid and proc.environ().get("NOMADTF_JOB_ID") == job_id:
                return proc
        except psutil.Error:
            continue
    return None
