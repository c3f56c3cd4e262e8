"""One job.json for every cluster: examples/secrets/job.json runs with no cluster setting in
job.json or on the command line, on the plain stack and on the secure one, after the
operator's one-time setup (the cluster profile, then `nomadtf acl apply` for the job).

On the secure stack the profile travels the way an operator sets it: `nomadtf acl profile`
writes it to the stack's Consul KV and every submission reads it from there. Tests run one
after another, and each removes the profile before it ends, so no other test's job is
filled by it. On the plain stack it comes from the file NOMADTF_CLUSTER_PROFILE names (the
other source; both feed the same fill). The `--var`s left are not the cluster's: a unique name and small CPU asks (the stacks are
shared), this checkout's workdir (the docs' recipes pass it too), and fewer steps."""

from __future__ import annotations

import json
import re
import secrets

import pytest
import requests

from nomadtf import wire
from nomadtf.devstack import stack as stack_mod
from tests.cluster_access import nomad_token
from tests.docs_commands import shown_argv
from tests.helpers import EXAMPLES, nomadtf, unique

pytestmark = pytest.mark.stack

EXAMPLE = EXAMPLES / "secrets" / "job.json"
EXAMPLE_SECRET = "secret/data/nomadtf/digits"  # what examples/secrets/job.json reads


def _store_example_secret(api, vault_url: str) -> None:
    """The example's secret, unless the stack holds one already (it is shared)."""
    if api.get(f"{vault_url}/v1/{EXAMPLE_SECRET}", timeout=10).status_code != 200:
        data = {"api_token": secrets.token_hex(8), "tls_key": secrets.token_hex(8)}
        api.post(f"{vault_url}/v1/{EXAMPLE_SECRET}", json={"data": data}, timeout=10).raise_for_status()


def _run_example(tmp_path, env: dict, profile: dict, through_consul: bool) -> tuple[str, str, int, dict]:
    """The operator's setup (the profile, `acl apply`), then the run; (name, output, exit
    code, the environment both used)."""
    path = tmp_path / "cluster-profile.json"
    path.write_text(json.dumps(profile))
    if through_consul:
        stored = nomadtf(*shown_argv(r"nomadtf acl profile cluster-profile.json", {"cluster-profile.json": str(path)}), env=env, timeout=60)
        assert stored.returncode == 0, stored.stdout + stored.stderr
        shown = nomadtf("acl", "profile", env=env, timeout=60)
        assert shown.returncode == 0 and json.loads(shown.stdout) == profile, shown.stdout + shown.stderr
    else:
        env = {**env, "NOMADTF_CLUSTER_PROFILE": str(path)}
    name = unique("profile-secrets")
    job_vars = ["--var", f"name={name}"]
    applied = nomadtf(*shown_argv(r"nomadtf acl apply examples/secrets/job.json"), *job_vars, "--allow-policy", "nomadtf-digits-read", env=env, timeout=60)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # Smaller CPU asks than the example's 2300 MHz: the shared stacks run other tests' jobs.
    small = [arg for role in ("chief", "worker", "ps") for arg in ("--var", f"roles.{role}.cpu=200")]
    result = nomadtf(
        *shown_argv(r"nomadtf run examples/secrets/job.json --var entrypoint.workdir=\$PWD/examples/digits"), *job_vars,
        "--var", "context.steps=200", *small, "--timeout", "6m", env=env, timeout=420,
    )
    return name, result.stdout + result.stderr, result.returncode, env


def _cleanup(name: str, env: dict) -> None:
    nomadtf("stop", name, "--purge", env=env, timeout=60)
    nomadtf("acl", "revoke", str(EXAMPLE), "--var", f"name={name}", env=env, timeout=60)


def test_the_secrets_example_runs_unchanged_on_the_plain_stack(stack, tmp_path):
    operator = requests.Session()  # the plain stack's root token, as `nomadtf dev env` gives it
    operator.headers["X-Vault-Token"] = stack.root_token()
    _store_example_secret(operator, stack_mod.VAULT_ADDR)
    name, out, code, env = _run_example(tmp_path, {}, {"job_vault_policy": True}, through_consul=False)
    try:
        assert code == 0, out
        assert float(re.findall(r"final_accuracy=([0-9.]+)", out)[-1]) > 0.8, out
        job = operator.get(f"{stack_mod.NOMAD_ADDR}/v1/job/{name}", timeout=10).json()
        chief = next(g for g in job["TaskGroups"] if g["Name"] == "chief")["Tasks"][0]
        # The job's own policy, which `acl apply` wrote, is what reads the secrets.
        assert chief["Vault"]["Policies"] == ["nomadtf-digits-read", wire.acl_name("default", name)]
    finally:
        _cleanup(name, env)


def test_the_secrets_example_runs_unchanged_on_the_secure_stack(secure_cluster, tmp_path):
    api, found = secure_cluster.api().session(), secure_cluster.api().urls
    ca = str(secure_cluster.secure_state.ca_file)
    _store_example_secret(api, found["vault"])
    profile = {
        "consul_address": "https://127.0.0.1:8501",  # every client's own agent, from its namespace
        "consul_ca_file": ca,
        "vault_address": found["vault"],
        "vault_ca_file": ca,
        "consul_token_source": "engine",
        "job_vault_policy": True,
    }
    consul = secure_cluster.api().consul()
    try:
        name, out, code, env = _run_example(tmp_path, secure_cluster.env(), profile, through_consul=True)
    except BaseException:
        consul.kv.delete(wire.KV_CLUSTER_PROFILE)
        raise
    try:
        assert code == 0, out
        assert float(re.findall(r"final_accuracy=([0-9.]+)", out)[-1]) > 0.8, out
        job = api.get(f"{found['nomad']}/v1/job/{name}", timeout=10).json()
        chief = next(g for g in job["TaskGroups"] if g["Name"] == "chief")["Tasks"][0]
        own = wire.acl_name("default", name)
        assert chief["Env"]["CONSUL_HTTP_ADDR"] == "https://127.0.0.1:8501" and chief["Env"]["VAULT_CACERT"] == ca
        assert chief["Vault"]["Policies"] == ["nomadtf-digits-read", own]
        assert job["Meta"][wire.META_NOMAD_VERSION] == "1.6.1"  # read from the server
    finally:
        consul.kv.delete(wire.KV_CLUSTER_PROFILE)  # an operator's profile, not other tests'
        _cleanup(name, env)


def test_a_profile_that_is_not_json_is_refused_naming_where_it_is(stack, tmp_path):
    """What the operator stored is read from the real Consul KV; a broken one is an error
    that says where it is, not a silent run without the cluster's settings."""
    from nomadtf.client import cluster_facts
    from nomadtf.errors import SpecError
    from nomadtf.servers import consul as discovery

    consul = stack.api().consul()
    try:
        discovery.write_cluster_profile("{not json", consul)
        assert discovery.read_cluster_profile(consul) == "{not json"
        with pytest.raises(SpecError, match="not JSON"):
            cluster_facts.read_profile()
        bad = nomadtf("validate", str(EXAMPLE), "--var", "name=profile-bad", timeout=60)  # reads it at submission
        assert bad.returncode == 2 and wire.KV_CLUSTER_PROFILE in bad.stderr, bad.stdout + bad.stderr
    finally:
        consul.kv.delete(wire.KV_CLUSTER_PROFILE)
    assert discovery.read_cluster_profile(consul) is None


def test_a_submitter_without_agent_read_gets_the_servers_version_and_without_node_read_is_told_how_to_name_it(secure_cluster, tmp_path):
    """Nomad v1.6.1 on the secure several-client stack: a token that may not read the agent
    still learns the servers' version from their gossip tags (GET /v1/agent/members,
    node:read); one that may read neither is refused a job whose tasks get Vault tokens
    (exit 2, nothing submitted) until the version is named."""
    from nomadtf.client import cluster_facts
    from nomadtf.job.target import NomadVersion
    from nomadtf.servers.nomad import NomadAPI
    from nomadtf.servers.nomadhttp import NomadSettings
    from tests.cluster_access import secured
    from tests.helpers import probe_job, write_job

    namespace_only = 'namespace "default" {\n  capabilities = ["read-job", "submit-job", "list-jobs"]\n}\n'
    with_nodes = nomad_token(secure_cluster, "nomadtf-test-no-agent-read", namespace_only + 'node {\n  policy = "read"\n}\n')
    without_nodes = nomad_token(secure_cluster, "nomadtf-test-namespace-only", namespace_only)

    def api_with(token: str) -> NomadAPI:
        return NomadAPI(NomadSettings.from_env({**secure_cluster.env(), "NOMAD_TOKEN": token}))

    found, notes = cluster_facts.server_target(api_with(with_nodes), None, {})
    assert found.version == NomadVersion(1, 6, 1) and "/v1/agent/members" in found.source and not found.assumed, (found, notes)
    assert notes == []  # three servers, one version
    assumed, notes = cluster_facts.server_target(api_with(without_nodes), None, {})
    assert assumed.assumed and "agent:read" in assumed.unread and "node:read" in assumed.unread, assumed

    job = write_job(tmp_path, secured(probe_job(unique("no-agent-read")), secure_cluster, tmp_path))  # reads its Consul token from Vault
    env = {**secure_cluster.env(), "NOMAD_TOKEN": with_nodes}
    try:
        checked = nomadtf("validate", str(job), env=env, timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "could not read Nomad's version" not in checked.stderr, checked.stderr
        refused = nomadtf("validate", str(job), env={**env, "NOMAD_TOKEN": without_nodes}, timeout=120)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "NOMADTF_NOMAD_VERSION" in refused.stderr and "Vault token" in refused.stderr and "Traceback" not in refused.stderr
        named = nomadtf("validate", str(job), env={**env, "NOMAD_TOKEN": without_nodes, "NOMADTF_NOMAD_VERSION": "1.6.1"}, timeout=120)
        assert named.returncode == 0 and "rendering for 1.6.1 (NOMADTF_NOMAD_VERSION)" in named.stderr, named.stdout + named.stderr
    finally:
        nomadtf("acl", "revoke", str(job), env=secure_cluster.env(), timeout=60)
