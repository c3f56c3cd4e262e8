"""The secure stack (`nomadtf dev up --secure`): ACLs (default deny) and TLS on Nomad,
Consul and OpenBao, as a production cluster runs them.

The `secure_cluster` fixture (conftest.py) is the several-client stack with ACLs and TLS.
Every call here names its token: the management tokens of `cluster.env()` are the
operator's; submitters and tasks get the least-privilege policies `nomadtf acl` prints.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from nomadtf import wire
from nomadtf.devstack import bootstrap, security, wiring
from nomadtf.job import acl
from nomadtf.job.spec import parse_spec
from tests.cluster_access import nomad_token, secured
from tests.helpers import EXAMPLES, nomadtf, probe_job, unique, wait_until, write_job

pytestmark = [pytest.mark.stack]

NAMESPACE_A = "team-a"
NAMESPACE_B = "team-b"


# ---- helpers ---------------------------------------------------------------------------


def ensure_namespace(api: requests.Session, base: str, name: str) -> None:
    # PUT /v1/namespace/:name
    api.put(f"{base}/v1/namespace/{name}", json={"Name": name}, timeout=10).raise_for_status()


def submitter_env(cluster, namespace: str) -> dict[str, str]:
    """A Nomad and a Consul token with exactly `nomadtf acl policies`' submitter policies for
    `namespace` (the operator creates them; POST /v1/acl/policy, /v1/acl/token ; PUT /v1/acl/policy)."""
    api, found = cluster.api().session(), cluster.api().urls
    name = f"nomadtf-submit-{namespace}"
    api.post(
        f"{found['nomad']}/v1/acl/policy/{name}", json={"Name": name, "Rules": acl.nomad_submitter_policy(namespace)}, timeout=10
    ).raise_for_status()
    nomad_token = api.post(f"{found['nomad']}/v1/acl/token", json={"Type": "client", "Policies": [name]}, timeout=10)
    nomad_token.raise_for_status()
    rules = acl.consul_hcl(acl.consul_submitter_rules(namespace))
    existing = {p["Name"]: p["ID"] for p in api.get(f"{found['consul']}/v1/acl/policies", timeout=10).json()}
    if name in existing:
        api.put(f"{found['consul']}/v1/acl/policy/{existing[name]}", json={"Name": name, "Rules": rules}, timeout=10).raise_for_status()
    else:
        api.put(f"{found['consul']}/v1/acl/policy", json={"Name": name, "Rules": rules}, timeout=10).raise_for_status()
    consul_token = api.put(f"{found['consul']}/v1/acl/token", json={"Policies": [{"Name": name}]}, timeout=10)
    consul_token.raise_for_status()
    return {**cluster.env(), "NOMAD_TOKEN": nomad_token.json()["SecretID"], "CONSUL_HTTP_TOKEN": consul_token.json()["SecretID"]}


def anonymous() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


# ---- the stack itself ------------------------------------------------------------------


def test_anonymous_requests_are_denied_and_plain_http_is_refused(secure_cluster):
    found = secure_cluster.api().urls
    ca = str(secure_cluster.secure_state.ca_file)
    anon = anonymous()
    assert anon.get(f"{found['nomad']}/v1/jobs", verify=ca, timeout=10).status_code == 403
    assert anon.get(f"{found['nomad']}/v1/nodes", verify=ca, timeout=10).status_code == 403
    secure_cluster.api().session().put(f"{found['consul']}/v1/kv/nomadtf/hidden", data=b"x", timeout=10).raise_for_status()
    assert anon.get(f"{found['consul']}/v1/kv/nomadtf/hidden", verify=ca, timeout=10).status_code == 403
    # A listing is filtered, not refused: the anonymous token sees nothing.
    assert anon.get(f"{found['consul']}/v1/kv/nomadtf/", params={"recurse": "true"}, verify=ca, timeout=10).status_code == 404
    assert anon.get(f"{found['vault']}/v1/secret/data/anything", verify=ca, timeout=10).status_code == 403
    # HTTPS only: Nomad answers plain HTTP with an error, Consul's HTTP port is closed.
    assert anon.get(found["nomad"].replace("https://", "http://") + "/v1/jobs", timeout=10).status_code == 400
    with pytest.raises(requests.ConnectionError):
        anon.get(f"{found['consul'].replace('https://', 'http://').rsplit(':', 1)[0]}:8500/v1/kv/x", timeout=5)
    # Without the stack's CA, nobody trusts the servers.
    with pytest.raises(requests.exceptions.SSLError):
        anon.get(f"{found['nomad']}/v1/status/leader", verify=True, timeout=10)


def test_secrets_of_the_stack_are_private_files(secure_cluster):
    state = secure_cluster.secure_state
    assert oct(state.tokens_path.stat().st_mode & 0o777) == "0o600"
    assert oct(state.folder.stat().st_mode & 0o777) == "0o700"
    for key in state.tls_dir.glob("*-key.pem"):
        assert oct(key.stat().st_mode & 0o777) == "0o600", key
    # Agent configs carry tokens and gossip keys.
    for config in secure_cluster.state_dir.glob("*/nomad.hcl"):
        assert oct(config.stat().st_mode & 0o777) == "0o600", config


def test_the_bootstrap_left_each_server_as_its_agents_and_nomad_need_it(secure_cluster):
    """What nomadtf/devstack/bootstrap.py did, read back through the client libraries with
    the operator's tokens: the agents' Consul tokens carry exactly their policies, Nomad's
    management token is the one the stack chose, OpenBao is initialised and unsealed with
    Nomad's policy, token role and KV engine, and the Consul engine talks to Consul."""
    api, tokens = secure_cluster.api(), secure_cluster.secure_state.tokens()
    consul_api = api.consul()
    policies = {p["Name"]: p["ID"] for p in consul_api.acl.policy.list()}
    for name, secret in tokens.consul_policy_secrets().items():
        token = consul_api.acl.token.read_self(token=secret)
        assert [p["Name"] for p in token["Policies"]] == [name], token["Policies"]
        rules = json.loads(consul_api.acl.policy.read(policies[name])["Rules"])
        assert rules == security.CONSUL_POLICIES[name]
    nodes = {n["Node"] for n in consul_api.catalog.nodes()[1]}  # registered with the agent token
    assert nodes == {"server", *(f"client-{i}" for i in range(1, secure_cluster.shape().clients + 1))}
    assert api.nomad().acl.get_self_token()["Type"] == "management"
    vault = api.vault()
    assert vault.sys.read_health_status(method="GET")["sealed"] is False
    assert vault.sys.read_policy("nomad-server")["data"]["rules"] == bootstrap.NOMAD_SERVER_POLICY
    role = vault.auth.token.read_role(wiring.VAULT_ROLE)["data"]
    assert (role["orphan"], role["renewable"], role["token_period"], role["disallowed_policies"]) == (True, True, 259200, ["nomad-server"])
    mounts = vault.sys.list_mounted_secrets_engines()["data"]
    assert mounts["secret/"]["type"] == "kv" and mounts["secret/"]["options"]["version"] == "2"
    assert mounts["consul/"]["type"] == "consul"
    access = api.session().get(f"{api.vault_url}/v1/consul/config/access", timeout=10).json()["data"]
    assert (access["address"], access["scheme"]) == (f"{secure_cluster.api().consul_url.split('//')[1]}", "https")


# ---- least privilege -------------------------------------------------------------------


def test_a_submitter_of_namespace_a_cannot_touch_namespace_b(secure_cluster, tmp_path):
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    for name in (NAMESPACE_A, NAMESPACE_B):
        ensure_namespace(api, found["nomad"], name)
    job_b = unique("ns-b")
    spec_b = secured(probe_job(job_b, namespace=NAMESPACE_B, context={"sleep": 120}), secure_cluster, tmp_path)
    submitted = nomadtf("run", str(write_job(tmp_path, spec_b)), "--detach", env=secure_cluster.env(), timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    team_a = submitter_env(secure_cluster, NAMESPACE_A)
    try:
        for args in (("status", job_b), ("logs", job_b, "--role", "chief"), ("stop", job_b)):
            denied = nomadtf(*args, "--namespace", NAMESPACE_B, env=team_a, timeout=60)
            assert denied.returncode == 1, (args, denied.stdout, denied.stderr)
            assert "NOMAD_TOKEN" in denied.stderr and "capability" in denied.stderr, denied.stderr
            assert "Traceback" not in denied.stderr
            assert team_a["NOMAD_TOKEN"] not in denied.stderr + denied.stdout
        # Still running: the refused `stop` did nothing.
        job = api.get(f"{found['nomad']}/v1/job/{job_b}", params={"namespace": NAMESPACE_B}, timeout=10).json()
        assert job["Status"] in ("running", "pending") and not job["Stop"]
    finally:
        nomadtf("stop", job_b, "--namespace", NAMESPACE_B, "--purge", env=secure_cluster.env(), timeout=60)


def test_the_printed_submitter_policy_is_enough_to_run_a_job(secure_cluster, tmp_path):
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    ensure_namespace(api, found["nomad"], NAMESPACE_A)
    job = unique("ns-a")
    spec = secured(probe_job(job, namespace=NAMESPACE_A), secure_cluster, tmp_path)
    team_a = submitter_env(secure_cluster, NAMESPACE_A)
    runs = []
    for _attempt in range(2):  # the same job twice: the second run replaces the first's state
        result = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "4m", env=team_a, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "probe finished" in result.stdout + result.stderr
        # agent read: the job is rendered for the server's own version; the profile key is readable.
        assert "could not read Nomad's version" not in result.stderr and "no cluster profile" not in result.stderr, result.stderr
        status = nomadtf("status", job, "--namespace", NAMESPACE_A, env=team_a, timeout=60)
        assert status.returncode == 0 and "succeeded" in status.stdout, status.stdout + status.stderr
        runs.append(re.search(r"run ([0-9a-f]{8})", status.stdout)[1])
    assert runs[0] != runs[1], runs
    stopped = nomadtf("stop", job, "--namespace", NAMESPACE_A, "--purge", env=team_a, timeout=60)
    assert stopped.returncode == 0, stopped.stderr


def test_a_token_without_rights_is_explained_and_nothing_is_submitted(secure_cluster, tmp_path):
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    empty = api.post(f"{found['nomad']}/v1/acl/token", json={"Type": "client", "Policies": []}, timeout=10)
    # A client token needs a policy: one that grants nothing in any namespace.
    if empty.status_code >= 400:
        api.post(f"{found['nomad']}/v1/acl/policy/nothing", json={"Name": "nothing", "Rules": 'namespace "nowhere" { policy = "deny" }'}, timeout=10).raise_for_status()
        empty = api.post(f"{found['nomad']}/v1/acl/token", json={"Type": "client", "Policies": ["nothing"]}, timeout=10)
    empty.raise_for_status()
    job = unique("no-rights")
    spec = secured(probe_job(job), secure_cluster, tmp_path)
    env = {**secure_cluster.env(), "NOMAD_TOKEN": empty.json()["SecretID"]}
    # The job's tasks get Vault tokens from Nomad: the version decides how, and this token may
    # not read it (agent:read, node:read), so the run is refused before anything is sent.
    result = nomadtf("run", str(write_job(tmp_path, spec)), env=env, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "NOMAD_TOKEN" in result.stderr and "capability" in result.stderr and "Nothing was submitted" in result.stderr
    # Named, the version is no longer the problem: the submission is refused for the token's rights.
    result = nomadtf("run", str(write_job(tmp_path, spec)), env={**env, "NOMADTF_NOMAD_VERSION": "1.6.1"}, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOMAD_TOKEN" in result.stderr and "capability" in result.stderr and "Traceback" not in result.stderr
    assert api.get(f"{found['nomad']}/v1/job/{job}", timeout=10).status_code == 404
    kv = api.get(f"{found['consul']}/v1/kv/nomadtf/default/{job}/", params={"recurse": "true"}, timeout=10)
    assert kv.status_code == 404


def test_a_jobs_task_token_reaches_only_its_own_keys(secure_cluster, tmp_path):
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    x, y = unique("job-x"), unique("job-y")
    spec_x = parse_spec(secured(probe_job(x), secure_cluster, tmp_path))
    secured(probe_job(y), secure_cluster, tmp_path)
    # The task's view: a Vault token with only job X's policy, as Nomad derives it.
    task_vault = api.post(
        f"{found['vault']}/v1/auth/token/create", json={"policies": [acl.policy_name(spec_x)], "ttl": "10m"}, timeout=10
    ).json()["auth"]["client_token"]
    vault_as_task = anonymous()
    vault_as_task.verify = str(secure_cluster.secure_state.ca_file)
    vault_as_task.headers["X-Vault-Token"] = task_vault
    token_path = spec_x.discovery.consul_token_path
    assert token_path.startswith("consul/creds/")  # the stack's Consul secrets engine: a token per task
    read = vault_as_task.get(f"{found['vault']}/v1/{token_path}", timeout=10)
    assert read.status_code == 200 and read.json()["lease_duration"] > 0 and read.json()["renewable"]
    other = vault_as_task.get(f"{found['vault']}/v1/{token_path.replace(x, y)}", timeout=10)
    assert other.status_code == 403  # job X's tasks cannot get job Y's Consul tokens
    consul_as_task = anonymous()
    consul_as_task.verify = vault_as_task.verify
    consul_as_task.headers["X-Consul-Token"] = read.json()["data"]["token"]
    base = found["consul"]
    assert consul_as_task.put(f"{base}/v1/kv/nomadtf/default/{x}/probe", data=b"1", timeout=10).status_code == 200
    assert consul_as_task.get(f"{base}/v1/kv/nomadtf/default/{x}/probe", timeout=10).status_code == 200
    api.put(f"{base}/v1/kv/nomadtf/default/{y}/state", data=b"y's", timeout=10).raise_for_status()
    assert consul_as_task.put(f"{base}/v1/kv/nomadtf/default/{y}/probe", data=b"1", timeout=10).status_code == 403
    assert consul_as_task.get(f"{base}/v1/kv/nomadtf/default/{y}/state", timeout=10).status_code == 403
    # Listings are filtered: job Y's keys are invisible to job X's tasks.
    listed = consul_as_task.get(f"{base}/v1/kv/nomadtf/", params={"recurse": "true", "keys": "true"}, timeout=10)
    assert listed.status_code == 200 and not [k for k in listed.json() if f"/{y}/" in k], listed.text
    node = api.get(f"{base}/v1/catalog/nodes", timeout=10).json()[0]
    register = {"Node": node["Node"], "Address": node["Address"], "Service": {"Service": f"{y}-chief", "Port": 1}}
    assert consul_as_task.put(f"{base}/v1/catalog/register", json=register, timeout=10).status_code == 403
    register["Service"]["Service"] = f"{x}-chief"
    assert consul_as_task.put(f"{base}/v1/catalog/register", json=register, timeout=10).status_code == 403
    # Revoking the lease (what a task does when it ends) deletes the token in Consul.
    api.put(f"{found['vault']}/v1/sys/leases/revoke", json={"lease_id": read.json()["lease_id"]}, timeout=10).raise_for_status()
    assert consul_as_task.get(f"{base}/v1/kv/nomadtf/default/{x}/probe", timeout=10).status_code == 403


# ---- training, and where a secret may be ---------------------------------------------------


class ProcessScan(threading.Thread):
    """While the job runs: every process whose argv or environment holds `needle`."""

    def __init__(self, needle: str, file_needle: str):
        super().__init__(daemon=True)
        self.needle = needle.encode()
        self.file_needle = file_needle.encode()
        self.found: dict[int, tuple[str, str]] = {}
        self.chief_seen = False
        # The consumer's secrets dir as it sees it (Nomad's tmpfs lives in the client's own
        # mount namespace): file name -> (mode, holds the file secret).
        self.secrets_dir: dict[str, tuple[str, bool]] = {}
        self.alloc_files_with_secret: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for proc in psutil.process_iter(["pid"]):
                pid = proc.info["pid"]
                for what in ("cmdline", "environ"):
                    try:
                        data = Path(f"/proc/{pid}/{what}").read_bytes()
                    except OSError:
                        continue
                    if self.needle in data:
                        env = Path(f"/proc/{pid}/environ").read_bytes() if what == "environ" else b""
                        role = re.search(rb"NOMADTF_ROLE=([a-z]+)", env)
                        self.found[pid] = (what, role.group(1).decode() if role else "?")
                    if what == "environ" and b"\0NOMADTF_INDEX=" in data and re.search(rb"(^|\0)NOMADTF_ROLE=chief\0", data):
                        # The chief's training process (NOMADTF_INDEX: not its `nomadtf task`).
                        # Started ahead of the cluster, it gets the secret in the handoff
                        # (runtime/warm.py), after /proc took its environment.
                        self.chief_seen = True
                        self._look_inside(pid, data)

    def _look_inside(self, pid: int, env: bytes) -> None:
        found = dict(re.findall(rb"(NOMAD_SECRETS_DIR|NOMAD_ALLOC_DIR)=([^\0]+)", env))
        root = Path(f"/proc/{pid}/root")
        try:
            secrets_dir = root / found[b"NOMAD_SECRETS_DIR"].decode().lstrip("/")
            for entry in secrets_dir.iterdir():
                self.secrets_dir[entry.name] = (oct(entry.stat().st_mode & 0o777), self.file_needle in entry.read_bytes())
            alloc = (root / found[b"NOMAD_ALLOC_DIR"].decode().lstrip("/")).parent
            for path in files_containing(alloc, self.file_needle):
                self.alloc_files_with_secret.add(str(path.relative_to(alloc)))
        except (KeyError, OSError):
            pass


def files_containing(root: Path, needle: bytes) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                hits.append(path)
        except OSError:
            continue
    return hits


def test_the_ps_example_trains_with_acls_and_tls_and_secrets_stay_where_they_belong(secure_cluster, tmp_path):
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    job = unique("secure-digits")
    canary_env, canary_file = f"canary-env-{secrets.token_hex(12)}", f"canary-file-{secrets.token_hex(12)}"
    api.post(
        f"{found['vault']}/v1/secret/data/nomadtf-canary/{job}", json={"data": {"api_token": canary_env, "tls_key": canary_file}}, timeout=10
    ).raise_for_status()
    spec = json.loads((EXAMPLES / "secrets" / "job.json").read_text())
    spec.update(name=job)
    spec["entrypoint"]["workdir"] = str(EXAMPLES / "digits")
    spec["context"].update(steps=300)
    for ref in spec["secrets"]:
        ref["path"] = f"secret/nomadtf-canary/{job}"
    spec["vault"]["policies"] = []
    spec = secured(spec, secure_cluster, tmp_path)  # `acl apply` also grants read on the secrets
    scan = ProcessScan(canary_env, canary_file)
    scan.start()
    try:
        result = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "6m", env=secure_cluster.env(), timeout=420)
    finally:
        scan.stop.set()
        scan.join()
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    accuracy = float(re.findall(r"final_accuracy=([0-9.]+)", out)[-1])
    assert accuracy > 0.8, out
    # No argv had the secret, and no process but the chief's training process had it in
    # the environment it started with (none at all when that process was started ahead of
    # the cluster: the secret came in the handoff).
    assert scan.chief_seen, "the scan never saw the chief's training process"
    assert {v for v in scan.found.values()} <= {("environ", "chief")}, scan.found
    # Not in the job (API JSON, every version), not in logs, not in Consul.
    for canary in (canary_env, canary_file):
        versions = api.get(f"{found['nomad']}/v1/job/{job}/versions", timeout=10).text
        assert canary not in versions
        assert canary not in out
        kv = api.get(f"{found['consul']}/v1/kv/", params={"recurse": "true"}, timeout=10).json() or []
        assert all(canary not in base64.b64decode(e.get("Value") or b"").decode(errors="replace") for e in kv)
    logs = "".join(
        nomadtf("logs", job, "--role", role, env=secure_cluster.env(), timeout=60).stdout for role in ("chief", "worker", "ps")
    )
    assert canary_env not in logs and canary_file not in logs
    # Inside the chief's allocation, as its code saw it: the file secret in exactly one 0600
    # file of the secrets dir, and no Vault token file there.
    assert scan.secrets_dir.get("client.key") == ("0o600", True), scan.secrets_dir
    assert "vault_token" not in scan.secrets_dir, scan.secrets_dir
    assert [name for name, (_mode, has) in scan.secrets_dir.items() if has] == ["client.key"]
    assert {Path(p).name for p in scan.alloc_files_with_secret} <= {"client.key"}, scan.alloc_files_with_secret
    # On the host's disk (configs, data dirs, logs): neither secret anywhere.
    state = secure_cluster.state_dir
    assert files_containing(state, canary_env.encode()) == []
    assert files_containing(state, canary_file.encode()) == []
    nomadtf("stop", job, "--purge", env=secure_cluster.env(), timeout=60)


# ---- renewal and revocation -------------------------------------------------------------


def test_a_tasks_consul_token_is_renewed_while_it_runs_and_revoked_when_it_ends(secure_cluster, tmp_path, monkeypatch):
    """`ConsulToken` as `nomadtf task` uses it, against the real engine: a role whose tokens
    live 10 s, logged in with AppRole (whose own 10 s login token must be renewed too)."""
    from nomadtf.servers import vault as vault_api

    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    job = unique("renew")
    spec = parse_spec(secured(probe_job(job), secure_cluster, tmp_path))
    name = acl.policy_name(spec)
    vault = found["vault"]
    api.post(f"{vault}/v1/consul/roles/{name}", json={"consul_policies": [name], "ttl": "10s", "max_ttl": "1h"}, timeout=10).raise_for_status()
    if "approle/" not in api.get(f"{vault}/v1/sys/auth", timeout=10).json()["data"]:
        api.post(f"{vault}/v1/sys/auth/approle", json={"type": "approle"}, timeout=10).raise_for_status()
    api.post(
        f"{vault}/v1/auth/approle/role/{name}", json={"token_policies": [name], "token_ttl": "10s", "token_max_ttl": "1h"}, timeout=10
    ).raise_for_status()
    role_id = api.get(f"{vault}/v1/auth/approle/role/{name}/role-id", timeout=10).json()["data"]["role_id"]
    secret_id = api.post(f"{vault}/v1/auth/approle/role/{name}/secret-id", timeout=10).json()["data"]["secret_id"]
    monkeypatch.setenv("NOMADTF_VAULT_ROLE_ID", role_id)
    monkeypatch.setenv("NOMADTF_VAULT_SECRET_ID", secret_id)
    monkeypatch.setenv("VAULT_CACERT", str(secure_cluster.secure_state.ca_file))
    errors: list[str] = []
    grant = vault_api.ConsulToken.read(
        {"auth": "approle", "address": vault}, spec.discovery.consul_token_path, on_error=errors.append
    )
    as_task = anonymous()
    as_task.verify = str(secure_cluster.secure_state.ca_file)
    as_task.headers["X-Consul-Token"] = grant.token
    key = f"{found['consul']}/v1/kv/nomadtf/default/{job}/alive"
    try:
        assert grant.lease and grant.lease["lease_duration"] <= 10
        time.sleep(25)  # two and a half lifetimes of both the Consul token and the login token
        assert as_task.put(key, data=b"1", timeout=10).status_code == 200, "the Consul token was not renewed"
        assert grant.client.auth.token.lookup_self()["data"]["ttl"] > 0, "the AppRole login token was not renewed"
        assert errors == []
    finally:
        grant.close()
    assert as_task.put(key, data=b"2", timeout=10).status_code == 403  # revoked: deleted in Consul


def test_acl_revoke_removes_what_apply_created(secure_cluster, tmp_path):
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    spec = secured(probe_job(unique("revoke")), secure_cluster, tmp_path)
    name = spec["vault"]["policies"][0]
    policies = lambda: {p["Name"] for p in api.get(f"{found['consul']}/v1/acl/policies", timeout=10).json()}  # noqa: E731
    assert name in policies()
    assert api.get(f"{found['vault']}/v1/consul/roles/{name}", timeout=10).status_code == 200
    revoked = nomadtf("acl", "revoke", str(write_job(tmp_path, spec)), env=secure_cluster.env(), timeout=60)
    assert revoked.returncode == 0, revoked.stderr
    assert name not in policies()
    assert api.get(f"{found['vault']}/v1/consul/roles/{name}", timeout=10).status_code == 404
    assert api.get(f"{found['vault']}/v1/sys/policies/acl/{name}", timeout=10).status_code == 404
    # Without an operator's Consul token, `acl apply` explains what it needs.
    denied = nomadtf("acl", "apply", str(write_job(tmp_path, spec)), env={**secure_cluster.env(), "CONSUL_HTTP_TOKEN": ""}, timeout=60)
    assert denied.returncode == 1 and "CONSUL_HTTP_TOKEN" in denied.stderr and "Traceback" not in denied.stderr, denied.stderr


# ---- `acl apply` on the secure stack ---------------------------------------------------------------


def _as(token_header: str, token: str, ca: str) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = ca
    session.headers[token_header] = token
    return session


def test_acl_apply_for_two_jobs_whose_names_joined_alike_keeps_each_to_its_own(secure_cluster, tmp_path):
    """`ml/team-x` then `ml-team/x`: both keep working, neither reads the other's secrets or
    keys, and revoking one leaves the other's policies alone."""
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    ca = str(secure_cluster.secure_state.ca_file)
    tag = unique("n").split("-")[1]
    jobs = [(f"ml{tag}", "team-x"), (f"ml{tag}-team", "x")]
    env = secure_cluster.env()
    specs: list[dict] = []
    task_vault: list[requests.Session] = []
    for i, (namespace, name) in enumerate(jobs):
        secret = f"nomadtf-names/{tag}/{i}"
        api.post(f"{found['vault']}/v1/secret/data/{secret}", json={"data": {"value": f"secret-of-{i}"}}, timeout=10).raise_for_status()
        spec = {
            **probe_job(name), "namespace": namespace,
            "secrets": [{"path": f"secret/{secret}", "key": "value", "env": "NAMES_SECRET"}],
            "vault": {"address": found["vault"], "ca_file": ca},
        }
        (tmp_path / str(i)).mkdir()
        applied = nomadtf("acl", "apply", str(write_job(tmp_path / str(i), spec)), env=env, timeout=60)
        assert applied.returncode == 0, applied.stderr
        printed = json.loads(applied.stdout.split("add to job.json:", 1)[1])
        specs.append({**spec, "discovery": printed["discovery"], "vault": {**spec["vault"], **printed["vault"]}, "_secret": secret})
    names = [s["vault"]["policies"][0] for s in specs]
    assert names[0] != names[1]
    try:
        for spec in specs:
            token = api.post(f"{found['vault']}/v1/auth/token/create", json={"policies": spec["vault"]["policies"], "ttl": "10m"}, timeout=10)
            task_vault.append(_as("X-Vault-Token", token.json()["auth"]["client_token"], ca))
        for i, vault in enumerate(task_vault):
            other = 1 - i
            own_secret = vault.get(f"{found['vault']}/v1/secret/data/{specs[i]['_secret']}", timeout=10)
            assert own_secret.status_code == 200 and own_secret.json()["data"]["data"]["value"] == f"secret-of-{i}"
            assert vault.get(f"{found['vault']}/v1/secret/data/{specs[other]['_secret']}", timeout=10).status_code == 403
            creds = vault.get(f"{found['vault']}/v1/{specs[i]['discovery']['consul_token_path']}", timeout=10)
            assert creds.status_code == 200, creds.text
            assert vault.get(f"{found['vault']}/v1/{specs[other]['discovery']['consul_token_path']}", timeout=10).status_code == 403
            consul = _as("X-Consul-Token", creds.json()["data"]["token"], ca)
            own_ns, own_job = jobs[i]
            other_ns, other_job = jobs[other]
            assert consul.put(f"{found['consul']}/v1/kv/nomadtf/{own_ns}/{own_job}/probe", data=b"1", timeout=10).status_code == 200
            assert consul.put(f"{found['consul']}/v1/kv/nomadtf/{other_ns}/{other_job}/probe", data=b"1", timeout=10).status_code == 403
        # Revoking the second job leaves the first one's policies in place.
        revoked = nomadtf("acl", "revoke", str(tmp_path / "1" / "x.json"), env=env, timeout=60)
        assert revoked.returncode == 0, revoked.stderr
        assert api.get(f"{found['vault']}/v1/sys/policies/acl/{names[1]}", timeout=10).status_code == 404
        assert api.get(f"{found['vault']}/v1/sys/policies/acl/{names[0]}", timeout=10).status_code == 200
        assert task_vault[0].get(f"{found['vault']}/v1/secret/data/{specs[0]['_secret']}", timeout=10).status_code == 200
        # A Vault policy of the first job's name that is not the job's: `acl apply` refuses it.
        api.put(f"{found['vault']}/v1/sys/policies/acl/{names[1]}", json={"policy": 'path "secret/data/*" { capabilities = ["read"] }'},
                timeout=10).raise_for_status()
        refused = nomadtf("acl", "apply", str(tmp_path / "1" / "x.json"), env=env, timeout=60)
        assert refused.returncode == 1 and "is not this job's" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        consul_names = {p["Name"] for p in api.get(f"{found['consul']}/v1/acl/policies", timeout=10).json()}
        assert names[1] not in consul_names  # nothing half-done
    finally:
        api.delete(f"{found['vault']}/v1/sys/policies/acl/{names[1]}", timeout=10)
        nomadtf("acl", "revoke", str(tmp_path / "0" / "team-x.json"), env=env, timeout=60)


def test_acl_apply_refuses_a_glob_or_an_unlisted_policy_writes_nothing_and_prints_what_it_grants(secure_cluster, tmp_path):
    """`discovery.consul_token_path: "+/*"` would become read on every Vault path and a job's
    `vault.policies` any policy at all: `acl apply` refuses both (exit 2) before it writes
    anything; allowed by the operator, it writes and lists each grant."""
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    ca = str(secure_cluster.secure_state.ca_file)
    env = secure_cluster.env()
    name = unique("grants")
    base = {**probe_job(name), "vault": {"address": found["vault"], "ca_file": ca},
            "secrets": [{"path": f"secret/nomadtf-grants/{name}", "key": "value", "env": "GRANTS_SECRET"}]}  # fmt: skip
    own = wire.acl_name("default", name)
    try:
        for extra, said in (({"discovery": {"consul_token_path": "+/*"}}, "discovery.consul_token_path: '+/*' is not one exact path"),
                            ({"vault": {**base["vault"], "policies": ["nomadtf-digits-read"]}}, "vault.policies: 'nomadtf-digits-read' is not on the operator's allowlist")):  # fmt: skip
            refused = nomadtf("acl", "apply", str(write_job(tmp_path, {**base, **extra})), env=env, timeout=60)
            assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
            assert api.get(f"{found['vault']}/v1/sys/policies/acl/{own}", timeout=10).status_code == 404  # nothing written
            assert own not in {p["Name"] for p in api.get(f"{found['consul']}/v1/acl/policies", timeout=10).json()}
        allowed = nomadtf("acl", "apply", str(write_job(tmp_path, {**base, "vault": {**base["vault"], "policies": ["nomadtf-digits-read"]}})),
                          "--allow-policy", "nomadtf-digits-read", env=env, timeout=60)  # fmt: skip
        assert allowed.returncode == 0, allowed.stderr
        granted = allowed.stderr.split("granted, and nothing else:", 1)[1]
        assert f"Vault read on secret/data/nomadtf-grants/{name}" in granted and f"Consul key_prefix nomadtf/default/{name}/: write" in granted, granted
    finally:
        nomadtf("acl", "revoke", str(write_job(tmp_path, base)), env=env, timeout=60)


# ---- a shared cluster: the admission controller under ACLs (issues #22, #31) ----------------


def _spread_job(name: str, namespace: str, node_cpu: int, cluster, tmp_path: Path, **context) -> dict:
    """A probe job whose three tasks each ask 60 % of the smallest client's CPU: alone it fits
    (one task per client), beside another such job it cannot (no client holds two)."""
    spec = probe_job(name, namespace=namespace, context=context)
    for role in spec["roles"].values():
        role["cpu"] = int(node_cpu * 0.6)
    return secured(spec, cluster, tmp_path)


def _node_cpu(api: requests.Session, nomad_url: str) -> tuple[int, int]:
    """(the smallest client's CPU, how many clients)."""
    from nomadtf.job import capacity
    from nomadtf.job.answers import Node

    nodes = capacity.node_capacities(map(Node.from_api, api.get(f"{nomad_url}/v1/nodes", params={"resources": "true"}, timeout=10).json()), {"Datacenters": ["*"]})
    return min(n.resources.cpu for n in nodes), len(nodes)


def _job(api: requests.Session, nomad_url: str, name: str, namespace: str) -> dict | None:
    resp = api.get(f"{nomad_url}/v1/job/{name}", params={"namespace": namespace}, timeout=10)
    return resp.json() if resp.status_code == 200 else None


def _queued(api: requests.Session, nomad_url: str, name: str, namespace: str) -> bool:
    from nomadtf.admission import suspension

    job = _job(api, nomad_url, name, namespace)
    return job is not None and suspension.state(job) == suspension.QUEUED


def _controller_story(cluster) -> str:
    """What the controller's replicas logged and its board holds: for a failure's message."""
    from nomadtf import wire
    from nomadtf.devstack.controller import OPS_NAMESPACE

    api, found = cluster.api().session(), cluster.api().urls
    lines = []
    allocs = api.get(f"{found['nomad']}/v1/job/{wire.ADMISSION_SERVICE_JOB}/allocations", params={"namespace": OPS_NAMESPACE}, timeout=10).json()
    for alloc in allocs:
        lines.append(f"replica {alloc['ID'][:8]} on {alloc.get('NodeName')}: {alloc['ClientStatus']}")
        if alloc["ClientStatus"] == "running":
            for stream in ("stderr", "stdout"):
                resp = api.get(f"{found['nomad']}/v1/client/fs/logs/{alloc['ID']}", params={"task": "admission", "type": stream, "plain": "true",
                               "namespace": OPS_NAMESPACE}, timeout=10)  # fmt: skip
                lines.append(f"  {stream}: {resp.text[-2000:]}")
    board = api.get(f"{found['consul']}/v1/kv/{wire.KV_ADMISSION_BOARD}", params={"raw": "true"}, timeout=10)
    lines.append(f"board: {board.text[:3000]}")
    return "\n".join(lines)


def _leader(env: dict) -> str:
    out = nomadtf("admission", "status", env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    match = re.search(r"^leader: (.*) alloc ([0-9a-f]{8})$", out.stdout, re.M)
    return match[2] if match else ""


def _running(api: requests.Session, nomad_url: str, job: str, namespace: str) -> int:
    allocs = api.get(f"{nomad_url}/v1/job/{job}/allocations", params={"namespace": namespace}, timeout=10).json()
    return sum(a["ClientStatus"] == "running" for a in allocs)


def test_a_team_waiting_behind_another_learns_the_shortfall_but_not_the_other_team_s_names(secure_cluster, tmp_path):
    """Two teams on the secure several-client stack, each with only its submitter token: team-b's
    run waits suspended in its own namespace while team-a's job holds the clients, says what
    it needs and what the cluster lacks, and never names team-a or its job; the controller
    admits it once team-a's job ends."""
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    for name in (NAMESPACE_A, NAMESPACE_B):
        ensure_namespace(api, found["nomad"], name)
    node_cpu, _ = _node_cpu(api, found["nomad"])
    job_a, job_b, release = unique("held-by-a"), unique("waits-b"), tmp_path / "release-a"
    spec_a = _spread_job(job_a, NAMESPACE_A, node_cpu, secure_cluster, tmp_path, until_file=str(release))
    spec_b = _spread_job(job_b, NAMESPACE_B, node_cpu, secure_cluster, tmp_path)
    team_a, team_b = submitter_env(secure_cluster, NAMESPACE_A), submitter_env(secure_cluster, NAMESPACE_B)
    detached = nomadtf("run", str(write_job(tmp_path, spec_a)), "--detach", env=team_a, timeout=120)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    waiting = None
    try:
        wait_until(lambda: _running(api, found["nomad"], job_a, NAMESPACE_A) == 3, 120, "team-a's job on the clients")
        waiting = subprocess.Popen([str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, spec_b)), "--timeout", "4m"],
                                   env=team_b, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        wait_until(lambda: _queued(api, found["nomad"], job_b, NAMESPACE_B), 90, "team-b's run suspended in its namespace")
        time.sleep(2)
        assert _running(api, found["nomad"], job_b, NAMESPACE_B) == 0  # all or nothing: nothing of it placed while it waits
        release.touch()
        out, err = waiting.communicate(timeout=300)
        said = out + err
        assert waiting.returncode == 0, said
        assert "does not fit now: needs cpu" in said and "the cluster lacks cpu" in said, said
        assert job_a not in said and NAMESPACE_A not in said, said
        assert re.search(r"admitted after \d+s in the queue", said), said
    finally:
        release.touch()
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
        for job, namespace in ((job_a, NAMESPACE_A), (job_b, NAMESPACE_B)):
            nomadtf("stop", job, "--namespace", namespace, "--purge", env=secure_cluster.env(), timeout=60)


def _plain_hog(job_id: str, cpu: int, count: int) -> dict:
    """A batch job nomadtf did not start: `count` sleeps of `cpu` MHz, one per client. (Batch:
    what a service job holds the controller counts as held for good, and refuses a run that
    needs it as "never".)"""
    task = {"Name": "sleep", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["600"]},
            "Resources": {"CPU": cpu, "MemoryMB": 64}}  # fmt: skip
    group = {"Name": "sleep", "Count": count, "Tasks": [task], "Constraints": [{"Operand": "distinct_hosts", "RTarget": "true"}],
             "RestartPolicy": {"Attempts": 0, "Mode": "fail"}}  # fmt: skip
    return {"Job": {"ID": job_id, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [group]}}


def test_the_controller_keeps_admitting_when_its_leader_s_client_dies(secure_cluster, tmp_path):
    """The controller `dev up --secure` deployed (namespace ops, its own least-privilege tokens
    through the job's Nomad variable): two replicas on different clients. The leader's client
    dies (every process in it SIGKILLed); team-b's detached run waits behind a plain job that
    holds every client; once that ends, the standby has taken the lead and admits the run,
    each group exactly once."""
    from nomadtf import wire
    from nomadtf.devstack.controller import OPS_NAMESPACE
    from tests import faults
    from tests.node_loss import client_of

    operator = secure_cluster.env()
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    nomad_url = found["nomad"]
    ensure_namespace(api, nomad_url, NAMESPACE_B)
    node_cpu, clients = _node_cpu(api, nomad_url)
    hog, name = unique("hog"), unique("unattended-b")
    spec = probe_job(name, namespace=NAMESPACE_B, context={"sleep": 1})
    spec["roles"]["chief"]["cpu"] = int(node_cpu * 0.6)  # fits on any one client the hog left
    spec = secured(spec, secure_cluster, tmp_path)
    victim = None

    def replicas() -> list[dict]:
        allocs = api.get(f"{nomad_url}/v1/job/{wire.ADMISSION_SERVICE_JOB}/allocations", params={"namespace": OPS_NAMESPACE}, timeout=10).json()
        return [a for a in allocs if a["ClientStatus"] == "running"]

    try:
        running = wait_until(lambda: len(a := replicas()) == 2 and a, 90, "two replicas running")
        assert len({a["NodeID"] for a in running}) == 2, running  # distinct_hosts: never both on one client
        leading = wait_until(lambda: _leader(operator), 60, "a replica to lead")
        (lead_alloc,) = [a for a in running if a["ID"].startswith(leading)]
        victim = client_of(lead_alloc)

        api.post(f"{nomad_url}/v1/jobs", json=_plain_hog(hog, int(node_cpu * 0.6), clients), timeout=10).raise_for_status()
        wait_until(lambda: _running(api, nomad_url, hog, "default") == clients, 60, "the hog on every client")
        detached = nomadtf("run", str(write_job(tmp_path, spec)), "--detach", env=submitter_env(secure_cluster, NAMESPACE_B), timeout=120)
        assert detached.returncode == 0 and "the admission controller starts it in its turn" in detached.stderr, detached.stderr

        faults.kill_client(secure_cluster, victim)  # the leader's machine dies, its replica with it
        new_leader = wait_until(lambda: (lead := _leader(operator)) and lead != leading and lead, 120, "the standby to lead")
        assert new_leader != leading
        api.delete(f"{nomad_url}/v1/job/{hog}", params={"purge": "true"}, timeout=10).raise_for_status()

        def succeeded() -> bool:
            out = nomadtf("status", name, "--namespace", NAMESPACE_B, env=operator, timeout=30)
            return "outcome: succeeded" in out.stdout

        try:
            wait_until(succeeded, 180, f"{name} admitted by the standby and succeeded", interval=2.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_controller_story(secure_cluster)}") from None
        events = api.get(f"{nomad_url}/v1/job/{name}/scale", params={"namespace": NAMESPACE_B}, timeout=10).json()["TaskGroups"]
        for group in ("chief", "worker", "ps"):
            ups = [e for e in events[group]["Events"] or [] if (e.get("Count") or 0) > 0]
            assert len(ups) == 1, (group, ups)  # admitted exactly once
    finally:
        api.delete(f"{nomad_url}/v1/job/{hog}", params={"purge": "true"}, timeout=10)
        nomadtf("stop", name, "--namespace", NAMESPACE_B, "--purge", env=operator, timeout=60)
        if victim is not None:
            faults.restart_client(secure_cluster, victim)
    _, clients_now = _node_cpu(api, nomad_url)
    assert [r.node for r in secure_cluster.status().rows if r.node] == ["ready"] * clients_now


def test_a_hostile_neighbour_with_its_printed_rights_stops_no_other_team(secure_cluster, tmp_path):
    """team-a holds exactly the submitter policies `nomadtf acl policies` prints and uses every
    right they give against the queue: junk and rewritten copies in every Consul key its token
    reaches, the controller's keys and sessions it tries to take or destroy, suspended runs of
    its own with forged Meta (wanted counts naming team-b's groups, huge counts, not JSON), a
    priority of 10^9, a run of its own resumed out of turn. team-b's run still succeeds in
    bounded time, nothing appears in team-b's namespace that team-b did not send, the
    controller still leads, and `admission status` lists team-a's unreadable run."""
    from nomadtf import wire
    from nomadtf.admission import suspension

    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    nomad_url, consul_url = found["nomad"], found["consul"]
    ca = str(secure_cluster.secure_state.ca_file)
    for namespace in (NAMESPACE_A, NAMESPACE_B):
        ensure_namespace(api, nomad_url, namespace)
    operator = secure_cluster.env()
    leader_before = wait_until(lambda: _leader(operator), 60, "the controller to lead")
    team_a = submitter_env(secure_cluster, NAMESPACE_A)
    as_a_consul = _as("X-Consul-Token", team_a["CONSUL_HTTP_TOKEN"], ca)
    as_a_nomad = _as("X-Nomad-Token", team_a["NOMAD_TOKEN"], ca)
    node_cpu, _ = _node_cpu(api, nomad_url)
    evil, forged, name_b = unique("evil"), unique("forged"), unique("victim-b")
    try:
        # 1. Consul: every key its token may write gets junk; the controller's keys and sessions are refused.
        junk = {"Entry": "not json", "priority": 10**9, "namespace": NAMESPACE_B}
        for key in (wire.KV_ADMISSION_BOARD, wire.KV_ADMISSION_LEADER, wire.KV_ADMISSION_POLICY, wire.KV_ADMISSION_USAGE,
                    "nomadtf/_admission/queue/team-b/x", f"nomadtf/{NAMESPACE_B}/x"):  # fmt: skip
            assert as_a_consul.put(f"{consul_url}/v1/kv/{key}", data=json.dumps(junk), timeout=10).status_code == 403, key
        assert as_a_consul.delete(f"{consul_url}/v1/kv/{wire.KV_ADMISSION_LEADER}", timeout=10).status_code == 403
        # The sharing policy is the operator's: a team can neither write nor read it (`admission policy set` says what it takes).
        assert as_a_consul.get(f"{consul_url}/v1/kv/{wire.KV_ADMISSION_POLICY}", timeout=10).status_code in (403, 404)
        denied = nomadtf("admission", "policy", "clear", env=team_a, timeout=30)
        assert denied.returncode == 1 and "an operator's token with write on key nomadtf/_admission/policy" in denied.stderr, denied.stderr
        sessions = api.get(f"{consul_url}/v1/session/list", timeout=10).json()
        for session in sessions:
            assert as_a_consul.put(f"{consul_url}/v1/session/destroy/{session['ID']}", timeout=10).status_code == 403
        assert as_a_consul.put(f"{consul_url}/v1/session/create", json={"Name": "evil"}, timeout=10).status_code == 403
        own = f"nomadtf/{NAMESPACE_A}/{evil}/r/cluster/state"
        assert as_a_consul.put(f"{consul_url}/v1/kv/{own}", data=b"\xff\x00 not json", timeout=10).status_code == 200  # its own: allowed
        # 2. Suspended runs with forged Meta, registered with its own token.
        def suspended(job_id: str, counts: str, priority: int = 50, namespace: str = NAMESPACE_A, cpu: int = 50) -> dict:
            task = {"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": ["300"]}, "Resources": {"CPU": cpu, "MemoryMB": 32}}
            body = suspension.suspend({"Job": {"ID": job_id, "Namespace": namespace, "Type": "batch", "Datacenters": ["*"], "Priority": priority,
                                               "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}]}}, 30)  # fmt: skip
            body["Job"]["Meta"].update({wire.META_VERSION: "evil", wire.META_RUN: "r1", suspension.META_COUNTS: counts})
            return body

        # Nomad: another team's namespace and the controller's variable are refused.
        into_b = as_a_nomad.post(f"{nomad_url}/v1/jobs", params={"namespace": NAMESPACE_B}, json=suspended("evil", '{"g": 1}', namespace=NAMESPACE_B), timeout=10)
        assert into_b.status_code == 403, into_b.text
        assert as_a_nomad.get(f"{nomad_url}/v1/var/nomad/jobs/{wire.ADMISSION_SERVICE_JOB}", params={"namespace": "ops"}, timeout=10).status_code == 403

        too_high = as_a_nomad.post(f"{nomad_url}/v1/jobs", params={"namespace": NAMESPACE_A}, json=suspended(evil, '{"g": 1}', 10**9), timeout=10)
        assert too_high.status_code >= 400  # Nomad itself refuses a priority outside 1-100
        for job_id, counts in ((forged, '{"chief": 1}'), (f"{forged}-x", "not json"), (f"{forged}-y", '{"g": 100000}')):
            resp = as_a_nomad.post(f"{nomad_url}/v1/jobs", params={"namespace": NAMESPACE_A}, json=suspended(job_id, counts), timeout=10)
            assert resp.status_code == 200, resp.text
        # One of its own (larger than any node: the controller will not admit it) resumed out
        # of turn with its own scale-job right.
        resp = as_a_nomad.post(f"{nomad_url}/v1/jobs", params={"namespace": NAMESPACE_A}, json=suspended(evil, '{"g": 1}', 100, cpu=10**6), timeout=10)
        assert resp.status_code == 200, resp.text
        scaled = as_a_nomad.post(f"{nomad_url}/v1/job/{evil}/scale", params={"namespace": NAMESPACE_A},
                                 json={"Count": 1, "Target": {"Group": "g"}, "Message": "out of turn"}, timeout=10)  # fmt: skip
        assert scaled.status_code == 200, scaled.text  # Nomad CE lets a team scale its own job (docs/guide/queueing.md) ...

        def suspended_again() -> bool:
            events = api.get(f"{nomad_url}/v1/job/{evil}/scale", params={"namespace": NAMESPACE_A}, timeout=10).json()["TaskGroups"]
            return any("resumed out of turn" in (e.get("Message") or "") for group in events.values() for e in group["Events"] or [])

        wait_until(suspended_again, 30, "the controller to suspend team-a's run again")  # ... the controller puts it back in line

        # 3. team-b's run, followed by team-b with its own token: succeeds in bounded time.
        spec_b = probe_job(name_b, namespace=NAMESPACE_B, context={"sleep": 1})
        spec_b = secured(spec_b, secure_cluster, tmp_path)
        started = time.monotonic()
        out = nomadtf("run", str(write_job(tmp_path, spec_b)), "--timeout", "4m", env=submitter_env(secure_cluster, NAMESPACE_B), timeout=300)
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - started < 240
        in_b = {j["ID"] for j in api.get(f"{nomad_url}/v1/jobs", params={"namespace": NAMESPACE_B}, timeout=10).json()}
        assert in_b <= {name_b} | {j for j in in_b if not j.startswith(("evil", "forged"))}, in_b
        assert not {j for j in in_b if j.startswith(("evil", "forged"))}, in_b
        assert _leader(operator) == leader_before  # the controller still leads, untouched
        shown = nomadtf("admission", "status", env=team_a, timeout=30)
        assert shown.returncode == 0, shown.stderr
        assert f"skipped {NAMESPACE_A}/{forged}-x: Meta {suspension.META_COUNTS} is not JSON" in shown.stdout, shown.stdout
        assert f"skipped {NAMESPACE_A}/{forged}: Meta {suspension.META_COUNTS} names a group the job does not have" in shown.stdout, shown.stdout
        shown_b = nomadtf("admission", "status", env=submitter_env(secure_cluster, NAMESPACE_B), timeout=30)
        assert forged not in shown_b.stdout and NAMESPACE_A not in shown_b.stdout, shown_b.stdout  # no other team's names
        raw_board = as_a_consul.get(f"{consul_url}/v1/kv/{wire.KV_ADMISSION_BOARD}", params={"raw": "true"}, timeout=10)
        assert raw_board.status_code == 200 and name_b not in raw_board.text, raw_board.text  # nor in the key itself
    finally:
        for job_id in (evil, forged, f"{forged}-x", f"{forged}-y"):
            api.delete(f"{nomad_url}/v1/job/{job_id}", params={"purge": "true", "namespace": NAMESPACE_A}, timeout=10)
        api.delete(f"{consul_url}/v1/kv/nomadtf/{NAMESPACE_A}/{evil}", params={"recurse": "true"}, timeout=10)
        nomadtf("stop", name_b, "--namespace", NAMESPACE_B, "--purge", env=operator, timeout=60)


def test_a_submitter_that_may_not_read_nodes_queues_rather_than_failing(secure_cluster, tmp_path):
    """A token without node:read cannot measure the cluster: its run that does not fit now is
    queued (never a wrong "never") and admitted once the capacity is back."""
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    nomad_url = found["nomad"]
    ensure_namespace(api, nomad_url, NAMESPACE_B)
    node_cpu, clients = _node_cpu(api, nomad_url)
    env = submitter_env(secure_cluster, NAMESPACE_B)
    name = f"nomadtf-submit-{NAMESPACE_B}-no-nodes"
    rules = acl.nomad_submitter_policy(NAMESPACE_B).replace('node {\n  policy = "read"\n}\n', "")
    assert "node" not in rules.split("agent")[1]
    api.post(f"{nomad_url}/v1/acl/policy/{name}", json={"Name": name, "Rules": rules}, timeout=10).raise_for_status()
    token = api.post(f"{nomad_url}/v1/acl/token", json={"Type": "client", "Policies": [name]}, timeout=10)
    token.raise_for_status()
    env["NOMAD_TOKEN"] = token.json()["SecretID"]
    hog, job = unique("hog"), unique("no-nodes")
    spec = probe_job(job, namespace=NAMESPACE_B, context={"sleep": 1})
    for role in spec["roles"].values():
        role["cpu"] = int(node_cpu * 0.6)
    spec = secured(spec, secure_cluster, tmp_path)
    try:
        api.post(f"{nomad_url}/v1/jobs", json=_plain_hog(hog, int(node_cpu * 0.6), clients), timeout=10).raise_for_status()
        wait_until(lambda: _running(api, nomad_url, hog, "default") == clients, 60, "the hog on every client")
        waiting = subprocess.Popen([str(Path(sys.executable).parent / "nomadtf"), "run", str(write_job(tmp_path, spec)), "--timeout", "4m"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        wait_until(lambda: _queued(api, nomad_url, job, NAMESPACE_B), 90, "the run suspended in its namespace")
        api.delete(f"{nomad_url}/v1/job/{hog}", params={"purge": "true"}, timeout=10).raise_for_status()
        out, err = waiting.communicate(timeout=240)
        assert waiting.returncode == 0, out + err
        assert "never" not in err, err
    finally:
        api.delete(f"{nomad_url}/v1/job/{hog}", params={"purge": "true"}, timeout=10)
        nomadtf("stop", job, "--namespace", NAMESPACE_B, "--purge", env=secure_cluster.env(), timeout=60)


def test_the_printed_controller_policy_may_ask_another_team_s_run_to_checkpoint_and_a_team_may_not(secure_cluster):
    """Preemption's checkpoint request under ACLs: a token made from exactly `nomadtf acl
    policies`' controller Nomad policy signals a running allocation of team-a's (its task's
    SIGUSR1 handler runs), and team-b's submitter token is refused the same call."""
    from nomadtf.errors import NomadError
    from nomadtf.servers.nomad import NomadAPI
    from nomadtf.servers.nomadhttp import NomadSettings

    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    nomad_url = found["nomad"]
    for namespace in (NAMESPACE_A, NAMESPACE_B):
        ensure_namespace(api, nomad_url, namespace)
    name = unique("signalled")
    task = {"Name": "t", "Driver": "raw_exec", "Resources": {"CPU": 50, "MemoryMB": 32},
            "Config": {"command": "/bin/sh", "args": ["-c", "trap 'echo checkpoint-asked' USR1; while true; do sleep 0.2; done"]}}  # fmt: skip
    job = {"Job": {"ID": name, "Namespace": NAMESPACE_A, "Type": "batch", "Datacenters": ["*"],
                   "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [task]}]}}  # fmt: skip
    api.post(f"{nomad_url}/v1/jobs", params={"namespace": NAMESPACE_A}, json=job, timeout=10).raise_for_status()
    try:
        def running_alloc() -> dict | None:
            allocs = api.get(f"{nomad_url}/v1/job/{name}/allocations", params={"namespace": NAMESPACE_A}, timeout=10).json()
            return next((a for a in allocs if a["ClientStatus"] == "running"), None)

        alloc = wait_until(running_alloc, 60, "team-a's allocation to run")
        time.sleep(1)  # the shell has set its trap
        env = secure_cluster.env()
        controller = {**env, "NOMAD_TOKEN": nomad_token(secure_cluster, "nomadtf-test-controller", acl.nomad_controller_policy())}
        NomadAPI(NomadSettings.from_env(controller, namespace=NAMESPACE_A)).signal_allocation(alloc["ID"], "SIGUSR1")

        def logged() -> bool:
            resp = api.get(f"{nomad_url}/v1/client/fs/logs/{alloc['ID']}", params={"task": "t", "type": "stdout", "plain": "true",
                                                                                    "namespace": NAMESPACE_A}, timeout=10)  # fmt: skip
            return "checkpoint-asked" in resp.text

        wait_until(logged, 20, "the task's SIGUSR1 handler to run")
        team_b = submitter_env(secure_cluster, NAMESPACE_B)
        with pytest.raises(NomadError):
            NomadAPI(NomadSettings.from_env(team_b, namespace=NAMESPACE_A)).signal_allocation(alloc["ID"], "SIGUSR1")
    finally:
        api.delete(f"{nomad_url}/v1/job/{name}", params={"purge": "true", "namespace": NAMESPACE_A}, timeout=10)


def test_a_team_s_submitter_token_mounts_its_own_checkpoint_volume_and_not_another_team_s(secure_cluster, tmp_path):
    """A docker job reaches checkpoints through its namespace's host volume, which the printed
    submitter policy grants for its own namespace only: team-b registering a job that mounts
    team-a's folder is refused by Nomad (403), its own is accepted (issue #33)."""
    from nomadtf.job.render import render_job

    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    for name in (NAMESPACE_A, NAMESPACE_B):
        ensure_namespace(api, found["nomad"], name)
    job_id = unique("vol-b")
    spec = probe_job(job_id, namespace=NAMESPACE_B)
    spec["driver"] = {"name": "docker", "image": "nomadtf:never-pulled"}
    body = render_job(parse_spec(secured(spec, secure_cluster, tmp_path)))
    for group in body["Job"]["TaskGroups"]:
        group["Count"] = 0  # registered, never placed: the ACL check is what is tried
        assert set(group["Volumes"]) == {"nomadtf-team-b", wire.CA_VOLUME}, group["Volumes"]
    token = {"X-Nomad-Token": submitter_env(secure_cluster, NAMESPACE_B)["NOMAD_TOKEN"]}
    url = f"{found['nomad']}/v1/jobs"
    try:
        own = api.post(url, json=body, headers=token, params={"namespace": NAMESPACE_B}, timeout=30)
        assert own.status_code == 200, own.text
        stolen = json.loads(json.dumps(body))
        for group in stolen["Job"]["TaskGroups"]:
            group["Volumes"]["nomadtf-team-b"]["Source"] = wire.checkpoint_volume(NAMESPACE_A)
        refused = api.post(url, json=stolen, headers=token, params={"namespace": NAMESPACE_B}, timeout=30)
        assert refused.status_code == 403 and "Permission denied" in refused.text, (refused.status_code, refused.text)
        job = api.get(f"{found['nomad']}/v1/job/{job_id}", params={"namespace": NAMESPACE_B}, timeout=10).json()
        assert {g["Volumes"]["nomadtf-team-b"]["Source"] for g in job["TaskGroups"]} == {"nomadtf-team-b"}  # unchanged
    finally:
        api.delete(f"{found['nomad']}/v1/job/{job_id}", params={"namespace": NAMESPACE_B, "purge": "true"}, timeout=30)
