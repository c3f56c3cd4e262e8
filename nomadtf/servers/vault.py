"""Secrets from Vault / OpenBao via hvac, for the training process only.

A value never reaches a log line, an error message, Consul or the Nomad job: errors name
the path and key, nothing else. Leased secrets, and a login token nomadtf got itself
(AppRole), are renewed while training runs; the task logs in once.

What is retried and what is not: a mistake a human must fix (a path with no secret, a
policy that denies it, AppRole ids or a role Vault does not know) fails at once, naming
the path or the role; only transient errors (connection refused, timeouts, 5xx, a sealed
or standby Vault) are retried, for `budget_s`, and then fail naming Vault's address.

Usage:
    vault = VaultSession(spec.vault.document, on_error=log.warning)  # logs in on first use
    fetched = vault.fetch(list(spec.secrets), secrets_dir)      # renews its leases
    ...
    vault.close()          # stops every renewer; revokes a token nomadtf logged in for
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvac
import hvac.exceptions
import requests
import tenacity

from nomadtf import wire
from nomadtf.errors import VaultError

RETRYABLE = (requests.ConnectionError, requests.Timeout, hvac.exceptions.VaultDown, hvac.exceptions.InternalServerError)
# hvac raises these for 4xx answers of a login: the ids, the role or the mount are wrong.
LOGIN_MISTAKES = (hvac.exceptions.InvalidRequest, hvac.exceptions.Forbidden, hvac.exceptions.InvalidPath, hvac.exceptions.Unauthorized)
DEFAULT_BUDGET_S = 60.0

log = logging.getLogger("nomadtf.task")  # retries are said in the task's log, with the address


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


def take_token_file(environ: Mapping[str, str], keep: bool = False) -> str:
    """The Vault token Nomad wrote to the task's secrets/vault_token ("" when none), and the
    file removed unless `keep` (vault.token_for_code): read before any child starts, it then
    exists only in this undumpable process. Nomad derives and writes a new one if the task
    restarts."""
    path = Path(environ.get("NOMAD_SECRETS_DIR", "secrets")) / "vault_token"
    try:
        token = path.read_text().strip()
    except OSError:
        return ""
    if not keep:
        with contextlib.suppress(OSError):
            path.unlink()
    return token


_approle_ids: tuple[str, str] | None = None  # read once from the file, then only in this (undumpable) process


def approle_ids(environ: Mapping[str, str]) -> tuple[str, str]:
    """AppRole's role_id and secret_id: from the env (NOMADTF_VAULT_ROLE_ID and
    NOMADTF_VAULT_SECRET_ID), else from the file Nomad rendered from the job's Nomad variable
    (secrets/vault_approle), read and removed at the first call, before any code starts.
    ("", "") when neither has them."""
    global _approle_ids
    if environ.get(wire.ENV_VAULT_ROLE_ID) and environ.get(wire.ENV_VAULT_SECRET_ID):
        return environ[wire.ENV_VAULT_ROLE_ID], environ[wire.ENV_VAULT_SECRET_ID]
    if _approle_ids is None:
        path = Path(environ.get("NOMAD_SECRETS_DIR", "secrets")) / wire.APPROLE_FILE
        try:
            lines = path.read_text().split("\n")
        except OSError:
            return "", ""
        with contextlib.suppress(OSError):
            path.unlink()
        _approle_ids = (lines[0].strip(), lines[1].strip() if len(lines) > 1 else "")
    return _approle_ids


def login(vault_cfg: dict[str, Any], budget_s: float = DEFAULT_BUDGET_S) -> hvac.Client:
    """A client with a token: Nomad's VAULT_TOKEN, or our own AppRole / JWT login. A login
    Vault refuses fails at once naming the role; an unreachable Vault is retried for
    `budget_s`.

    AppRole: role_id and secret_id from env NOMADTF_VAULT_ROLE_ID / NOMADTF_VAULT_SECRET_ID,
    else from the job's Nomad variable (`approle_ids`) (POST /v1/auth/<mount>/login). JWT: the token in NOMAD_TOKEN or the file
    NOMAD_SECRETS_DIR/nomad_token (Nomad workload identity), role `vault.role`
    (POST /v1/auth/<mount>/login).
    """
    client = hvac.Client(url=vault_address(vault_cfg), **vault_tls())
    auth = vault_cfg.get("auth", "nomad")
    mount = vault_cfg.get("mount") or auth
    if auth == "nomad":
        token = os.environ.get("VAULT_TOKEN") or take_token_file(os.environ, keep=bool(vault_cfg.get("token_for_code")))
        if not token:
            raise VaultError("no Vault token in the task (secrets/vault_token or VAULT_TOKEN); the job needs a vault block (vault.policies)")
        client.token = token
        return client
    if auth == "approle":
        role_id, secret_id = approle_ids(os.environ)
        if not role_id or not secret_id:
            raise VaultError(
                f"vault.auth is approle but the task has no AppRole ids: put {wire.APPROLE_ROLE_KEY} and {wire.APPROLE_SECRET_KEY} "
                f"in the job's Nomad variable (nomad var put nomad/jobs/<job> {wire.APPROLE_ROLE_KEY}=... {wire.APPROLE_SECRET_KEY}=...), "
                f"or set {wire.ENV_VAULT_ROLE_ID} and {wire.ENV_VAULT_SECRET_ID} in the job's env (visible in the job)"
            )
        call = lambda: client.auth.approle.login(role_id=role_id, secret_id=secret_id, mount_point=mount)  # noqa: E731
        who = f"AppRole login at auth/{mount}"
    else:
        jwt = os.environ.get("NOMAD_TOKEN") or _read_identity_token()
        role = vault_cfg.get("role", "")
        call = lambda: client.auth.jwt.jwt_login(role=role, jwt=jwt, path=mount)  # noqa: E731
        who = f"JWT login at auth/{mount} with role {role!r}"
    try:
        _transient_retry(client, call, f"for the {who}", budget_s)
    except LOGIN_MISTAKES as exc:
        raise VaultError(f"Vault refused the {who}: {_vault_reason(exc)}; check the ids and that the role exists") from None
    except hvac.exceptions.VaultError as exc:
        raise VaultError(f"Vault refused the {who}: {exc.__class__.__name__}") from None
    return client


def _read_identity_token() -> str:
    path = Path(os.environ.get("NOMAD_SECRETS_DIR", "secrets")) / "nomad_token"
    try:
        return path.read_text().strip()
    except OSError:
        raise VaultError("vault.auth is jwt but the task has no workload identity token") from None


def _transient_retry(client: hvac.Client, call: Callable[[], Any], what: str, budget_s: float) -> Any:
    """`call()`, retried with backoff (0.5 s, doubling to 8 s) for `budget_s` on transient
    errors only; then a VaultError naming Vault's address and what was tried. A TLS failure
    is said at once (a retry cannot fix a CA); anything else is raised as is."""
    attempts = 0
    started = time.monotonic()

    def attempt() -> Any:
        nonlocal attempts
        attempts += 1
        return call()

    def say_retry(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning("Vault at %s unreachable %s (%s); retrying in %.1fs", client.url, what, error.__class__.__name__, delay)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(_is_transient),
        wait=tenacity.wait_exponential(multiplier=0.5, max=8.0),
        stop=tenacity.stop_before_delay(budget_s),
        before_sleep=say_retry,
        reraise=True,
    )
    try:
        return retrying(attempt)
    except requests.exceptions.SSLError as exc:
        raise VaultError(
            f"TLS with Vault at {client.url} failed {what} ({_tls_reason(exc)}); set vault.ca_file to the CA "
            "bundle on the clients that signed Vault's certificate"
        ) from None
    except RETRYABLE as exc:
        raise VaultError(
            f"Vault at {client.url} unreachable {what}: {exc.__class__.__name__} on each of {attempts} attempts "
            f"over {time.monotonic() - started:.0f}s; check vault.address (or VAULT_ADDR) and that Vault is up and unsealed"
        ) from None


def _is_transient(exc: BaseException) -> bool:
    # requests' SSLError is a ConnectionError, and not transient.
    return isinstance(exc, RETRYABLE) and not isinstance(exc, requests.exceptions.SSLError)


def _vault_reason(exc: Exception) -> str:
    """Vault's own words for a refusal (they never carry a secret), else the error's name."""
    errors = getattr(exc, "errors", None)
    if isinstance(errors, list) and errors:
        return "; ".join(str(e) for e in errors)[:200]
    return exc.__class__.__name__


def split_path(path: str) -> tuple[str, str]:
    """"secret/team/s3" -> ("secret", "team/s3")."""
    mount, _, rest = path.partition("/")
    return mount, rest


def read_one(client: hvac.Client, path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(data, lease) at `path`: KV v2 first, then a plain logical read (KV v1, dynamic secrets).
    VaultError naming the path when there is no secret there or the policy denies it.

    GET /v1/<mount>/data/<rest> ; GET /v1/<path>
    """
    mount, rest = split_path(path)
    kv2_empty = False
    try:
        response = client.secrets.kv.v2.read_secret_version(path=rest, mount_point=mount, raise_on_deleted_version=True)
        return response["data"]["data"], None
    except hvac.exceptions.InvalidPath:
        kv2_empty = True  # a KV v2 mount the token may read, with nothing at that path
    except (hvac.exceptions.InvalidRequest, hvac.exceptions.UnsupportedOperation):
        pass  # not a KV v2 mount
    except hvac.exceptions.Forbidden:
        # A least-privilege token may read <mount>/<rest> (a secrets engine's path) but not
        # the <mount>/data/<rest> a KV v2 read asks for: the plain read below decides.
        pass
    try:
        response = client.read(path)
    except (hvac.exceptions.Forbidden, hvac.exceptions.InvalidPath):
        if kv2_empty:
            raise VaultError(f"no secret at {path} (KV v2 {mount}/data/{rest} is empty); check the path in the job's secrets") from None
        raise VaultError(f"permission denied reading secret {path}; check the job's vault.policies") from None
    if not response:
        raise VaultError(f"no secret at {path}; check the path in the job's secrets")
    lease = None
    if response.get("lease_id") and response.get("renewable"):
        lease = {"lease_id": response["lease_id"], "lease_duration": response.get("lease_duration", 0)}
    return response.get("data") or {}, lease


def read_secret(client: hvac.Client, path: str, budget_s: float = DEFAULT_BUDGET_S) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`read_one`, with an unreachable Vault retried for `budget_s`; a missing or forbidden
    path fails at once (a human must fix it)."""
    try:
        return _transient_retry(client, lambda: read_one(client, path), f"reading {path}", budget_s)
    except VaultError:
        raise
    except hvac.exceptions.VaultError as exc:
        raise VaultError(f"Vault refused secret {path}: {_vault_reason(exc)}") from None


def fetch_secrets(
    client: hvac.Client, refs: list[dict[str, Any]], secrets_dir: Path, budget_s: float = DEFAULT_BUDGET_S
) -> Fetched:
    """Read every referenced secret (`read_secret`); env values and 0600 files. A missing key
    names the path and the keys there, never a value."""
    fetched = Fetched()
    cache: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for ref in refs:
        path, key = ref["path"], ref["key"]
        if path not in cache:
            cache[path] = read_secret(client, path, budget_s)
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


def _tls_reason(exc: Exception) -> str:
    text = str(exc)
    for known in ("certificate verify failed", "wrong version number", "hostname mismatch", "self-signed certificate"):
        if known in text:
            return known
    return exc.__class__.__name__


class Renewer(threading.Thread):
    """A thread that keeps something alive until `stop()`; `what` names it in logs."""

    what = "a Vault lease"

    def __init__(self, client: hvac.Client, on_error: Callable[[str], None] | None = None):
        super().__init__(name=f"vault-renewer ({self.what})", daemon=True)
        self.client = client
        self.on_error = on_error or (lambda _msg: None)
        self.stop_event = threading.Event()

    def stop(self) -> None:
        self.stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)


class LeaseRenewer(Renewer):
    """Renews leased secrets at half their duration while training runs.

    PUT /v1/sys/leases/renew
    """

    what = "secret leases"

    def __init__(self, client: hvac.Client, leases: list[dict[str, Any]], on_error=None):
        super().__init__(client, on_error)
        self.leases = leases

    def run(self) -> None:
        if not self.leases:
            return
        interval = max(2.0, min(lease.get("lease_duration", 60) for lease in self.leases) / 2)
        while not self.stop_event.wait(interval):
            for lease in self.leases:
                try:
                    self.client.sys.renew_lease(lease_id=lease["lease_id"])
                except Exception as exc:  # noqa: BLE001 - keep renewing the others
                    self.on_error(f"Vault at {self.client.url}: lease renewal failed ({exc.__class__.__name__}); will retry")


class TokenRenewer(Renewer):
    """Keeps a token nomadtf logged in with itself (AppRole) alive: renew-self at half its
    TTL while the task runs (the leases it created die with it). Tokens Nomad derives for a
    task are renewed by Nomad. Renewal ends at the role's token_max_ttl.

    GET /v1/auth/token/lookup-self ; PUT /v1/auth/token/renew-self
    """

    what = "the AppRole login token"

    def run(self) -> None:
        try:
            data = self.client.auth.token.lookup_self()["data"]
        except Exception as exc:  # noqa: BLE001 - renewal is best effort; the read already succeeded
            self.on_error(f"cannot look up the Vault token ({exc.__class__.__name__}); it will not be renewed")
            return
        ttl = int(data.get("ttl") or 0)
        if not data.get("renewable") or ttl <= 0:
            return  # a root or non-expiring token, or one Vault will not renew
        wait, warned = max(1.0, ttl / 2), False
        while not self.stop_event.wait(wait):
            try:
                granted = int(self.client.auth.token.renew_self()["auth"]["lease_duration"])
                wait = max(1.0, (granted or ttl) / 2)
                if 0 < granted < ttl and not warned:
                    warned = True  # capped by the role's token_max_ttl: it ends, and its leases with it
                    self.on_error(f"the AppRole login token reaches its token_max_ttl in {granted}s; the leases it created end with it")
            except Exception as exc:  # noqa: BLE001 - keep trying until it expires
                self.on_error(f"Vault at {self.client.url}: login token renewal failed ({exc.__class__.__name__}); will retry")
                wait = 2.0


class VaultSession:
    """One task's Vault: one login (on first use), every renewer it started, and the end of
    both. `close()` stops the renewers and, for a token nomadtf logged in for (AppRole,
    JWT), revokes it, and with it the leases it created. Nomad's own token is Nomad's to
    renew and revoke; leases read with it are revoked one by one.

    Usage:
        vault = VaultSession(spec.vault.document, on_error=log.warning)
        fetched = vault.fetch(refs, secrets_dir); data, lease = vault.read(path)
        vault.close()

    PUT /v1/auth/token/revoke-self ; PUT /v1/sys/leases/revoke/<lease_id>
    """

    def __init__(self, vault_cfg: dict[str, Any], on_error: Callable[[str], None] | None = None, budget_s: float = DEFAULT_BUDGET_S):
        self.vault_cfg = vault_cfg
        self.on_error = on_error
        self.budget_s = budget_s
        self.own_token = vault_cfg.get("auth", "nomad") != "nomad"
        self._client: hvac.Client | None = None
        self.renewers: list[Renewer] = []
        self.leases: list[dict[str, Any]] = []

    @property
    def client(self) -> hvac.Client:
        if self._client is None:
            self._client = login(self.vault_cfg, self.budget_s)
            if self.own_token:
                self._start(TokenRenewer(self._client, on_error=self.on_error))
        return self._client

    def read(self, path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        data, lease = read_secret(self.client, path, self.budget_s)
        if lease:
            self._renew([lease])
        return data, lease

    def fetch(self, refs: list[dict[str, Any]], secrets_dir: Path) -> Fetched:
        fetched = fetch_secrets(self.client, refs, secrets_dir, self.budget_s)
        self._renew(fetched.leases)
        return fetched

    def revoke_lease(self, lease: dict[str, Any]) -> None:
        """Revoke one lease now (the path form lets a job's policy allow revoking its own
        leases only, `acl.vault_tasks_policy`). PUT /v1/sys/leases/revoke/<lease_id>"""
        if lease in self.leases:
            self.leases.remove(lease)
        for renewer in self.renewers:
            if isinstance(renewer, LeaseRenewer) and lease in renewer.leases:
                renewer.leases.remove(lease)
        if self._client is not None:
            try:
                self._client.write(f"sys/leases/revoke/{lease['lease_id']}")
            except Exception:  # noqa: BLE001 - it expires at its TTL anyway
                pass

    def close(self) -> None:
        for renewer in self.renewers:
            renewer.stop()
        self.renewers = []
        if self._client is None:
            return
        if self.own_token:
            try:
                self._client.auth.token.revoke_self()
            except Exception as exc:  # noqa: BLE001 - it expires at its TTL anyway
                if self.on_error:
                    self.on_error(f"could not revoke our Vault token at {self._client.url} ({exc.__class__.__name__}); it expires at its TTL")
        else:
            for lease in list(self.leases):
                self.revoke_lease(lease)
        self.leases = []
        self._client = None

    def _renew(self, leases: list[dict[str, Any]]) -> None:
        fresh = [lease for lease in leases if lease not in self.leases]
        if fresh:
            self.leases += fresh
            self._start(LeaseRenewer(self.client, fresh, on_error=self.on_error))

    def _start(self, renewer: Renewer) -> None:
        self.renewers.append(renewer)
        renewer.start()


@dataclass
class ConsulToken:
    """The tasks' Consul ACL token, read from Vault at start (discovery.consul_token_path):
    a Consul secrets engine's `creds/<role>` (leased: renewed while the task runs, revoked
    when it ends) or a KV entry with a `token` key. Held in memory only.

    Usage:
        grant = ConsulToken.read(vault_session, spec.discovery.consul_token_path)
        client = consul_client(token=grant.token)
        ...
        grant.close()      # stops renewing, revokes the lease
    """

    token: str
    path: str
    vault: VaultSession
    lease: dict[str, Any] | None = None
    owns_vault: bool = False

    @property
    def client(self) -> hvac.Client:
        return self.vault.client

    @classmethod
    def read(cls, vault: VaultSession | dict[str, Any], path: str, on_error=None) -> ConsulToken:
        """`vault` a task's session, or a job's vault block (a session of the grant's own)."""
        owns = not isinstance(vault, VaultSession)
        session = VaultSession(vault, on_error=on_error) if owns else vault
        data, lease = session.read(path)
        token = data.get("token")
        if not token:
            raise VaultError(f"{path} has no `token` key (keys: {', '.join(sorted(data)) or 'none'}); it must hold the tasks' Consul token")
        return cls(str(token), path, session, lease, owns)

    def close(self) -> None:
        """Revoke the lease, so the Consul token is deleted now rather than at the end of
        its TTL; a session of the grant's own is closed with it."""
        if self.lease:
            self.vault.revoke_lease(self.lease)
            self.lease = None
        if self.owns_vault:
            self.vault.close()
