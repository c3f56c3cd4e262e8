"""How nomadtf reaches Consul: a py-consul client from the consul CLI's environment
variables, the one mapping of py-consul's (and requests') exceptions to ours
(`consul_call`), bounded retries for the calls a failure path depends on (`retrying`), and a
task's own session, renewed by one thread while the task lives (`TaskSession`).
`consul.py` builds the run's keys and services on these.

Honours CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_HTTP_SSL, CONSUL_HTTP_SSL_VERIFY,
CONSUL_CACERT, CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY like the consul CLI.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import consul
import requests
import tenacity

from nomadtf import wire
from nomadtf.errors import ConsulError, ServerError, UnreachableError

SESSION_TTL_S = wire.TASK_SESSION_TTL_S
T = TypeVar("T")


def consul_call(what: str, fn: Callable[..., T], *args: Any, needs: str = "", **kwargs: Any) -> T:
    """Run a py-consul call; map its failures to ours (the one place, for every caller).
    `needs`: what the token must allow, when a denial has a better fix than `nomadtf acl`."""
    try:
        return fn(*args, **kwargs)
    except (requests.ConnectionError, requests.Timeout, consul.Timeout) as exc:
        raise UnreachableError(f"cannot reach Consul ({what}): {exc.__class__.__name__}") from exc
    except consul.ACLPermissionDenied as exc:
        token = "CONSUL_HTTP_TOKEN" if os.environ.get("CONSUL_HTTP_TOKEN") else "the anonymous token (CONSUL_HTTP_TOKEN is not set)"
        fix = needs or "its policy lacks the capability; see `nomadtf acl`"
        raise ConsulError(f"Consul denied {what} to {token}: {fix}") from exc
    except consul.ConsulException as exc:
        raise ConsulError(f"Consul refused {what}: {exc}") from exc


def retrying(deadline_s: float = 60.0, give_up: Callable[[], bool] = lambda: False) -> tenacity.Retrying:
    """Bounded retries for Consul calls on a failure path: exponential backoff up to 5 s,
    at most `deadline_s` in all, and no longer once `give_up()` says so (a stop signal)."""
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(ServerError),
        wait=tenacity.wait_exponential(multiplier=0.2, max=5.0),
        stop=tenacity.stop_after_delay(deadline_s) | tenacity.stop_when_event_set(_GiveUp(give_up)),
        reraise=True,
    )


class _GiveUp:
    """tenacity's stop_when_event_set wants an object with is_set()."""

    def __init__(self, check: Callable[[], bool]):
        self.is_set = check


def consul_client(token: str | None = None) -> consul.Consul:
    """A py-consul client from the consul CLI's environment variables (TLS included);
    `token` (the task's own, from Vault) replaces CONSUL_HTTP_TOKEN."""
    verify: bool | str = True
    if os.environ.get("CONSUL_CACERT"):
        verify = os.environ["CONSUL_CACERT"]
    elif os.environ.get("CONSUL_HTTP_SSL_VERIFY", "").lower() == "false":
        verify = False
    cert = None
    if os.environ.get("CONSUL_CLIENT_CERT") and os.environ.get("CONSUL_CLIENT_KEY"):
        cert = (os.environ["CONSUL_CLIENT_CERT"], os.environ["CONSUL_CLIENT_KEY"])
    client = consul.Consul(verify=verify, cert=cert)
    if token:
        client.token = token  # py-consul prefers CONSUL_HTTP_TOKEN over its argument
    return client


class TaskSession:
    """The task's session: created once (`open_session`), renewed every TTL/3 by one thread,
    destroyed on `close`. `renewed_at` is when Consul last accepted a renewal."""

    def __init__(self, client: consul.Consul):
        self.consul = client
        self.session: str | None = None
        # Monotonic time at which the last renewal (or the creation) of our session that
        # Consul accepted was sent: Consul lets the session lapse no sooner than one TTL
        # after it (the supervisor fences on it, policy.must_fence). Written by the renewer
        # thread, read by the supervisor's (one float: no lock needed).
        self.renewed_at: float | None = None
        self._session_name = ""
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    def open_session(self, name: str) -> str:
        """A session renewed every TTL/3 by one thread for this object's whole life; deleted
        on close; expires (and frees our slot) when we stop renewing it. Opening again (after
        Consul forgot it) replaces the id the same thread renews; no thread is added.

        PUT /v1/session/create
        """
        self._session_name = name
        sent = time.monotonic()
        # No lock delay: Consul applies it on every end of a session, our own destroy
        # included, so a supervisor that Nomad restarts could not take its own index back
        # (it would take another free one), nor a clean handover happen, for that long. The
        # margin a lapsed task needs is the fence's instead (policy.must_fence).
        self.session = consul_call(
            "creating a session",
            self.consul.session.create,
            name=name,
            ttl=SESSION_TTL_S,
            behavior="delete",
            lock_delay=0,
        )
        self.renewed_at = sent
        if self._renewer is None:
            self._stop.clear()
            self._renewer = threading.Thread(target=self._renew_loop, name="consul-session", daemon=True)
            self._renewer.start()
        return self.session

    def _renew_loop(self) -> None:
        while not self._stop.wait(SESSION_TTL_S / 3):
            try:
                self.renew_session()
            except Exception:  # noqa: BLE001 - Consul away: renewed_at says for how long (the supervisor fences)
                continue

    def renew_session(self) -> bool:
        """Renew our session once: True when Consul did (`renewed_at` moves), False when it
        has no such session any more (it lapsed, or Consul restarted and forgot it: the
        supervisor claims its index again). Raises ServerError when Consul cannot be reached.

        PUT /v1/session/renew/:id
        """
        session = self.session
        if not session:
            return False
        sent = time.monotonic()
        try:
            consul_call("renewing our session", self.consul.session.renew, session)
        except ConsulError as exc:
            if isinstance(exc.__cause__, consul.NotFound):
                return False
            raise
        if session == self.session:  # not replaced meanwhile (reopen_session): its time is the new one's
            self.renewed_at = sent
        return True

    def renewer_threads(self) -> int:
        """How many renewer threads this object runs (0 or 1); for tests."""
        return int(self._renewer is not None and self._renewer.is_alive())

    def close(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=1.0)
            self._renewer = None
        self._destroy_session()

    def _destroy_session(self) -> None:
        if self.session:
            try:
                self.consul.session.destroy(self.session)  # PUT /v1/session/destroy/:id
            except Exception:  # noqa: BLE001 - best effort; the TTL frees it anyway
                pass
            self.session = None
