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
- the Vault policy of the job's tasks: read on that path and on the job's secrets;
- on Nomad 1.7+ (`jwt`), the job's Vault JWT auth role `auth/<mount>/role/<name>`
  (acl.vault_jwt_role: this job's identities only, that policy and the ones job.json lists);
  with `jwt.config` also the auth method itself (enabled at <mount> if missing, its config
  written: the once-per-cluster step `nomad setup vault` does); without it a missing method
  is refused (NoJwtAuthMethod, naming --configure-auth) before anything is written.

A Consul without ACLs (the plain dev stack) needs no token: only the Vault half is written.
Consul's failures are mapped where every Consul call's are (discovery.consul_call).

Usage:
    applied = apply(spec)       # spec: a JobSpec -> Applied(name=..., token_path=..., mode=...)
    apply(spec, jwt=JwtSetup(mount="jwt-nomad"))                        # + the job's role
    apply(spec, jwt=JwtSetup("jwt-nomad", acl.jwt_auth_config(addr)))   # + the auth method
    revoke(spec, jwt=JwtSetup())
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import consul
import hvac
import hvac.exceptions

from nomadtf.errors import AclConflict, ConsulError, NoJwtAuthMethod, VaultError
from nomadtf.job import acl
from nomadtf.job.spec import JobSpec
from nomadtf.servers.consulhttp import consul_call, consul_client
from nomadtf.servers.vault import vault_address, vault_tls

ENGINE_MOUNT = "consul"
KV_MOUNT = "secret"


@dataclass(frozen=True)
class Applied:
    name: str
    token_path: str  # "" when Consul runs without ACLs
    mode: str  # "engine" (a Consul secrets engine role), "kv" (one token kept in KV), "none" (Consul without ACLs)
    jwt_role: str = ""  # auth/<mount>/role/<name>, when written (Nomad 1.7+)


@dataclass(frozen=True)
class JwtSetup:
    """The Vault side of workload identities: the JWT auth mount Nomad's clients log tasks in
    at, and (once per cluster) the auth method's configuration to write there."""

    mount: str = acl.JWT_AUTH_MOUNT
    config: dict[str, Any] | None = None


# What a denial means here: an operator's token is needed (the job's own never may).
OPERATOR_TOKEN = "`nomadtf acl apply` needs a token with acl = \"write\""


def kv_token_path(spec: JobSpec) -> str:
    return f"{KV_MOUNT}/nomadtf/consul-tokens/{spec.namespace}/{spec.name}"


def _vault(spec: JobSpec) -> hvac.Client:
    client = hvac.Client(url=vault_address(spec.vault.document), **vault_tls())
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


def ensure_jwt_auth(vault: hvac.Client, mount: str, config: dict[str, Any]) -> None:
    """The JWT auth method at `mount`, enabled if missing, configured with `config`.

    GET /v1/sys/auth ; POST /v1/sys/auth/:mount (when missing) ; POST /v1/auth/:mount/config
    """
    mounts = vault.sys.list_auth_methods()
    existing = (mounts.get("data", mounts)).get(f"{mount}/")
    if existing is None:
        vault.sys.enable_auth_method("jwt", path=mount, description="Nomad workload identities (nomadtf acl apply)")
    elif existing.get("type") != "jwt":
        raise AclConflict(f"Vault auth mount {mount}/ is a {existing.get('type')} method, not jwt; nothing changed there")
    vault.write(f"auth/{mount}/config", **config)


def require_jwt_auth(vault: hvac.Client, mount: str) -> None:
    """A JWT auth method at `mount`, which the job's role is written into: NoJwtAuthMethod
    (naming --configure-auth) when there is none, AclConflict when the mount is another kind.

    GET /v1/sys/auth
    """
    mounts = vault.sys.list_auth_methods()
    existing = (mounts.get("data", mounts)).get(f"{mount}/")
    if existing is None:
        raise NoJwtAuthMethod(
            f"no JWT auth method at {mount}/ in Vault: run `nomadtf acl apply` once with --configure-auth "
            "(and --jwks-url <Nomad's address as Vault reaches it>, --issuer if the servers set oidc_issuer) to create it "
            "the way `nomad setup vault` does; nothing was written"
        )
    if existing.get("type") != "jwt":
        raise AclConflict(f"Vault auth mount {mount}/ is a {existing.get('type')} method, not jwt; nothing was written")


def _jwt_role(vault: hvac.Client, mount: str, name: str) -> dict[str, Any] | None:
    """GET /v1/auth/:mount/role/:name (None: there is none, or no such mount yet)"""
    try:
        response = vault.read(f"auth/{mount}/role/{name}")
    except hvac.exceptions.InvalidPath:
        return None
    return (response or {}).get("data")


def check_jwt_role_owner(spec: JobSpec, existing: dict[str, Any] | None) -> None:
    """A JWT role of the job's name bound to another job's claims is not ours: AclConflict."""
    if existing is None:
        return
    wanted = acl.vault_jwt_role(spec)["bound_claims"]
    if existing.get("bound_claims") != wanted:
        raise AclConflict(
            f"Vault JWT role {acl.policy_name(spec)} exists and is bound to other claims ({existing.get('bound_claims')!r}, "
            f"expected {wanted!r}); nothing changed"
        )


def _consul_acls_enabled(cons: consul.Consul) -> bool:
    """False for a Consul that runs without ACLs (the plain dev stack): its tasks need no
    token, so there is no Consul half to apply. GET /v1/acl/policies"""
    try:
        consul_call("listing policies", cons.acl.policy.list, needs=OPERATOR_TOKEN)
    except ConsulError as exc:
        if isinstance(exc.__cause__, consul.ACLDisabled):
            return False
        raise
    return True


def write_vault_side(vault: hvac.Client, spec: JobSpec, token_path: str, jwt: JwtSetup | None) -> str:
    """The Vault half of `apply`: the tasks' policy (read on `token_path`, "" for none, and
    the job's secrets) and, for workload identities, the job's JWT auth role (after the auth
    method, when `jwt.config` asks for it). Returns the role's path, "" without `jwt`.

    [GET /v1/sys/auth, POST /v1/sys/auth/:mount, POST /v1/auth/:mount/config] ;
    PUT /v1/sys/policy/:name ; POST /v1/auth/:mount/role/:name
    """
    name = acl.policy_name(spec)
    if jwt and jwt.config:
        ensure_jwt_auth(vault, jwt.mount, jwt.config)
    elif jwt:
        require_jwt_auth(vault, jwt.mount)  # before the policy: a role with no method to live in helps no task
    vault.sys.create_or_update_policy(name, acl.vault_tasks_policy(spec, token_path=token_path, consul_token=bool(token_path)))
    if not jwt:
        return ""
    vault.write(f"auth/{jwt.mount}/role/{name}", **acl.vault_jwt_role(spec))
    return f"auth/{jwt.mount}/role/{name}"


def apply(spec: JobSpec, token_ttl: str = acl.CONSUL_TOKEN_ROLE_TTL, jwt: JwtSetup | None = None) -> Applied:
    """Create or update the job's task policies, its tasks' Consul token source and, with
    `jwt`, its JWT auth role (write_vault_side).

    GET /v1/acl/policies ; GET /v1/sys/policy/:name ; [GET /v1/sys/auth] ; PUT /v1/acl/policy[/:id] ;
    GET /v1/sys/mounts ; POST /v1/consul/roles/:name or (KV) GET+POST /v1/secret/data/...,
    PUT /v1/acl/token, DELETE /v1/acl/token/:accessor ; PUT /v1/sys/policy/:name ;
    [GET /v1/auth/:mount/role/:name, POST /v1/auth/:mount/role/:name]
    """
    name = acl.policy_name(spec)
    where = f"{spec.namespace}/{spec.name}"
    cons = consul_client()
    vault = _vault(spec)
    if not _consul_acls_enabled(cons):
        try:
            check_owner(spec, None, _vault_policy_text(vault, name))
            if jwt:
                check_jwt_role_owner(spec, _jwt_role(vault, jwt.mount, name))
            role = write_vault_side(vault, spec, "", jwt)
        except hvac.exceptions.Forbidden:
            raise VaultError("Vault denied writing the job's policy or JWT role to VAULT_TOKEN; use an operator's token") from None
        return Applied(name, "", "none", role)
    existing = consul_call("listing policies", _consul_policy, cons, name, needs=OPERATOR_TOKEN)
    try:
        check_owner(spec, existing.get("Description", "") if existing else None, _vault_policy_text(vault, name))
        if jwt and not jwt.config:
            require_jwt_auth(vault, jwt.mount)  # before the Consul half is written
        if jwt:  # a mount not there yet answers 404: no role
            check_jwt_role_owner(spec, _jwt_role(vault, jwt.mount, name))
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
        role = write_vault_side(vault, spec, applied.token_path, jwt)
    except hvac.exceptions.Forbidden:
        raise VaultError("Vault denied writing the job's policy, token source or JWT role to VAULT_TOKEN; use an operator's token") from None
    return Applied(applied.name, applied.token_path, applied.mode, role)


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


def revoke(spec: JobSpec, jwt: JwtSetup | None = None) -> None:
    """Delete what `apply` created (a running job's tasks lose Consul at their next call);
    nothing when a policy of that name is another job's. With `jwt`, the job's JWT role too;
    the auth method stays, it is the cluster's.

    GET /v1/acl/policies ; GET /v1/sys/policy/:name ; [GET+DELETE /v1/auth/:mount/role/:name] ;
    GET+DELETE /v1/secret/metadata/... ; DELETE /v1/acl/token/:accessor ; GET /v1/sys/mounts ;
    DELETE /v1/consul/roles/:name ; DELETE /v1/sys/policy/:name ; DELETE /v1/acl/policy/:id
    """
    name = acl.policy_name(spec)
    cons = consul_client()
    vault = _vault(spec)
    acls = _consul_acls_enabled(cons)
    existing = consul_call("listing policies", _consul_policy, cons, name, needs=OPERATOR_TOKEN) if acls else None
    check_owner(spec, existing.get("Description", "") if existing else None, _vault_policy_text(vault, name))
    role = _jwt_role(vault, jwt.mount, name) if jwt else None
    check_jwt_role_owner(spec, role)
    if jwt and role is not None:
        vault.delete(f"auth/{jwt.mount}/role/{name}")
    path = kv_token_path(spec)
    mount, _, rest = path.partition("/")
    try:
        stored = vault.secrets.kv.v2.read_secret_version(path=rest, mount_point=mount, raise_on_deleted_version=True)["data"]["data"]
        if acls:
            consul_call("deleting the tasks' token", cons.acl.token.delete, stored["accessor"], needs=OPERATOR_TOKEN)
        vault.secrets.kv.v2.delete_metadata_and_all_versions(path=rest, mount_point=mount)
    except (hvac.exceptions.InvalidPath, KeyError):
        pass
    if _engine_mounted(vault):
        vault.delete(f"{ENGINE_MOUNT}/roles/{name}")
    vault.sys.delete_policy(name)
    if existing:
        consul_call("deleting the tasks' policy", cons.acl.policy.delete, existing["ID"], needs=OPERATOR_TOKEN)
