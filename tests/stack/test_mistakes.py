"""Mistakes a human must fix fail the run fast, naming what to fix (issue #20, item 4), and
an AppRole login lives exactly as long as its task (item 8), on the real local stack:
`nomadtf run` of a stand-in job (tests/jobs/probe.py) against the stack's Nomad, Consul
and OpenBao, with a real PostgreSQL behind OpenBao's database engine for leased secrets."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from nomadtf.devstack import stack as stack_mod
from tests.helpers import nomadtf, probe_job, purge, unique, wait_until, write_job

pytestmark = pytest.mark.stack

FAST_S = 60  # "fails within 60 s"


@pytest.fixture
def root(stack) -> hvac.Client:
    return hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())


def _one_worker_job(name: str, **extra) -> dict:
    """One task that runs our stand-in code: the smallest job a secret is read for."""
    spec = probe_job(name, "multi_worker_mirrored", **extra)
    spec["roles"]["worker"]["count"] = 1
    return spec


def _run(tmp_path: Path, spec: dict, timeout: str = "3m") -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", timeout)
    return out, time.monotonic() - started


def _kv_policy(root: hvac.Client, prefix: str) -> str:
    name = f"nomadtf-mistakes-{prefix}"
    root.sys.create_or_update_policy(name, f'path "secret/data/{prefix}/*" {{ capabilities = ["read"] }}')
    return name


def _approle(root: hvac.Client, policies: list[str], **role) -> tuple[str, str, str]:
    """(role name, role_id, secret_id) of a new AppRole with these policies."""
    if "approle/" not in root.sys.list_auth_methods()["data"]:
        root.sys.enable_auth_method("approle")
    name = unique("mistakes")
    root.auth.approle.create_or_update_approle(name, token_policies=policies, **role)
    role_id = root.auth.approle.read_role_id(name)["data"]["role_id"]
    secret_id = root.auth.approle.generate_secret_id(name)["data"]["secret_id"]
    return name, role_id, secret_id


def _approle_job(name: str, role_id: str, secret_id: str, secrets: list[dict], **extra) -> dict:
    return _one_worker_job(
        name,
        secrets=secrets,
        vault={"auth": "approle", "address": stack_mod.VAULT_ADDR},
        env={"NOMADTF_VAULT_ROLE_ID": role_id, "NOMADTF_VAULT_SECRET_ID": secret_id},
        **extra,
    )


def _role_tokens(root: hvac.Client, role: str) -> list[dict]:
    """The live tokens an AppRole login of `role` created (as root: every accessor, looked up).

    LIST /v1/auth/token/accessors ; POST /v1/auth/token/lookup-accessor
    """
    tokens = []
    for accessor in root.auth.token.list_accessors()["data"]["keys"]:
        try:
            data = root.auth.token.lookup_accessor(accessor)["data"]
        except (hvac.exceptions.InvalidRequest, hvac.exceptions.Forbidden, hvac.exceptions.InvalidPath):
            continue  # expired or revoked between the list and the lookup
        if (data.get("meta") or {}).get("role_name") == role:
            tokens.append(data)
    return tokens


def test_a_secret_path_that_does_not_exist_fails_the_run_fast_naming_it(root, tmp_path):
    prefix = f"nomadtf-mistakes/{uuid.uuid4().hex[:6]}"
    root.secrets.kv.v2.create_or_update_secret(path=f"{prefix}/real", secret={"k": "v"}, mount_point="secret")
    job = unique("typo")
    typo = f"secret/{prefix}/reel"
    spec = _one_worker_job(
        job, secrets=[{"path": typo, "key": "k", "env": "PROBE_SECRET"}],
        vault={"policies": [_kv_policy(root, prefix.split("/")[0])], "address": stack_mod.VAULT_ADDR},
    )
    try:
        out, wall = _run(tmp_path, spec)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert f"no secret at {typo}" in text, text
        assert wall < FAST_S, f"took {wall:.0f}s"
    finally:
        purge(job)


def test_a_policy_that_denies_the_path_fails_the_run_fast_naming_it(root, tmp_path):
    forbidden = f"nomadtf-forbidden/{uuid.uuid4().hex[:6]}"
    root.secrets.kv.v2.create_or_update_secret(path=forbidden, secret={"k": "v"}, mount_point="secret")
    job = unique("denied")
    spec = _one_worker_job(
        job, secrets=[{"path": f"secret/{forbidden}", "key": "k", "env": "PROBE_SECRET"}],
        vault={"policies": [_kv_policy(root, "nomadtf-mistakes")], "address": stack_mod.VAULT_ADDR},
    )
    try:
        out, wall = _run(tmp_path, spec)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert f"permission denied reading secret secret/{forbidden}" in text, text
        assert wall < FAST_S, f"took {wall:.0f}s"
    finally:
        purge(job)


def test_approle_with_a_bad_secret_path_fails_fast_and_leaves_no_token(root, tmp_path):
    role, role_id, secret_id = _approle(root, [_kv_policy(root, "nomadtf-mistakes")])
    job = unique("approle-typo")
    typo = f"secret/nomadtf-mistakes/{uuid.uuid4().hex[:6]}-typo"
    spec = _approle_job(job, role_id, secret_id, [{"path": typo, "key": "k", "env": "PROBE_SECRET"}])
    try:
        out, wall = _run(tmp_path, spec)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert f"no secret at {typo}" in text, text
        assert wall < FAST_S, f"took {wall:.0f}s"
        # The task logged in (it read the path) and revoked its token as it ended.
        wait_until(lambda: not _role_tokens(root, role), 20, "the AppRole login token to be revoked")
    finally:
        purge(job)


def test_a_failed_approle_login_fails_fast_naming_the_login(root, tmp_path):
    _role, role_id, _secret_id = _approle(root, [_kv_policy(root, "nomadtf-mistakes")])
    job = unique("approle-bad")
    spec = _approle_job(job, role_id, "not-" + str(uuid.uuid4()), [{"path": "secret/nomadtf-mistakes/x", "key": "k", "env": "X"}])
    try:
        out, wall = _run(tmp_path, spec)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert "Vault refused the AppRole login at auth/approle" in text, text
        assert wall < FAST_S, f"took {wall:.0f}s"
    finally:
        purge(job)


def test_an_entrypoint_script_that_is_not_there_fails_fast_naming_it(stack, tmp_path):
    job = unique("nocode")
    spec = _one_worker_job(job)
    spec["entrypoint"]["script"] = "porbe.py"
    try:
        out, wall = _run(tmp_path, spec)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert "entrypoint.script porbe.py not found" in text, text
        assert wall < FAST_S, f"took {wall:.0f}s"
    finally:
        purge(job)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_a_consul_address_where_nothing_listens_fails_in_bounded_time_naming_it(stack, tmp_path):
    """Nomad's default restart and reschedule policy stays on: the task's exit 78 (a failure
    it could not record) ends the run at once, no restart loop."""
    address = f"127.0.0.1:{_closed_port()}"
    job = unique("noconsul")
    spec = _one_worker_job(job, env={"NOMADTF_SERVER_RETRY_S": "5"})
    spec["discovery"]["consul_address"] = address
    del spec["recovery"]  # the defaults: 3 restarts, 2 reschedules
    try:
        out, wall = _run(tmp_path, spec)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert f"tried Consul at http://{address} for 5s" in text, text
        assert "exited 78" in text, text
        assert wall < FAST_S, f"took {wall:.0f}s"
    finally:
        purge(job)


@pytest.fixture
def tls_only_port(tmp_path) -> Iterator[int]:
    """A port that speaks TLS only (a Consul HTTPS listener stands for many): a plain HTTP
    request gets its connection closed."""
    from nomadtf.devstack import tls

    ca = tls.make_ca(tmp_path / "ca")
    pair = tls.issue(ca, tmp_path, "server", ips=["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.handle_error = lambda *_args: None  # every plain-HTTP request fails the handshake, on purpose
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_plain_http_to_a_tls_only_consul_port_fails_in_bounded_time_naming_it(stack, tmp_path, tls_only_port):
    address = f"127.0.0.1:{tls_only_port}"
    job = unique("tlsonly")
    spec = _one_worker_job(job, env={"NOMADTF_SERVER_RETRY_S": "5"})
    spec["discovery"]["consul_address"] = address
    del spec["recovery"]
    try:
        out, wall = _run(tmp_path, spec)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert f"tried Consul at http://{address} for 5s" in text and "https for a TLS-only port" in text, text
        assert wall < FAST_S, f"took {wall:.0f}s"
    finally:
        purge(job)


# ---- an AppRole login with a short TTL and a leased secret ----------------------------------


@pytest.fixture
def postgres() -> Iterator[int]:
    """A throwaway PostgreSQL (trust auth, loopback) for OpenBao's database engine; its port."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    assert initdb and pg_ctl, "PostgreSQL (initdb, pg_ctl) is needed for leased secrets"
    home = Path(tempfile.mkdtemp(prefix="nomadtf-pg-"))  # outside pytest's 0700 tree: `nobody` runs it
    home.chmod(0o777)
    port = _closed_port()
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []  # initdb refuses root
    subprocess.run([*as_user, initdb, "-D", str(home / "data"), "-U", "postgres", "--auth=trust"], check=True, capture_output=True, timeout=120)
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1"
    subprocess.run([*as_user, pg_ctl, "-D", str(home / "data"), "-l", str(home / "log"), "-o", options, "-w", "start"],
                   check=True, capture_output=True, timeout=60)
    try:
        yield port
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(home / "data"), "-m", "fast", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def test_an_approle_token_and_its_lease_outlive_their_ttl_while_the_task_runs(root, postgres, tmp_path):
    mount = f"db-{uuid.uuid4().hex[:6]}"
    root.sys.enable_secrets_engine("database", path=mount)
    root.write(
        f"{mount}/config/pg", plugin_name="postgresql-database-plugin", allowed_roles="probe",
        connection_url=f"postgresql://{{{{username}}}}:{{{{password}}}}@127.0.0.1:{postgres}/postgres?sslmode=disable",
        username="postgres", password="unused-trust-auth",
    )
    root.write(
        f"{mount}/roles/probe", db_name="pg", default_ttl="10s", max_ttl="1h",
        creation_statements=["CREATE ROLE \"{{name}}\" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}';"],
    )
    policy = f"nomadtf-mistakes-{mount}"
    root.sys.create_or_update_policy(policy, f'''
        path "{mount}/creds/probe" {{ capabilities = ["read"] }}
        path "sys/leases/renew" {{ capabilities = ["update"] }}
        path "sys/leases/revoke/{mount}/creds/probe/*" {{ capabilities = ["update"] }}
    ''')
    role, role_id, secret_id = _approle(root, [policy], token_ttl="10s", token_max_ttl="1h")
    job = unique("approle-ttl")
    spec = _approle_job(job, role_id, secret_id, [{"path": f"{mount}/creds/probe", "key": "username", "env": "PROBE_SECRET"}],
                        context={"sleep": 45})
    leases = lambda: root.list(f"sys/leases/lookup/{mount}/creds/probe/") or {}  # noqa: E731
    run = subprocess.Popen(
        [str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, spec)), "--timeout", "4m"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_until(lambda: leases().get("data", {}).get("keys"), 90, "the task to read its leased secret")
        read_at = time.monotonic()
        time.sleep(35)  # three and a half lifetimes of the login token and of the lease
        keys = leases()["data"]["keys"]
        assert len(keys) == 1, keys  # one login, one read: no second login, no second lease
        lease = root.sys.read_lease(f"{mount}/creds/probe/{keys[0]}")["data"]
        assert lease["ttl"] > 0, lease
        tokens = _role_tokens(root, role)
        assert len(tokens) == 1 and tokens[0]["ttl"] > 0, tokens
        assert time.monotonic() - read_at > 30
        text, _ = run.communicate(timeout=180)
        assert run.returncode == 0, text
        # At the end: the token revoked, and with it the lease it created.
        wait_until(lambda: not _role_tokens(root, role), 20, "the AppRole login token to be revoked")
        wait_until(lambda: not leases().get("data", {}).get("keys"), 20, "the lease to be revoked")
    finally:
        if run.poll() is None:
            run.kill()
        purge(job)
        root.sys.disable_secrets_engine(mount)
