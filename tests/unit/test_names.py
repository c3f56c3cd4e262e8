"""Names (issue #20): ACL names that cannot collide, `acl apply` that never takes another
job's policy, a namespace Nomad accepts and one rule for which namespace a command uses."""

from __future__ import annotations

import json

import pytest
import requests

from nomadtf import acl, wire
from nomadtf.acl_setup import check_owner
from nomadtf.errors import AclConflict, SpecError
from nomadtf.nomad import NomadSettings
from nomadtf.spec import JobSpec, load_spec, normalize, parse_spec
from tests.helpers import nomadtf, probe_job, unique, write_job

# Joined with "-", both read "ml-team-x".
TWINS = (("ml", "team-x"), ("ml-team", "x"))


def _spec(namespace: str, name: str, **extra) -> JobSpec:
    return parse_spec({**probe_job(name), "namespace": namespace, **extra})


# ---- ACL names ---------------------------------------------------------------------------------


def test_acl_names_of_namespace_job_pairs_that_join_alike_differ():
    (ns_a, job_a), (ns_b, job_b) = TWINS
    a, b = wire.acl_name(ns_a, job_a), wire.acl_name(ns_b, job_b)
    assert a != b and a.startswith("nomadtf-ml-team-x-") and b.startswith("nomadtf-ml-team-x-")
    assert acl.policy_name(_spec(ns_a, job_a)) == a and acl.policy_name(_spec(ns_b, job_b)) == b
    assert acl.consul_token_path(_spec(ns_a, job_a)) != acl.consul_token_path(_spec(ns_b, job_b))
    assert wire.acl_name(ns_a, job_a) == a  # stable: `acl apply` again finds its own policies
    longest = wire.acl_name("n" * 128, "j" * 48)
    assert len(longest) <= wire.ACL_NAME_MAX and longest != wire.acl_name("n" * 128, "j" * 47 + "k")


def test_each_policy_says_whose_it_is():
    spec = _spec(*TWINS[0])
    policies = acl.job_policies(spec)
    assert policies.vault_tasks.splitlines()[0] == "# nomadtf ml/team-x tasks"
    assert acl.owner(spec) == "nomadtf ml/team-x tasks"


def test_acl_apply_refuses_a_policy_of_its_name_that_is_another_jobs():
    spec = _spec(*TWINS[0])
    mine = acl.job_policies(spec).vault_tasks
    check_owner(spec, None, None)  # nothing there yet
    check_owner(spec, acl.owner(spec), mine)  # its own: updated
    with pytest.raises(AclConflict, match="Consul policy .* is not this job's"):
        check_owner(spec, "nomadtf ml-team/x tasks", None)
    with pytest.raises(AclConflict, match="Vault policy .* is not this job's"):
        check_owner(spec, None, 'path "secret/data/x" {\n  capabilities = ["read"]\n}\n')


# ---- namespaces --------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", ["", "team x", "ml/team", "a" * 129, "dev\n"])
def test_a_namespace_nomad_would_refuse_is_named(namespace):
    with pytest.raises(SpecError) as caught:
        normalize({**probe_job("ns-check"), "namespace": namespace})
    assert caught.value.problems == [f"namespace: {namespace!r} is not a Nomad namespace; use letters, digits and '-' (1 to 128 of them)"]


def test_namespace_precedence_job_json_then_nomad_namespace_then_default(tmp_path, monkeypatch):
    without = write_job(tmp_path, probe_job("ns-without"))
    with_own = write_job(tmp_path, {**probe_job("ns-with"), "namespace": "from-json"})
    monkeypatch.delenv("NOMAD_NAMESPACE", raising=False)
    assert load_spec(without).namespace == "default"
    assert NomadSettings.from_env({}).namespace == "default"
    monkeypatch.setenv("NOMAD_NAMESPACE", "from-env")
    assert load_spec(without).namespace == "from-env"
    assert load_spec(with_own).namespace == "from-json"
    # The commands that take a job id: --namespace, then NOMAD_NAMESPACE, then default.
    assert NomadSettings.from_env({"NOMAD_NAMESPACE": "from-env"}).namespace == "from-env"
    assert NomadSettings.from_env({"NOMAD_NAMESPACE": "from-env"}, namespace="flag").namespace == "flag"
    monkeypatch.setenv("NOMAD_NAMESPACE", "no good")
    with pytest.raises(SpecError, match="NOMAD_NAMESPACE='no good' is not a Nomad namespace"):
        load_spec(without)


def test_render_follows_nomad_namespace_like_status_does(tmp_path):
    job = write_job(tmp_path, probe_job("ns-render"))
    rendered = nomadtf("render", str(job), env={"NOMAD_NAMESPACE": "team-r"}, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert json.loads(rendered.stdout)["Job"]["Namespace"] == "team-r"
    policies = nomadtf("acl", "policies", str(job), env={"NOMAD_NAMESPACE": "team-r"}, timeout=60)
    assert policies.returncode == 0 and wire.acl_name("team-r", "ns-render") in policies.stdout, policies.stderr
    empty = nomadtf("render", str(write_job(tmp_path, {**probe_job("ns-empty"), "namespace": ""})), timeout=60)
    assert empty.returncode == 2 and "namespace: '' is not a Nomad namespace" in empty.stderr, empty.stderr


# ---- `acl apply` on the secure stack ---------------------------------------------------------------


def _as(token_header: str, token: str, ca: str) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = ca
    session.headers[token_header] = token
    return session


@pytest.mark.stack
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
