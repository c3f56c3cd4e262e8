"""`nomadtf acl apply / revoke`: an operator puts a job's task policies in place.

Run with an operator's tokens (CONSUL_HTTP_TOKEN with acl:write, VAULT_TOKEN allowed to
write policies and the token source); the job's submitters and tasks never hold them.

What `apply` creates, all named `acl.policy_name(spec)` ("nomadtf-<namespace>-<job>-<digest>",
wire.acl_name) and marked as the job's (`acl.owner`: the Consul policy's description, the
Vault policy's first line); a policy of that name that another job owns is never overwritten:
- the Consul policy of the job's tasks (`acl.consul_tasks_rules`);
- where the tasks read their Consul token:
  - with a Consul secrets engine mounted at `consul/` in Vault: the role
    `consul/roles/<name>` (each task gets its own token, leased, revoked when it ends);
  - otherwise: one Consul token with that policy, kept in Vault's KV at
    `secret/nomadtf/consul-tokens/<namespace>/<job>` (`apply` again rotates it);
- the Vault policy of the job's tasks: read on that path and on the job's secrets.

Consul's failures are mapped where every Consul call's are (discovery.consul_call).

Usage:
    applied = apply(spec)       # spec: a JobSpec -> Applied(name=..., token_path=..., mode=...)
    revoke(spec)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import consul
import hvac
import hvac.exceptions

from nomadtf import acl
from nomadtf.discovery import consul_call, consul_client
from nomadtf.errors import AclConflict, VaultError
from nomadtf.spec import JobSpec
from nomadtf.vault import vault_address, vault_tls

ENGINE_MOUNT = "consul"
KV_MOUNT = "secret"


@dataclass(frozen=True)
class Applied:
    name: str
    token_path: str
    mode: str  # "engine" (a Consul secrets engine role) or "kv" (one token kept in KV)


# What a denial means here: an operator's token is needed (the job's own never may).
OPERATOR_TOKEN = "`nomadtf acl apply` needs a token with acl = \"write\""


def kv_token_path(spec: JobSpec) -> str:
    return f"{KV_MOUNT}/nomadtf/consul-tokens/{spec.namespace}/{spec.name}"


def _vault(spec: JobSpec) -> hvac.Client:
    client = hvac.Client(url=vault_address(spec.vault), **vault_tls())
    client.token = os.environ.get("VAULT_TOKEN", "")
    if not client.token:
        raise VaultError("`nomadtf acl` writes Vault policies: set VAULT_TOKEN to an operator's token")
    return client


def _engine_mounted(client: hvac.Client) -> bool:
    try:
        mounts = client.sys.list_mounted_secrets_engines()
    except hvac.exceptions.Forbidden:
        raise VaultError("VAULT_TOKEN may not list the secrets engines (sys/mounts read); use an operator's token") from None
    data = mounts.get("data", mounts)
    return data.get(f"{ENGINE_MOUNT}/", {}).get("type") == "consul"


def _consul_policy(client: consul.Consul, name: str) -> dict[str, Any] | None:
    """GET /v1/acl/policies"""
    return next((p for p in client.acl.policy.list() if p.get("Name") == name), None)


def _upsert_consul_policy(client: consul.Consul, existing: dict[str, Any] | None, name: str, rules: dict[str, Any], description: str) -> None:
    """PUT /v1/acl/policy (create) or /v1/acl/policy/:id (update)"""
    if existing:
        client.acl.policy.update(existing["ID"], name, description=description, rules=rules)
    else:
        client.acl.policy.create(name, description=description, rules=rules)


def _vault_policy_text(vault: hvac.Client, name: str) -> str | None:
    """GET /v1/sys/policy/:name (None: there is none)"""
    try:
        response = vault.sys.read_policy(name)
    except hvac.exceptions.InvalidPath:
        return None
    data = response.get("data", response)
    return data.get("rules") or data.get("policy") or ""


def check_owner(spec: JobSpec, consul_description: str | None, vault_policy: str | None) -> None:
    """Refuse (AclConflict) when a policy named like the job's belongs to someone else: a
    Consul policy with another description, a Vault policy whose first line is not ours."""
    name, mark = acl.policy_name(spec), acl.owner(spec)
    if consul_description is not None and consul_description != mark:
        raise AclConflict(f"Consul policy {name} exists and is not this job's ({consul_description!r}, expected {mark!r}); nothing changed")
    if vault_policy is not None and vault_policy.split("\n", 1)[0].strip() != f"# {mark}":
        raise AclConflict(f"Vault policy {name} exists and is not this job's (its first line is not '# {mark}'); nothing changed")


def apply(spec: JobSpec, token_ttl: str = acl.CONSUL_TOKEN_ROLE_TTL) -> Applied:
    """Create or update the job's task policies and its tasks' Consul token source.

    GET /v1/acl/policies ; GET /v1/sys/policy/:name ; PUT /v1/acl/policy[/:id] ;
    GET /v1/sys/mounts ; POST /v1/consul/roles/:name or (KV) GET+POST /v1/secret/data/...,
    PUT /v1/acl/token, DELETE /v1/acl/token/:accessor ; PUT /v1/sys/policy/:name
    """
    name = acl.policy_name(spec)
    where = f"{spec.namespace}/{spec.name}"
    cons = consul_client()
    vault = _vault(spec)
    existing = consul_call("listing policies", _consul_policy, cons, name, needs=OPERATOR_TOKEN)
    try:
        check_owner(spec, existing.get("Description", "") if existing else None, _vault_policy_text(vault, name))
    except hvac.exceptions.Forbidden:
        raise VaultError("Vault denied reading the job's policy to VAULT_TOKEN; use an operator's token") from None
    consul_call("writing the tasks' policy", _upsert_consul_policy, cons, existing, name, acl.consul_tasks_rules(spec), acl.owner(spec),
                needs=OPERATOR_TOKEN)
    try:
        if _engine_mounted(vault):
            # POST /v1/consul/roles/:name
            vault.write(f"{ENGINE_MOUNT}/roles/{name}", consul_policies=[name], ttl=token_ttl, max_ttl=acl.CONSUL_TOKEN_ROLE_MAX_TTL)
            applied = Applied(name, f"{ENGINE_MOUNT}/creds/{name}", "engine")
        else:
            applied = Applied(name, kv_token_path(spec), "kv")
            _rotate_kv_token(cons, vault, applied.token_path, name, where)
        vault.sys.create_or_update_policy(name, acl.vault_tasks_policy(spec, token_path=applied.token_path))
    except hvac.exceptions.Forbidden:
        raise VaultError("Vault denied writing the job's policy or token source to VAULT_TOKEN; use an operator's token") from None
    return applied


def _rotate_kv_token(cons: consul.Consul, vault: hvac.Client, path: str, name: str, where: str) -> None:
    """A new Consul token for the job's tasks in KV; the one it replaces is deleted."""
    mount, _, rest = path.partition("/")
    old = None
    try:
        old = vault.secrets.kv.v2.read_secret_version(path=rest, mount_point=mount, raise_on_deleted_version=True)["data"]["data"]
    except hvac.exceptions.InvalidPath:
        pass
    token = consul_call("creating the tasks' token", cons.acl.token.create, policies_name=[name], description=f"nomadtf {where} tasks",
                        needs=OPERATOR_TOKEN)
    vault.secrets.kv.v2.create_or_update_secret(
        path=rest, mount_point=mount, secret={"token": token["SecretID"], "accessor": token["AccessorID"]}
    )
    if old and old.get("accessor"):
        try:
            cons.acl.token.delete(old["accessor"])
        except consul.ConsulException:
            pass  # already gone


def revoke(spec: JobSpec) -> None:
    """Delete what `apply` created (a running job's tasks lose Consul at their next call);
    nothing when a policy of that name is another job's.

    GET /v1/acl/policies ; GET /v1/sys/policy/:name ; GET+DELETE /v1/secret/metadata/... ;
    DELETE /v1/acl/token/:accessor ; GET /v1/sys/mounts ; DELETE /v1/consul/roles/:name ;
    DELETE /v1/sys/policy/:name ; DELETE /v1/acl/policy/:id
    """
    name = acl.policy_name(spec)
    cons = consul_client()
    vault = _vault(spec)
    existing = consul_call("listing policies", _consul_policy, cons, name, needs=OPERATOR_TOKEN)
    check_owner(spec, existing.get("Description", "") if existing else None, _vault_policy_text(vault, name))
    path = kv_token_path(spec)
    mount, _, rest = path.partition("/")
    try:
        stored = vault.secrets.kv.v2.read_secret_version(path=rest, mount_point=mount, raise_on_deleted_version=True)["data"]["data"]
        consul_call("deleting the tasks' token", cons.acl.token.delete, stored["accessor"], needs=OPERATOR_TOKEN)
        vault.secrets.kv.v2.delete_metadata_and_all_versions(path=rest, mount_point=mount)
    except (hvac.exceptions.InvalidPath, KeyError):
        pass
    if _engine_mounted(vault):
        vault.delete(f"{ENGINE_MOUNT}/roles/{name}")
    vault.sys.delete_policy(name)
    if existing:
        consul_call("deleting the tasks' policy", cons.acl.policy.delete, existing["ID"], needs=OPERATOR_TOKEN)
