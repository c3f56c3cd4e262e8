"""Secrets from Vault / OpenBao via hvac, for the training process only.

A value never reaches a log line, an error message, Consul or the Nomad job: errors name
the path and key, nothing else. Leased secrets are renewed while training runs.

Usage:
    client = login(spec["vault"])               # VAULT_TOKEN from Nomad, or AppRole / JWT
    env, files = fetch_secrets(client, spec["secrets"], secrets_dir)
    renewer = LeaseRenewer(client, leases); renewer.start()
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvac
import hvac.exceptions
import requests

from nomadtf import wire
from nomadtf.errors import VaultError

RETRYABLE = (requests.ConnectionError, requests.Timeout, hvac.exceptions.VaultDown, hvac.exceptions.InternalServerError)


@dataclass
class Fetched:
    env: dict[str, str] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    leases: list[dict[str, Any]] = field(default_factory=list)


def vault_address(vault_cfg: dict[str, Any]) -> str:
    return vault_cfg.get("address") or os.environ.get("VAULT_ADDR") or "http://127.0.0.1:8200"


def vault_tls() -> dict[str, Any]:
    """hvac's TLS arguments from the vault CLI's variables: VAULT_CACERT (a CA bundle),
    VAULT_CLIENT_CERT + VAULT_CLIENT_KEY, VAULT_SKIP_VERIFY. Passed per request, so
    REQUESTS_CA_BUNDLE in the environment cannot replace them."""
    verify: bool | str = True
    if os.environ.get("VAULT_CACERT"):
        verify = os.environ["VAULT_CACERT"]
    elif os.environ.get("VAULT_SKIP_VERIFY", "").lower() in ("1", "true"):
        verify = False
    cert = None
    if os.environ.get("VAULT_CLIENT_CERT") and os.environ.get("VAULT_CLIENT_KEY"):
        cert = (os.environ["VAULT_CLIENT_CERT"], os.environ["VAULT_CLIENT_KEY"])
    return {"verify": verify, "cert": cert}


def login(vault_cfg: dict[str, Any]) -> hvac.Client:
    """A client with a token: Nomad's VAULT_TOKEN, or our own AppRole / JWT login.

    AppRole: role_id and secret_id from env NOMADTF_VAULT_ROLE_ID / NOMADTF_VAULT_SECRET_ID
    (POST /v1/auth/<mount>/login). JWT: the token in NOMAD_TOKEN or the file
    NOMAD_SECRETS_DIR/nomad_token (Nomad workload identity), role `vault.role`.
    """
    client = hvac.Client(url=vault_address(vault_cfg), **vault_tls())
    auth = vault_cfg.get("auth", "nomad")
    try:
        if auth == "nomad":
            token = os.environ.get("VAULT_TOKEN")
            if not token:
                raise VaultError("no VAULT_TOKEN in the task; the job needs a vault block (vault.policies)")
            client.token = token
        elif auth == "approle":
            client.auth.approle.login(
                role_id=os.environ.get(wire.ENV_VAULT_ROLE_ID, ""),
                secret_id=os.environ.get(wire.ENV_VAULT_SECRET_ID, ""),
                mount_point=vault_cfg.get("mount") or "approle",
            )
        elif auth == "jwt":
            jwt = os.environ.get("NOMAD_TOKEN") or _read_identity_token()
            client.auth.jwt.jwt_login(role=vault_cfg.get("role", ""), jwt=jwt, path=vault_cfg.get("mount") or "jwt")
    except hvac.exceptions.VaultError as exc:
        raise VaultError(f"Vault login ({auth}) failed: {exc.__class__.__name__}") from None
    except RETRYABLE as exc:
        raise VaultError(f"cannot reach Vault at {client.url} for login: {exc.__class__.__name__}") from None
    return client


def _read_identity_token() -> str:
    path = Path(os.environ.get("NOMAD_SECRETS_DIR", "secrets")) / "nomad_token"
    try:
        return path.read_text().strip()
    except OSError:
        raise VaultError("vault.auth is jwt but the task has no workload identity token") from None


def split_path(path: str) -> tuple[str, str]:
    """"secret/team/s3" -> ("secret", "team/s3")."""
    mount, _, rest = path.partition("/")
    return mount, rest


def read_one(client: hvac.Client, path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(data, lease) at `path`: KV v2 first, then a plain logical read (KV v1, dynamic secrets).

    GET /v1/<mount>/data/<rest> ; GET /v1/<path>
    """
    mount, rest = split_path(path)
    try:
        response = client.secrets.kv.v2.read_secret_version(path=rest, mount_point=mount, raise_on_deleted_version=True)
        return response["data"]["data"], None
    except hvac.exceptions.InvalidPath:
        pass
    except (hvac.exceptions.InvalidRequest, hvac.exceptions.UnsupportedOperation):
        pass  # not a KV v2 mount
    except hvac.exceptions.Forbidden:
        # A least-privilege token may read <mount>/<rest> (a secrets engine's path) but not
        # the <mount>/data/<rest> a KV v2 read asks for: the plain read below decides.
        pass
    response = client.read(path)
    if not response:
        raise hvac.exceptions.InvalidPath()
    lease = None
    if response.get("lease_id") and response.get("renewable"):
        lease = {"lease_id": response["lease_id"], "lease_duration": response.get("lease_duration", 0)}
    return response.get("data") or {}, lease


def fetch_secrets(
    client: hvac.Client, refs: list[dict[str, Any]], secrets_dir: Path, budget_s: float = 60.0
) -> Fetched:
    """Read every referenced secret. Retries with backoff for `budget_s` when Vault is
    unreachable or a path is missing (it may be written moments later), then fails naming
    the path and key."""
    fetched = Fetched()
    cache: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for ref in refs:
        path, key = ref["path"], ref["key"]
        if path not in cache:
            cache[path] = _read_with_retry(client, path, budget_s)
        data, lease = cache[path]
        if lease and lease not in fetched.leases:
            fetched.leases.append(lease)
        if key not in data:
            raise VaultError(f"secret {path} has no key {key!r} (keys: {', '.join(sorted(data)) or 'none'})")
        value = str(data[key])
        if ref.get("env"):
            fetched.env[ref["env"]] = value
        else:
            target = secrets_dir / ref["file"]
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(value)
            target.chmod(0o600)
            fetched.files.append(target)
    return fetched


def _read_with_retry(client: hvac.Client, path: str, budget_s: float) -> tuple[dict[str, Any], dict[str, Any] | None]:
    deadline = time.monotonic() + budget_s
    delay = 0.5
    while True:
        try:
            return read_one(client, path)
        except hvac.exceptions.Forbidden:
            raise VaultError(f"permission denied reading secret {path}; check the job's vault.policies") from None
        except requests.exceptions.SSLError as exc:
            raise VaultError(
                f"TLS with Vault at {client.url} failed reading {path} ({_tls_reason(exc)}); set vault.ca_file to the CA "
                "bundle on the clients that signed Vault's certificate"
            ) from None
        except (hvac.exceptions.InvalidPath, *RETRYABLE) as exc:
            reason = "no secret at that path" if isinstance(exc, hvac.exceptions.InvalidPath) else f"Vault at {client.url} unreachable"
            if time.monotonic() + delay > deadline:
                raise VaultError(f"cannot read secret {path} after {budget_s:.0f}s: {reason}") from None
        except hvac.exceptions.VaultError as exc:
            raise VaultError(f"Vault refused secret {path}: {exc.__class__.__name__}") from None
        time.sleep(delay)
        delay = min(delay * 2, 8.0)


def _tls_reason(exc: Exception) -> str:
    text = str(exc)
    for known in ("certificate verify failed", "wrong version number", "hostname mismatch", "self-signed certificate"):
        if known in text:
            return known
    return exc.__class__.__name__


class LeaseRenewer(threading.Thread):
    """Renews leased secrets at half their duration while training runs.

    PUT /v1/sys/leases/renew
    """

    def __init__(self, client: hvac.Client, leases: list[dict[str, Any]], on_error=None):
        super().__init__(name="vault-lease-renewer", daemon=True)
        self.client = client
        self.leases = leases
        self.on_error = on_error or (lambda _msg: None)
        self.stop_event = threading.Event()

    def run(self) -> None:
        if not self.leases:
            return
        interval = max(5.0, min(lease.get("lease_duration", 60) for lease in self.leases) / 2)
        while not self.stop_event.wait(interval):
            for lease in self.leases:
                try:
                    self.client.sys.renew_lease(lease_id=lease["lease_id"])
                except Exception as exc:  # noqa: BLE001 - keep renewing the others
                    self.on_error(f"lease renewal failed ({exc.__class__.__name__}); will retry")


class TokenRenewer(threading.Thread):
    """Keeps a token nomadtf logged in with itself (AppRole) alive: renew-self at half its
    TTL while the task runs. Tokens Nomad derives for a task are renewed by Nomad.

    GET /v1/auth/token/lookup-self ; PUT /v1/auth/token/renew-self
    """

    def __init__(self, client: hvac.Client, on_error=None):
        super().__init__(name="vault-token-renewer", daemon=True)
        self.client = client
        self.on_error = on_error or (lambda _msg: None)
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            data = self.client.auth.token.lookup_self()["data"]
        except Exception as exc:  # noqa: BLE001 - renewal is best effort; the read already succeeded
            self.on_error(f"cannot look up the Vault token ({exc.__class__.__name__}); it will not be renewed")
            return
        ttl = int(data.get("ttl") or 0)
        if not data.get("renewable") or ttl <= 0:
            return  # a root or non-expiring token, or one Vault will not renew
        while not self.stop_event.wait(max(5.0, ttl / 2)):
            try:
                ttl = int(self.client.auth.token.renew_self()["auth"]["lease_duration"]) or ttl
            except Exception as exc:  # noqa: BLE001 - keep trying until it expires
                self.on_error(f"Vault token renewal failed ({exc.__class__.__name__}); will retry")


@dataclass
class ConsulToken:
    """The tasks' Consul ACL token, read from Vault at start (discovery.consul_token_path):
    a Consul secrets engine's `creds/<role>` (leased: renewed while the task runs, revoked
    when it ends) or a KV entry with a `token` key. Held in memory only.

    Usage:
        grant = ConsulToken.read(spec.vault, spec.discovery.consul_token_path)
        client = consul_client(token=grant.token)
        ...
        grant.close()      # stops renewing, revokes the lease
    """

    token: str
    path: str
    client: hvac.Client | None = None
    lease: dict[str, Any] | None = None
    renewers: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def read(cls, vault_cfg: dict[str, Any], path: str, on_error=None, budget_s: float = 60.0) -> ConsulToken:
        client = login(vault_cfg)
        data, lease = _read_with_retry(client, path, budget_s)
        token = data.get("token")
        if not token:
            raise VaultError(f"{path} has no `token` key (keys: {', '.join(sorted(data)) or 'none'}); it must hold the tasks' Consul token")
        grant = cls(str(token), path, client, lease)
        if lease:
            grant.renewers.append(LeaseRenewer(client, [lease], on_error=on_error))
        if vault_cfg.get("auth", "nomad") != "nomad":
            grant.renewers.append(TokenRenewer(client, on_error=on_error))
        for renewer in grant.renewers:
            renewer.start()
        return grant

    def close(self) -> None:
        """Stop renewing; revoke the lease, so the Consul token is deleted now rather than
        at the end of its TTL. The path form lets the job's policy allow revoking its own
        leases only (`acl.vault_tasks_policy`). PUT /v1/sys/leases/revoke/<lease_id>"""
        for renewer in self.renewers:
            renewer.stop_event.set()  # type: ignore[attr-defined]
        if self.lease and self.client is not None:
            try:
                self.client.write(f"sys/leases/revoke/{self.lease['lease_id']}")
            except Exception:  # noqa: BLE001 - it expires at its TTL anyway
                pass
            self.lease = None
