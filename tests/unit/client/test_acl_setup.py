"""`nomadtf acl apply / revoke` (nomadtf/client/acl_setup.py), its pure parts: where the tasks'
Consul token is kept, whose a policy is, the Vault policy it writes, and how a Consul
refusal reads. apply and revoke against real servers: tests/stack/test_secure.py."""

from __future__ import annotations

import consul
import pytest
import requests

from nomadtf.client import acl_setup
from nomadtf.errors import AclConflict, ConsulError, UnreachableError, VaultError
from nomadtf.job import acl
from nomadtf.job.spec import parse_spec
from nomadtf.servers.consulhttp import consul_call
from tests.helpers import probe_job


def _spec(namespace="ml", name="train", **extra):
    return parse_spec({**probe_job(name), "namespace": namespace, **extra})


def test_the_kv_token_path_is_the_jobs_own():
    assert acl_setup.kv_token_path(_spec()) == "secret/nomadtf/consul-tokens/ml/train"
    assert acl_setup.kv_token_path(_spec("ml-team", "x")) != acl_setup.kv_token_path(_spec("ml", "team-x"))


def test_a_policy_is_updated_only_when_it_is_the_jobs_own():
    spec = _spec()
    mine = acl.vault_tasks_policy(spec)
    acl_setup.check_owner(spec, None, None)  # nothing there yet
    acl_setup.check_owner(spec, acl.owner(spec), mine)  # nothing raised: ours
    with pytest.raises(AclConflict, match="Consul policy .* is not this job's .*nothing changed"):
        acl_setup.check_owner(spec, "someone else's", None)
    with pytest.raises(AclConflict, match="Vault policy .* first line is not '# nomadtf ml/train tasks'"):
        acl_setup.check_owner(spec, None, mine.replace("# nomadtf ml/train tasks", "# nomadtf ml/other tasks"))
    with pytest.raises(AclConflict, match="Vault policy .* is not this job's"):
        acl_setup.check_owner(spec, None, 'path "secret/data/x" {\n  capabilities = ["read"]\n}\n')  # no owner line at all
    # ml/team-x and ml-team/x join alike; each owns only its own policies.
    with pytest.raises(AclConflict, match="Consul policy .* is not this job's"):
        acl_setup.check_owner(_spec("ml", "team-x"), "nomadtf ml-team/x tasks", None)


def test_the_vault_policy_reads_the_token_source_apply_chose_and_the_secrets():
    spec = _spec(secrets=[{"path": "secret/team/s3", "key": "k", "env": "S3"}], vault={"policies": ["p"]})
    kv = acl.vault_tasks_policy(spec, token_path=acl_setup.kv_token_path(spec))
    assert kv.splitlines()[0] == "# nomadtf ml/train tasks"
    assert 'path "secret/data/nomadtf/consul-tokens/ml/train"' in kv and 'path "secret/data/team/s3"' in kv
    assert "sys/leases/revoke" not in kv  # a KV token has no lease to revoke
    engine = acl.vault_tasks_policy(spec, token_path=f"consul/creds/{acl.policy_name(spec)}")
    assert f'path "consul/creds/{acl.policy_name(spec)}"' in engine
    assert f'path "sys/leases/revoke/consul/creds/{acl.policy_name(spec)}/*"' in engine  # its own leases only
    # Without a token path from `apply`: the job's own, else its engine role's.
    assert acl.vault_tasks_policy(spec) == engine


def test_vault_needs_an_operators_token(monkeypatch):
    monkeypatch.delenv("VAULT_TOKEN", raising=False)
    with pytest.raises(VaultError, match="set VAULT_TOKEN to an operator's token"):
        acl_setup._vault(_spec())


def _raises(exc):
    def call(*_args, **_kwargs):
        raise exc
    return call


def test_a_consul_refusal_says_what_the_operator_needs(monkeypatch):
    monkeypatch.delenv("CONSUL_HTTP_TOKEN", raising=False)
    with pytest.raises(ConsulError) as denied:
        consul_call("listing policies", _raises(consul.ACLPermissionDenied("denied")), needs=acl_setup.OPERATOR_TOKEN)
    assert str(denied.value) == (
        "Consul denied listing policies to the anonymous token (CONSUL_HTTP_TOKEN is not set): "
        '`nomadtf acl apply` needs a token with acl = "write"'
    )
    with pytest.raises(UnreachableError, match=r"cannot reach Consul \(listing policies\): ConnectionError"):
        consul_call("listing policies", _raises(requests.ConnectionError()), needs=acl_setup.OPERATOR_TOKEN)
    # Every other caller keeps the general hint.
    with pytest.raises(ConsulError, match="its policy lacks the capability; see `nomadtf acl`"):
        consul_call("reading progress", _raises(consul.ACLPermissionDenied("denied")))
    assert consul_call("adding", lambda a, b=0: a + b, 1, b=2) == 3  # arguments pass through
