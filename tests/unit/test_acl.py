"""Names (issue #20): ACL names that cannot collide, `acl apply` that never takes another
job's policy, a namespace Nomad accepts and one rule for which namespace a command uses."""

from __future__ import annotations

import json

import pytest

from nomadtf import acl, wire
from nomadtf.acl_setup import check_owner
from nomadtf.errors import AclConflict, SpecError
from nomadtf.nomad import NomadSettings
from nomadtf.spec import JobSpec, load_spec, normalize, parse_spec
from tests.helpers import nomadtf, probe_job, write_job

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
