"""Bootstrapping the stacks' servers once they answer: what Nomad needs from OpenBao (both
stacks), and on the secure stack the Consul ACL tokens the agents were configured with,
Nomad's ACL bootstrap, OpenBao's init and unseal, and its Consul secrets engine.

Every call goes through the client libraries: hvac for OpenBao, py-consul for Consul,
python-nomad for Nomad. Where a library has no call for an endpoint, the request goes
through that library's own transport (its token, TLS settings and errors), in one helper
each, which says why: `_vault_write` (hvac 2.4 has no plugin catalog, no plugin reload,
and its `secrets.consul.configure_access` takes no `ca_cert`) and `nomad_acl_bootstrap`
(python-nomad's `acl.generate_bootstrap` sends no body, so no BootstrapSecret).

A failed call is a DevStackError that names the call and the HTTP status, never the
response body: an ACL call's body may echo a token.

Usage:
    nomad_token = configure_openbao(api.vault())        # Nomad's periodic server token
    consul_acl_setup(api.consul(), secure_state)
    openbao_init(api.vault(), secure_state)             # then api = stack.api(): it has the root token
    register_consul_engine(api.vault(), consul_engine.PLUGIN.path())
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import consul
import consul.exceptions as consul_exc
import hvac
import hvac.exceptions as vault_exc
import nomad
import nomad.api.exceptions as nomad_exc
import requests

from nomadtf.devstack import consul_engine, wiring
from nomadtf.devstack.security import CONSUL_POLICIES, SecureState
from nomadtf.errors import DevStackError

# The Nomad server policy and the token role, as the Nomad 1.6 Vault integration documents
# them (legacy token workflow): Nomad holds a periodic token with this policy and derives
# one token per task from the role.
NOMAD_SERVER_POLICY = """
path "auth/token/create/nomad-cluster" { capabilities = ["update"] }
path "auth/token/roles/nomad-cluster" { capabilities = ["read"] }
path "auth/token/lookup-self" { capabilities = ["read"] }
path "auth/token/lookup" { capabilities = ["update"] }
path "auth/token/revoke-accessor" { capabilities = ["update"] }
path "sys/capabilities-self" { capabilities = ["update"] }
path "auth/token/renew-self" { capabilities = ["update"] }
"""
NOMAD_CLUSTER_ROLE = {
    "disallowed_policies": ["nomad-server"],
    "token_explicit_max_ttl": 0,
    "orphan": True,
    "token_period": 259200,  # 72 h, renewed by Nomad
    "renewable": True,
}

_VAULT_STATUS = {
    vault_exc.InvalidRequest: 400,
    vault_exc.Unauthorized: 401,
    vault_exc.Forbidden: 403,
    vault_exc.InvalidPath: 404,
    vault_exc.UnsupportedOperation: 405,
    vault_exc.PreconditionFailed: 412,
    vault_exc.RateLimitExceeded: 429,
    vault_exc.InternalServerError: 500,
    vault_exc.VaultNotInitialized: 501,
    vault_exc.BadGateway: 502,
    vault_exc.VaultDown: 503,
}
_CONSUL_STATUS = {
    consul_exc.BadRequest: 400,
    consul_exc.ACLDisabled: 401,
    consul_exc.ACLPermissionDenied: 403,
    consul_exc.NotFound: 404,
}


def _answer(exc: Exception) -> str:
    """What the server answered, as "HTTP <status>", from any of the three libraries'
    errors; the error's name when no server answered."""
    if isinstance(exc, nomad_exc.BaseNomadException) and isinstance(exc.nomad_resp, requests.Response):
        return f"HTTP {exc.nomad_resp.status_code}"
    for kind, status in {**_VAULT_STATUS, **_CONSUL_STATUS}.items():
        if isinstance(exc, kind):
            return f"HTTP {status}"
    if isinstance(exc, consul.ConsulException) and str(exc).split(" ", 1)[0].isdigit():
        return f"HTTP {str(exc).split(' ', 1)[0]}"  # py-consul's "<status> <body>": the status only
    return type(exc).__name__


@contextlib.contextmanager
def _calling(what: str, say_errors: bool = False) -> Iterator[None]:
    """Turn a client library's failure into DevStackError("<what> failed: HTTP 403").
    `say_errors`: add OpenBao's error strings (for calls whose answer holds no secret)."""
    try:
        yield
    except (requests.RequestException, nomad_exc.BaseNomadException, consul.ConsulException, vault_exc.VaultError) as exc:
        errors = getattr(exc, "errors", None) if say_errors else None
        detail = f": {'; '.join(errors)}" if errors else ""
        raise DevStackError(f"{what} failed: {_answer(exc)}{detail}") from None


def _vault_write(vault: hvac.Client, method: str, path: str, body: dict[str, Any]) -> None:
    """`method` `path` with the JSON `body`, through hvac's adapter (the client's token, TLS
    and errors): for the endpoints hvac 2.4 has no call for (the plugin catalog, plugin
    reload, the Consul engine's config/access with a ca_cert)."""
    vault.adapter.request(method, path, json=body)


# ---- OpenBao for Nomad (both stacks) -----------------------------------------------------


def configure_openbao(vault: hvac.Client) -> str:
    """Policy and token role for Nomad, KV v2 at secret/. Returns Nomad's server token.

    PUT /v1/sys/policies/acl/nomad-server ; POST /v1/auth/token/roles/nomad-cluster ;
    GET /v1/sys/mounts ; POST /v1/sys/mounts/secret (unless mounted) ;
    POST /v1/auth/token/create-orphan
    """
    with _calling("openbao policy nomad-server"):
        vault.sys.create_or_update_policy("nomad-server", NOMAD_SERVER_POLICY)
    with _calling(f"openbao token role {wiring.VAULT_ROLE}"):
        vault.auth.token.create_or_update_role(wiring.VAULT_ROLE, **NOMAD_CLUSTER_ROLE)
    with _calling("the KV engine at secret/"):
        if "secret/" not in vault.sys.list_mounted_secrets_engines()["data"]:
            vault.sys.enable_secrets_engine("kv", path="secret", options={"version": "2"})
    with _calling("nomad's openbao token"):
        created = vault.auth.token.create_orphan(policies=["nomad-server"], period="72h")
    return created["auth"]["client_token"]


# ---- the secure stack ------------------------------------------------------------------------


def openbao_init(vault: hvac.Client, state: SecureState) -> str:
    """Initialise OpenBao (one key share) unless done, and unseal it; the root token and
    the unseal key go to tokens.json. Returns the root token.

    PUT /v1/sys/init (once) ; PUT /v1/sys/unseal
    """
    tokens = state.tokens()
    if not tokens.openbao_root:
        with _calling("openbao init"):
            answer = vault.sys.initialize(secret_shares=1, secret_threshold=1)
        tokens = state.save_openbao(answer["root_token"], answer["keys_base64"][0])
    with _calling("openbao unseal"):
        vault.sys.submit_unseal_key(tokens.openbao_unseal)
    return tokens.openbao_root


def consul_acl_setup(client: consul.Consul, state: SecureState) -> None:
    """The stack's own Consul policies (CONSUL_POLICIES), and for each a token with the
    SecretID the agents were configured with. `client` carries the management token.

    PUT /v1/acl/policy ; PUT /v1/acl/token
    """
    for name, secret in state.tokens().consul_policy_secrets().items():
        with _calling(f"consul policy {name}"):
            client.acl.policy.create(name, rules=CONSUL_POLICIES[name])
        with _calling(f"consul token for {name}"):
            client.acl.token.create(secret_id=secret, description=f"{name} (nomadtf dev stack)", policies_name=[name])


def nomad_acl_bootstrap(client: nomad.Nomad, state: SecureState) -> None:
    """Bootstrap Nomad's ACLs with the management token the stack chose (done already: a
    no-op). Sent through python-nomad's requester: its `generate_bootstrap` sends no body.

    POST /v1/acl/bootstrap
    """
    try:
        client.acl.request("bootstrap", method="post", json={"BootstrapSecret": state.tokens().nomad_management})
    except nomad_exc.BadRequestNomadException as exc:
        if "already done" in getattr(exc.nomad_resp, "text", "").lower():
            return
        raise DevStackError(f"nomad acl bootstrap failed: {_answer(exc)}") from None
    except (requests.RequestException, nomad_exc.BaseNomadException) as exc:
        raise DevStackError(f"nomad acl bootstrap failed: {_answer(exc)}") from None


def register_consul_engine(vault: hvac.Client, binary: Path, path: str = consul_engine.MOUNT_PATH) -> str:
    """Register `binary` (which must lie in OpenBao's `plugin_directory`) in OpenBao's
    plugin catalog as secret/consul and mount it at `path`/. Idempotent; on a mount that
    exists already the plugin is reloaded, so a rebuilt binary takes over. Returns the
    sha256 registered.

    PUT /v1/sys/plugins/catalog/secret/consul ; GET /v1/sys/mounts ;
    POST /v1/sys/mounts/<path> (not mounted yet) ; PUT /v1/sys/plugins/reload/backend (mounted)
    """
    sha256 = consul_engine.binary_sha256(binary)
    catalog = f"/v1/sys/plugins/catalog/secret/{consul_engine.CATALOG_NAME}"
    with _calling(f"register the {consul_engine.PLUGIN_NAME} plugin", say_errors=True):
        _vault_write(vault, "put", catalog, {"sha256": sha256, "command": binary.name})
    with _calling("openbao mounts", say_errors=True):
        mounted = vault.sys.list_mounted_secrets_engines()["data"].get(f"{path}/")
    if mounted is None:
        with _calling(f"mount the consul engine at {path}/", say_errors=True):
            vault.sys.enable_secrets_engine(
                consul_engine.CATALOG_NAME, path=path, description=f"Consul ACL tokens ({consul_engine.PLUGIN_NAME})"
            )
    elif mounted.get("type") != consul_engine.CATALOG_NAME:
        raise DevStackError(f"{path}/ is mounted already, as {mounted.get('type')!r}, not {consul_engine.CATALOG_NAME!r}")
    else:
        with _calling("reload the consul engine", say_errors=True):
            _vault_write(vault, "put", "/v1/sys/plugins/reload/backend", {"plugin": consul_engine.CATALOG_NAME})
    return sha256


def configure_consul_engine(vault: hvac.Client, consul_address: str, state: SecureState, path: str = consul_engine.MOUNT_PATH) -> None:
    """Give the Consul engine at `path`/ Consul's address (HTTPS, the stack's CA) and the
    token it creates and revokes the tasks' tokens with.

    POST /v1/<path>/config/access
    """
    body = {
        "address": consul_address,
        "scheme": "https",
        "token": state.tokens().consul_openbao,
        "ca_cert": state.ca_file.read_text(),
    }
    with _calling("configure the consul engine"):
        _vault_write(vault, "post", f"/v1/{path}/config/access", body)
