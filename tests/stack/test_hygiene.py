"""Secrets hygiene and the small things of issue #20: what the training code and an
environment build can reach, zombies, the health endpoint's address, `dev binaries --go`.

Real processes throughout: the stand-in supervisor starts its child through `Child`, the
environment build runs the real uv on a local source package, and one job runs on the
single-node stack."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from nomadtf import wire
from nomadtf.job import render
from nomadtf.job.spec import parse_spec
from nomadtf.job.taskfile import spec_file_text
from nomadtf.runtime import supervisor
from nomadtf.runtime.child import Child, become_subreaper, reap_orphans
from nomadtf.runtime.venvcache import VenvCache
from nomadtf.usercode import health
from tests.helpers import (
    JOBS,
    TEAM_UIDS,
    all_logs,
    code_process,
    nomadtf,
    probe_job,
    purge,
    two_teams,
    unique,
    wait_until,
    write_job,
)

HYGIENE = JOBS / "hygiene.py"
# What lets root read a non-dumpable process's /proc files (see tests/jobs/hygiene.py).
PTRACE_CAPS = "-sys_ptrace,-sys_admin,-perfmon"

STAND_IN = """
import os, sys, threading
from nomadtf.runtime.child import Child, make_undumpable
if sys.argv[1] == "undumpable":
    assert make_undumpable()
done = threading.Event()
Child([sys.executable, sys.argv[2], "--parent-environ"], {**os.environ, "CANARY_TOKEN": "s.canary"}, ".", lambda pid, code: done.set())
assert done.wait(30)
"""


def _stand_in(mode: str) -> str:
    """A supervisor's stand-in, started as an ordinary process of this uid would be: as
    root, without the capabilities that read any process's /proc files."""
    argv = [sys.executable, "-c", STAND_IN, mode, str(HYGIENE)]
    if os.geteuid() == 0:
        assert shutil.which("setpriv"), "setpriv (util-linux) is needed to start the stand-in without CAP_SYS_PTRACE"
        argv = ["setpriv", f"--bounding-set={PTRACE_CAPS}", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_child_cannot_read_its_supervisors_environment():
    # The control: a dumpable parent's environment is readable by its child (same uid).
    assert _stand_in("dumpable") == "supervisor_environ=readable"
    assert _stand_in("undumpable") == "supervisor_environ=denied"
    # ...and the supervisor makes itself undumpable before it holds any token of its own.
    run = inspect.getsource(supervisor.Supervisor.run)
    assert run.index("make_undumpable()") < run.index("self._main()")


# ---- the environment build ------------------------------------------------------------------

BACKEND = '''
"""A PEP 517 backend without requirements: records the environment it builds in."""
import json, os, zipfile

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open(os.environ["LEAK_RECORD"], "w") as fh:
        json.dump(dict(os.environ), fh)
    name, info = "nomadtfleak-1.0-py3-none-any.whl", "nomadtfleak-1.0.dist-info"
    files = {
        "nomadtfleak.py": "VERSION = '1.0'\\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\\nName: nomadtfleak\\nVersion: 1.0\\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{p},,\\n" for p in [*files, f"{info}/RECORD"]))
    return name
'''


def test_a_source_build_of_the_jobs_environment_gets_no_credential(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "leakbackend"\nbackend-path = ["."]\n\n'
        '[project]\nname = "nomadtfleak"\nversion = "1.0"\n'
    )
    (source / "leakbackend.py").write_text(BACKEND)
    record = tmp_path / "build-env.json"
    task_env = {
        **os.environ, "UV_OFFLINE": "1", "UV_NO_INDEX": "1", "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "LEAK_RECORD": str(record), "NOMADTF_HARMLESS": "kept",
        **{name: f"canary-{name}" for name in wire.CREDENTIAL_ENV},
    }
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    ready = VenvCache(tmp_path / "envs").reuse_or_build([f"nomadtfleak @ {source.as_uri()}"], python, timeout_s=120, environ=task_env)
    ready.release()
    seen = json.loads(record.read_text())
    assert seen["NOMADTF_HARMLESS"] == "kept"  # the build did run with the task's environment
    assert [name for name in wire.CREDENTIAL_ENV if name in seen] == []
    assert not [k for k, v in seen.items() if v.startswith("canary-")]


# ---- the spec file ------------------------------------------------------------------------------


def test_approle_ids_reach_the_task_environment_but_not_the_spec_file():
    spec = parse_spec({
        "name": "approle-ids",
        "entrypoint": {"script": "train.py"},
        "env": {wire.ENV_VAULT_ROLE_ID: "role-canary", "KEEP": "1"},
        "roles": {"chief": {"count": 1, "env": {wire.ENV_VAULT_SECRET_ID: "sid-canary"}}, "worker": {"count": 1}, "ps": {"count": 1}},
        "vault": {"auth": "approle"},
    })
    text = spec_file_text(spec)
    assert "role-canary" not in text and "sid-canary" not in text and '"KEEP":"1"' in text
    job = render.render_job(spec)
    chief = next(g for g in job["Job"]["TaskGroups"] if g["Name"] == "chief")["Tasks"][0]
    assert chief["Env"][wire.ENV_VAULT_ROLE_ID] == "role-canary" and chief["Env"][wire.ENV_VAULT_SECRET_ID] == "sid-canary"
    assert "role-canary" not in json.dumps(render.embedded_spec(chief))


# ---- zombies ------------------------------------------------------------------------------------


def test_reaping_orphans_never_takes_a_childs_own_exit_status(tmp_path):
    assert become_subreaper()
    codes: list[int] = []
    done = threading.Event()
    child = Child([sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(7)"], dict(os.environ), str(tmp_path),
                  lambda pid, code: (codes.append(code), done.set()))
    # An orphan of ours exits meanwhile (double fork: re-parented to us, the subreaper).
    script = "import os\nif os.fork() == 0:\n    os._exit(0)\n"
    subprocess.run([sys.executable, "-c", script], check=True)
    reaped = 0
    deadline = time.monotonic() + 10
    while not done.is_set() and time.monotonic() < deadline:
        reaped += reap_orphans()
        time.sleep(0.001)
    assert done.is_set() and codes == [7] and child.returncode == 7
    reaped += reap_orphans()
    assert reaped >= 1
    assert [p for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE] == []


# ---- the health endpoint ------------------------------------------------------------------------


def test_the_health_endpoint_binds_the_tasks_own_address(monkeypatch):
    assert health.bind_host({"NOMAD_IP_health": "127.0.0.7"}) == "127.0.0.7"
    assert health.bind_host({}) == "0.0.0.0"
    for host, expected in (("127.0.0.7", "127.0.0.7"), ("192.0.2.1", "0.0.0.0")):  # 192.0.2.1: not ours, the fallback
        monkeypatch.setattr(health, "_server", None)
        monkeypatch.setenv("NOMAD_IP_health", host)
        server = health.serve(0)
        try:
            assert server.server_address[0] == expected
        finally:
            server.shutdown()
            server.server_close()
    monkeypatch.setattr(health, "_server", None)


# ---- `nomadtf dev binaries --go` ------------------------------------------------------------------


def test_dev_binaries_with_the_machine_s_own_go_builds_with_it_and_finds_the_cached_build():
    """`--go` with the Go this machine has: the go command's switch (GOTOOLCHAIN) finds it
    local, downloads nothing, and the cached binaries are found as `dev up` finds them."""
    own = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    out = nomadtf("dev", "binaries", "consul", "--go", own, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"go: building with {own} (GOTOOLCHAIN" in out.stderr and out.stdout.startswith("consul: "), out.stdout + out.stderr


def test_dev_binaries_with_a_go_that_is_no_version_changes_nothing_and_names_the_fix():
    out = nomadtf("dev", "binaries", "consul", "--go", "1.26", timeout=120)
    assert out.returncode != 0 and "'1.26' is not a Go version; write e.g. go1.26.8" in out.stderr, out.stderr
    assert "building with" not in out.stderr


# ---- one job on the stack ---------------------------------------------------------------------


@pytest.mark.stack
def test_a_tasks_zombies_are_reaped_its_health_endpoint_is_on_its_address_and_its_spec_file_has_no_approle_id(stack, tmp_path):
    name = unique("hygiene")
    spec = {
        "name": name,
        "strategy": "multi_worker_mirrored",
        "entrypoint": {"script": str(HYGIENE), "workdir": str(JOBS)},
        "env": {wire.ENV_VAULT_ROLE_ID: "role-canary"},
        "roles": {"worker": {"count": 1, "cpu": 200, "memory": 300}},
        "recovery": {"restart_attempts": 0, "reschedule_attempts": 0},
        "discovery": {"rendezvous_timeout": "2m"},
    }
    try:
        result = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "3m")
        logs = all_logs(name)
        assert result.returncode == 0, result.stderr + logs
        assert "orphan=reaped" in logs, logs
        bind = next(line for line in logs.splitlines() if line.startswith("health_bind="))
        address, nomad_ip = (part.split("=", 1)[1] for part in bind.split())
        assert nomad_ip and address == nomad_ip, bind
        assert "spec_file_approle=False child_env_approle=False" in logs, logs
    finally:
        purge(name)


@pytest.fixture
def root_home_traversable():
    """The local stack keeps Nomad's data (the task directories) under /root, which no other
    uid may enter: a code user could not reach its own task. For this test /root is 0711
    (enter, not list), as a real client's Nomad data dir (/opt/nomad) is; restored after."""
    mode = Path("/root").stat().st_mode & 0o777
    os.chmod("/root", mode | 0o011)
    yield
    os.chmod("/root", mode)


def test_two_teams_raw_exec_code_as_their_own_uids_reads_nothing_of_each_other(stack, tmp_path, root_home_traversable):
    """raw_exec, the cluster profile's code_users giving each team its uid: team-a's code
    tries team-b's secret file (0600), job folder (0700) and code's environment, each
    denied by the kernel; its own model_dir it reads (issue #33). (Nomad's task directories
    are world-writable: raw_exec stays no boundary between teams, docs/operations/threat-model.md.)"""
    import hashlib
    import uuid

    import hvac

    from nomadtf.devstack import stack as stack_mod

    env = two_teams(stack.api().nomad_url, tmp_path)
    root = hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())
    job_b, job_a = unique("raw-team-b"), unique("raw-team-a")
    secret = f"canary-{uuid.uuid4().hex}"
    root.secrets.kv.v2.create_or_update_secret(path=f"teamcanary/{job_b}", secret={"file": secret}, mount_point="secret")
    root.sys.create_or_update_policy("nomadtf-teamcanary", 'path "secret/data/teamcanary/*" { capabilities = ["read"] }')
    spec_b = probe_job(job_b, "multi_worker_mirrored", namespace="team-b", context={"sleep": 300},
                       secrets=[{"path": f"secret/teamcanary/{job_b}", "key": "file", "file": "probe.key"}],
                       vault={"policies": ["nomadtf-teamcanary"], "address": stack_mod.VAULT_ADDR})
    spec_b["roles"]["worker"]["count"] = 1
    out = nomadtf("run", str(write_job(tmp_path, spec_b)), "--detach", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        code = wait_until(lambda: code_process(job_b, TEAM_UIDS["team-b"]), 180, "team-b's code running as uid 10002")
        b_folder = Path("/tmp/nomadtf/team-b") / job_b
        b_secret = Path(stack.state_dir, "nomad-data", "alloc", code.environ()["NOMAD_ALLOC_ID"], "worker", "secrets", "probe.key")
        wait_until(lambda: b_folder.is_dir() and b_secret.is_file(), 120, "team-b's job folder and secret file")
        assert (b_secret.stat().st_uid, b_secret.stat().st_mode & 0o777) == (10002, 0o600)
        assert b_secret.read_text() == secret  # what team-a's code is after
        targets = [str(b_secret), str(b_folder), f"/proc/{code.pid}/environ"]
        spec_a = probe_job(job_a, "multi_worker_mirrored", namespace="team-a", context={"try_read": ["${NOMADTF_MODEL_DIR}", *targets]})
        spec_a["roles"]["worker"]["count"] = 1
        ran = nomadtf("run", str(write_job(tmp_path, spec_a)), "--timeout", "4m", env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        logs = all_logs(job_a, namespace="team-a")
        tried = [line for line in logs.splitlines() if line.startswith("try_read ")]
        assert "uid=10001 gid=10001" in logs and any(t.endswith("=allowed") and "/tmp/nomadtf/team-a/" in t for t in tried), tried
        for target in targets:
            assert f"try_read {target}=denied (PermissionError)" in tried, (target, tried)
        assert hashlib.sha256(secret.encode()).hexdigest() not in logs and secret not in logs
    finally:
        purge(job_b, namespace="team-b")
        purge(job_a, namespace="team-a")

