"""The least-privilege policies of a job (nomadtf/acl.py), their names: ACL names of
namespace/job pairs that join alike never collide, and each policy says whose it is (what
`acl apply` checks before it updates one: tests/unit/test_acl_setup.py)."""

from __future__ import annotations

import json
import re

from nomadtf import acl, wire
from nomadtf.spec import JobSpec, parse_spec
from tests.helpers import EXAMPLES, nomadtf, probe_job

# Joined with "-", both read "ml-team-x".
TWINS = (("ml", "team-x"), ("ml-team", "x"))


def _spec(namespace: str, name: str, **extra) -> JobSpec:
    return parse_spec({**probe_job(name), "namespace": namespace, **extra})


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


# ---- the Vault JWT auth role (Nomad 1.7+) -------------------------------------------------------


def test_the_jwt_role_grants_the_jobs_own_policy_and_the_ones_job_json_lists():
    spec = _spec("ml", "train", vault={"policies": ["team-read", acl.policy_name(_spec("ml", "train")), "team-write"]})
    own = acl.policy_name(spec)
    # Nomad 1.10+ drops vault.policies from the job: the role is where they are granted, once each.
    assert acl.vault_jwt_role(spec)["token_policies"] == [own, "team-read", "team-write"]
    assert acl.vault_jwt_role(_spec("ml", "train"))["token_policies"] == [own]


def test_acl_policies_for_2_0_5_prints_the_role_the_auth_method_and_the_agents_vault_block(monkeypatch):
    monkeypatch.delenv("NOMAD_CACERT", raising=False)
    monkeypatch.delenv("NOMADTF_CLUSTER_PROFILE", raising=False)
    env = {"NOMAD_ADDR": "https://nomad.example:4646", "VAULT_ADDR": "https://vault.example:8200"}
    out = nomadtf(
        "acl", "policies", str(EXAMPLES / "secrets" / "job.json"), "--nomad-version", "2.0.5", "--issuer", "https://nomad.example",
        env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    sections = dict(re.findall(r"# --- (.+)\n((?:(?!# --- ).*\n?)*)", out.stdout))
    name = wire.acl_name("default", "digits-secrets")
    role_title = next(t for t in sections if t.startswith("Vault JWT auth role"))
    assert role_title.endswith(f"(POST /v1/auth/jwt-nomad/role/{name})")
    role = json.loads(sections[role_title])
    assert role["bound_claims"] == {"nomad_namespace": "default", "nomad_job_id": "digits-secrets"}
    assert role["bound_audiences"] == ["vault.io"] and role["role_type"] == "jwt"
    assert role["token_policies"] == [name, "nomadtf-digits-read"]  # its own, and what job.json lists
    method = json.loads(sections[next(t for t in sections if t.startswith("Vault JWT auth method"))])
    assert method["bound_issuer"] == "https://nomad.example"
    assert method["jwks_url"] == "https://nomad.example:4646/.well-known/jwks.json" and "jwks_ca_pem" not in method
    agents = sections["Nomad agents' vault block, once per cluster (servers and clients)"]
    assert 'address = "https://vault.example:8200"' in agents and 'jwt_auth_backend_path = "jwt-nomad"' in agents
    assert 'aud = ["vault.io"]' in agents
    vault_policy = sections[next(t for t in sections if t.startswith("Vault policy for the job's tasks"))]
    assert 'path "secret/data/nomadtf/digits"' in vault_policy
    # Without --issuer the method binds no issuer; for 1.6 there is no role at all.
    plain = nomadtf("acl", "policies", str(EXAMPLES / "secrets" / "job.json"), "--nomad-version", "2.0.5", env=env, timeout=60)
    assert '"bound_issuer"' not in plain.stdout
    old = nomadtf("acl", "policies", str(EXAMPLES / "secrets" / "job.json"), "--nomad-version", "1.6.1", env=env, timeout=60)
    assert old.returncode == 0 and "JWT auth role" not in old.stdout and "list it in vault.policies" in old.stdout
