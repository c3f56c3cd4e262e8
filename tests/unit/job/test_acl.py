"""The least-privilege policies of a job (nomadtf/job/acl.py), their names: ACL names of
namespace/job pairs that join alike never collide, and each policy says whose it is (what
`acl apply` checks before it updates one: tests/unit/client/test_acl_setup.py)."""

from __future__ import annotations

import json
import re

from nomadtf import wire
from nomadtf.job import acl
from nomadtf.job.spec import JobSpec, parse_spec
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
        "--allow-policy", "nomadtf-digits-read",
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
    plain = nomadtf("acl", "policies", str(EXAMPLES / "secrets" / "job.json"), "--nomad-version", "2.0.5", "--allow-policy", "nomadtf-digits-read",
                    env=env, timeout=60)
    assert '"bound_issuer"' not in plain.stdout
    old = nomadtf("acl", "policies", str(EXAMPLES / "secrets" / "job.json"), "--nomad-version", "1.6.1", "--allow-policy", "nomadtf-digits-read",
                  env=env, timeout=60)
    assert old.returncode == 0 and "JWT auth role" not in old.stdout and "list it in vault.policies" in old.stdout


# ---- admission: the submitter reads, only the controller writes -------------------------------


def _grants_write_under(rules: dict, path: str) -> list[str]:
    """The rules that let their holder write `path` (an exact key, or a prefix covering it)."""
    exact = [name for name, rule in rules.get("key", {}).items() if name == path and rule["policy"] == "write"]
    prefixes = [f"key_prefix {name!r}" for name, rule in rules.get("key_prefix", {}).items() if path.startswith(name) and rule["policy"] == "write"]
    return exact + prefixes


def test_the_submitter_reads_the_admission_lead_and_board():
    rules = acl.consul_submitter_rules("team-a")
    assert rules["key"][wire.KV_ADMISSION_LEADER] == {"policy": "read"}
    assert rules["key"][wire.KV_ADMISSION_BOARD] == {"policy": "read"}
    assert wire.KV_ADMISSION_LEADER == "nomadtf/_admission/leader" and wire.KV_ADMISSION_BOARD == "nomadtf/_admission/board"


def test_the_submitter_may_write_nothing_under_the_admission_prefix_and_holds_no_sessions():
    for namespace in ("team-a", "default"):
        rules = acl.consul_submitter_rules(namespace)
        for path in (wire.KV_ADMISSION, wire.KV_ADMISSION_LEADER, wire.KV_ADMISSION_BOARD, wire.KV_ADMISSION + "queue/x", wire.KV_ADMISSION + "lock"):
            assert not _grants_write_under(rules, path), (namespace, path)
        assert not [name for name in rules.get("key", {}) if name.startswith(wire.KV_ADMISSION) and rules["key"][name]["policy"] != "read"]
        assert "session_prefix" not in rules and "session" not in rules
        assert rules["key_prefix"] == {f"nomadtf/{namespace}/": {"policy": "write"}}  # the namespace's own runs


def test_the_submitter_s_hcl_names_the_admission_keys_read_only():
    hcl = acl.consul_hcl(acl.consul_submitter_rules("team-a"))
    assert 'key "nomadtf/_admission/leader" { policy = "read" }' in hcl
    assert 'key "nomadtf/_admission/board" { policy = "read" }' in hcl
    assert "session" not in hcl and "_admission/queue" not in hcl


def test_the_controller_s_nomad_policy_reads_and_scales_jobs_everywhere_and_submits_nothing():
    policy = acl.nomad_controller_policy()
    namespaces = re.findall(r'namespace "([^"]*)" \{\n  capabilities = \[([^\]]*)\]\n\}', policy)
    assert len(namespaces) == 1 and namespaces[0][0] == "*"
    # alloc-lifecycle: a run it preempts is asked to checkpoint (a signal to its allocations).
    assert set(json.loads(f"[{namespaces[0][1]}]")) == {"list-jobs", "read-job", "scale-job", "read-job-scaling", "alloc-lifecycle"}
    assert 'node {\n  policy = "read"\n}' in policy
    assert "submit-job" not in policy and "agent" not in policy and "write" not in policy
    assert policy.count("{") == 2  # the namespace and the node block, nothing else


def test_the_controller_alone_writes_the_admission_lead_and_board():
    rules = acl.consul_controller_rules()
    assert rules["key"][wire.KV_ADMISSION_LEADER] == {"policy": "write"} and rules["key"][wire.KV_ADMISSION_BOARD] == {"policy": "write"}
    assert rules["session_prefix"] == {"": {"policy": "write"}}  # the lead is a session's lock


def _granted(**extra) -> JobSpec:
    """A job with its own Vault policy listed (as `acl apply` adds it) and `extra`."""
    own = wire.acl_name("default", "g")
    vault = {"policies": [own, *extra.pop("vault", {}).get("policies", [])]}
    return parse_spec({"name": "g", "strategy": "multi_worker_mirrored", "roles": {"worker": {"count": 1}},
                       "entrypoint": {"script": "t.py"}, "vault": vault, **extra})  # fmt: skip


def test_acl_apply_grants_only_exact_paths_and_the_job_s_own_or_allowed_policies():
    """A glob or `..` in a path would become read on every team's paths; a policy job.json
    names would be attached to the job's tasks: both refused unless the operator allows."""
    assert acl.grant_problems(_granted(discovery={"consul_token_path": "consul/creds/nomadtf-default-g"})) == []
    for path in ("+/*", "consul/creds/*", "secret/../sys/x", "consul//creds", "consul/creds/a&b"):
        problems = acl.grant_problems(_granted(discovery={"consul_token_path": path}))
        assert problems and problems[0].startswith(f"discovery.consul_token_path: {path!r} is not one exact path"), problems
    problems = acl.grant_problems(_granted(secrets=[{"path": "secret/../team-b/s3", "key": "k", "env": "K"}],
                                           vault={"policies": ["team-b-datasets"]}))  # fmt: skip
    assert problems[0].startswith("secrets[0].path: 'secret/../team-b/s3' is not one exact path")
    assert "vault.policies: 'team-b-datasets' is not on the operator's allowlist" in problems[1]
    assert "--allow-policy team-b-datasets" in problems[1]
    assert acl.grant_problems(_granted(vault={"policies": ["team-b-datasets"]}), ["team-b-datasets"]) == []
    assert "never granted" in acl.grant_problems(_granted(vault={"policies": ["root"]}), ["root"])[0]


def test_acl_apply_refuses_a_glob_before_it_asks_any_server(tmp_path):
    job = tmp_path / "g.json"
    job.write_text(json.dumps({"name": "g", "strategy": "multi_worker_mirrored", "roles": {"worker": {"count": 1}},
                               "entrypoint": {"script": "t.py"}, "discovery": {"consul_token_path": "+/*"}}))  # fmt: skip
    # No server answers at these addresses: the refusal comes first, and nothing is written.
    env = {"NOMAD_ADDR": "http://127.0.0.1:9", "CONSUL_HTTP_ADDR": "127.0.0.1:9", "VAULT_ADDR": "http://127.0.0.1:9", "NOMADTF_CLUSTER_PROFILE": ""}
    out = nomadtf("acl", "apply", str(job), "--nomad-version", "1.6.1", env=env, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "discovery.consul_token_path: '+/*' is not one exact path" in out.stderr and "Traceback" not in out.stderr
