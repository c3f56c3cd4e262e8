"""Reading secrets from the real OpenBao: logins, KV v2, files, and failures that name the
path but never a value."""

from __future__ import annotations

import secrets
import time
import uuid

import hvac
import pytest

from nomadtf.devstack import stack as stack_mod
from nomadtf.errors import VaultError
from nomadtf.servers import vault as vault_api

pytestmark = pytest.mark.stack


@pytest.fixture
def root(stack):
    return hvac.Client(url=stack_mod.VAULT_ADDR, token=stack.root_token())


@pytest.fixture
def stored(root):
    path = f"nomadtf-unit/{uuid.uuid4().hex[:6]}"
    value = secrets.token_hex(16)
    root.secrets.kv.v2.create_or_update_secret(path=path, secret={"k": value, "other": "x"}, mount_point="secret")
    return f"secret/{path}", value


@pytest.fixture
def approle(root):
    """An AppRole that may read secret/nomadtf-unit/*: its (role_id, secret_id)."""
    root.sys.create_or_update_policy("nomadtf-unit-read", 'path "secret/data/nomadtf-unit/*" { capabilities = ["read"] }')
    if "approle/" not in root.sys.list_auth_methods()["data"]:
        root.sys.enable_auth_method("approle")
    root.auth.approle.create_or_update_approle("nomadtf-unit", token_policies=["nomadtf-unit-read"])
    role_id = root.auth.approle.read_role_id("nomadtf-unit")["data"]["role_id"]
    return role_id, root.auth.approle.generate_secret_id("nomadtf-unit")["data"]["secret_id"]


def test_approle_login_reads_a_kv2_secret_into_env_and_a_0600_file(approle, stored, tmp_path, monkeypatch):
    path, value = stored
    role_id, secret_id = approle
    monkeypatch.setenv("NOMADTF_VAULT_ROLE_ID", role_id)
    monkeypatch.setenv("NOMADTF_VAULT_SECRET_ID", secret_id)
    client = vault_api.login({"auth": "approle", "address": stack_mod.VAULT_ADDR})
    fetched = vault_api.fetch_secrets(
        client, [{"path": path, "key": "k", "env": "MY_KEY"}, {"path": path, "key": "k", "file": "my.key"}], tmp_path
    )
    assert fetched.env == {"MY_KEY": value}
    assert (tmp_path / "my.key").read_text() == value
    assert oct((tmp_path / "my.key").stat().st_mode & 0o777) == "0o600"


def test_a_missing_key_names_the_path_and_the_keys_not_the_values(root, stored, tmp_path, monkeypatch):
    path, value = stored
    monkeypatch.setenv("VAULT_TOKEN", root.token)
    client = vault_api.login({"auth": "nomad", "address": stack_mod.VAULT_ADDR})
    with pytest.raises(VaultError) as err:
        vault_api.fetch_secrets(client, [{"path": path, "key": "nope", "env": "X"}], tmp_path)
    assert path in str(err.value) and "'nope'" in str(err.value) and "k, other" in str(err.value)
    assert value not in str(err.value)


def test_a_missing_path_fails_at_once_naming_it(root, tmp_path, monkeypatch):
    """A typo is a human's to fix: no retry (only an unreachable Vault is retried)."""
    monkeypatch.setenv("VAULT_TOKEN", root.token)
    client = vault_api.login({"auth": "nomad", "address": stack_mod.VAULT_ADDR})
    started = time.monotonic()
    with pytest.raises(VaultError, match=r"no secret at secret/nomadtf-unit/absent"):
        vault_api.fetch_secrets(client, [{"path": "secret/nomadtf-unit/absent", "key": "k", "env": "X"}], tmp_path, budget_s=30)
    assert time.monotonic() - started < 2


def test_permission_denied_points_at_the_policies(root, stored, tmp_path, monkeypatch):
    path, _ = stored
    token = root.auth.token.create(policies=["default"])["auth"]["client_token"]
    monkeypatch.setenv("VAULT_TOKEN", token)
    client = vault_api.login({"auth": "nomad", "address": stack_mod.VAULT_ADDR})
    with pytest.raises(VaultError, match=r"permission denied reading secret .*vault.policies"):
        vault_api.fetch_secrets(client, [{"path": path, "key": "k", "env": "X"}], tmp_path)


def test_unreachable_vault_fails_in_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setenv("VAULT_TOKEN", "whatever")
    client = vault_api.login({"auth": "nomad", "address": "http://127.0.0.1:1"})
    with pytest.raises(VaultError, match=r"Vault at http://127\.0\.0\.1:1 unreachable"):
        vault_api.fetch_secrets(client, [{"path": "secret/a/b", "key": "k", "env": "X"}], tmp_path, budget_s=2)


def test_approle_ids_from_the_job_s_nomad_variable_reach_the_supervisor_only(approle, stored, tmp_path):
    """vault.auth approle with the ids in the job's own Nomad variable (nomad/jobs/<job>),
    not in its env: the job's definition never holds them, Nomad renders them into the task's
    secrets/vault_approle, which the supervisor reads and removes before the code starts; the
    code gets its secret (issue #33)."""
    import hashlib
    import os

    import requests

    from tests.helpers import all_logs, nomadtf, probe_job, purge, unique, write_job

    path, value = stored
    role_id, secret_id = approle
    job_id = unique("approle-var")
    variable = f"{os.environ['NOMAD_ADDR']}/v1/var/nomad/jobs/{job_id}"
    put = requests.put(variable, json={"Namespace": "default", "Path": f"nomad/jobs/{job_id}",
                                       "Items": {"vault_role_id": role_id, "vault_secret_id": secret_id}}, timeout=10)
    put.raise_for_status()
    spec = probe_job(job_id, secrets=[{"path": path, "key": "k", "env": "PROBE_SECRET"}],
                     vault={"auth": "approle", "address": stack_mod.VAULT_ADDR})
    try:
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "4m")
        assert out.returncode == 0, out.stdout + out.stderr
        logs = all_logs(job_id)
        assert "secret_env_sha256=" + hashlib.sha256(value.encode()).hexdigest() in logs, logs
        assert "vault_approle_file=False" in logs and "vault_approle_file=True" not in logs, logs
        definition = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/job/{job_id}", timeout=10).text
        assert secret_id not in definition and role_id not in definition
        assert secret_id not in logs + out.stdout + out.stderr
    finally:
        purge(job_id)
        requests.delete(variable, timeout=10)


def test_an_approle_job_whose_nomad_variable_was_never_written_fails_at_once_naming_it(stored, tmp_path):
    """The ids' variable forgotten (or a typo in the job's name): the task is not held
    before it starts waiting for a variable nobody writes; the run fails within seconds,
    saying which variable to write."""
    from tests.helpers import nomadtf, probe_job, purge, unique, write_job

    path, _ = stored
    job_id = unique("approle-novar")
    spec = probe_job(job_id, secrets=[{"path": path, "key": "k", "env": "PROBE_SECRET"}],
                     vault={"auth": "approle", "address": stack_mod.VAULT_ADDR})
    started = time.monotonic()
    try:
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "4m")
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert "the task has no AppRole ids: put vault_role_id and vault_secret_id in the job's Nomad variable" in text, text
        assert time.monotonic() - started < 120, "a missing variable is a human's to fix: not waited for"
    finally:
        purge(job_id)
