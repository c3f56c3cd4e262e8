"""The least-privilege policies of a job (nomadtf/acl.py), their names: ACL names of
namespace/job pairs that join alike never collide, and each policy says whose it is (what
`acl apply` checks before it updates one: tests/unit/test_acl_setup.py)."""

from __future__ import annotations

from nomadtf import acl, wire
from nomadtf.spec import JobSpec, parse_spec
from tests.helpers import probe_job

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
