"""How nomadtf reaches Nomad: the settings the nomad CLI reads (`NomadSettings`), TLS to a
server named otherwise, the one mapping of python-nomad's exceptions to ours
(`translated`), and `NomadTransport`, which sends every call of the adapter
(`servers/nomad.py`) with those settings: plain calls, blocking queries, log streams.

Where and how to reach Nomad comes from the nomad CLI's environment variables, read once
into `NomadSettings` and applied to every call alike: NOMAD_ADDR, NOMAD_TOKEN,
NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT, NOMAD_CLIENT_CERT + NOMAD_CLIENT_KEY,
NOMAD_TLS_SERVER_NAME and NOMAD_SKIP_VERIFY. A caller that knows better (a job.json names
its namespace and region) passes them.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import nomad
import nomad.api.exceptions as nomad_exc
import requests
import requests.adapters
import urllib3.exceptions
from nomad.api.base import Requester

from nomadtf import wire
from nomadtf.errors import NomadError, UnreachableError

DEFAULT_ADDR = "http://127.0.0.1:4646"
CALL_TIMEOUT_S = 10.0
_TRUE = ("1", "t", "true")  # what Go's strconv.ParseBool accepts, as the nomad CLI reads it
_FALSE = ("0", "f", "false")
Transport = TypeVar("Transport", bound="NomadTransport")


@dataclass(frozen=True)
class NomadSettings:
    """How to reach Nomad, checked once; `from_env` reads what the nomad CLI reads.

    Usage:
        NomadSettings.from_env(namespace="ml").namespace   # "ml" even if NOMAD_NAMESPACE says otherwise
    """

    address: str = DEFAULT_ADDR
    token: str | None = None
    token_source: str = "NOMAD_TOKEN"  # named in permission errors; never the token itself
    namespace: str = wire.DEFAULT_NAMESPACE
    region: str | None = None
    verify: bool | str = True  # True, a CA bundle path, or False (NOMAD_SKIP_VERIFY)
    client_cert: tuple[str, str] | None = None
    tls_server_name: str | None = None

    def __post_init__(self) -> None:
        if "://" not in self.address:
            raise NomadError(f"NOMAD_ADDR {self.address!r} needs a scheme: http://… or https://…")
        if self.client_cert is not None and not all(self.client_cert):
            raise NomadError("NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY go together; set both or neither")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, namespace: str | None = None, region: str | None = None
    ) -> NomadSettings:
        env = os.environ if env is None else env
        address = (env.get("NOMAD_ADDR") or DEFAULT_ADDR).rstrip("/")
        if "://" not in address:
            address = f"http://{address}"  # as the nomad CLI reads "127.0.0.1:4646"
        cert, key = env.get("NOMAD_CLIENT_CERT"), env.get("NOMAD_CLIENT_KEY")
        return cls(
            address=address,
            token=env.get("NOMAD_TOKEN") or None,
            namespace=wire.resolve_namespace(namespace, env),
            region=region or env.get("NOMAD_REGION") or None,
            verify=False if _skip_verify(env.get("NOMAD_SKIP_VERIFY", "")) else env.get("NOMAD_CACERT") or True,
            client_cert=(cert or "", key or "") if cert or key else None,
            tls_server_name=env.get("NOMAD_TLS_SERVER_NAME") or None,
        )

    def describe_token(self) -> str:
        if self.token:
            return f"the token in {self.token_source}"
        return f"no token ({self.token_source} is not set, so Nomad applied its anonymous policy)"


def _skip_verify(text: str) -> bool:
    value = text.strip().lower()
    if value in ("",) + _FALSE:
        return False
    if value in _TRUE:
        return True
    raise NomadError(f"NOMAD_SKIP_VERIFY={text!r} is not a boolean; write 1/true or 0/false")


class _ServerNameAdapter(requests.adapters.HTTPAdapter):
    """TLS to an address whose certificate is issued for another name (NOMAD_TLS_SERVER_NAME,
    e.g. server.global.nomad): that name is sent as SNI and checked against the certificate."""

    def __init__(self, server_name: str):
        self.server_name = server_name
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(server_hostname=self.server_name, assert_hostname=self.server_name)
        super().init_poolmanager(*args, **kwargs)


# ---- the one mapping from python-nomad's (and requests') exceptions to ours ------------------


def _cause(exc: BaseException) -> Any:
    """What went wrong underneath: a requests.Response (Nomad answered) or a requests error."""
    if isinstance(exc, nomad_exc.TimeoutNomadException):  # python-nomad's name for any stream connection error
        return exc.args[0] if exc.args else exc
    if isinstance(exc, nomad_exc.BaseNomadException):
        return exc.nomad_resp
    return exc


def is_read_pause(exc: BaseException) -> bool:
    """No bytes within the read timeout: before the response headers or in the body."""
    cause = _cause(exc)
    if isinstance(cause, requests.ReadTimeout):
        return True
    return isinstance(cause, requests.ConnectionError) and bool(cause.args) and isinstance(
        cause.args[0], urllib3.exceptions.ReadTimeoutError
    )


def nomad_error(exc: BaseException, settings: NomadSettings, what: str, needs: str) -> NomadError | UnreachableError:
    """Ours for one of python-nomad's (or, while a stream is read, requests') exceptions."""
    cause = _cause(exc)
    where = f"Nomad at {settings.address}"
    if isinstance(cause, requests.Response):
        message = cause.text.strip() or cause.reason or ""
        status = cause.status_code
        if status == 403:
            return NomadError(
                f"Nomad refused {what} (403 {message or 'Permission denied'}): {settings.describe_token()} "
                f"lacks the {needs} capability in namespace {settings.namespace!r}; "
                "grant it in the token's ACL policy or use a token that has it",
                status,
            )
        return NomadError(f"Nomad refused {what} ({status}): {message}", status)
    if isinstance(cause, requests.exceptions.SSLError):
        return NomadError(
            f"TLS with {where} failed ({what}): {_reason(cause)}; set NOMAD_CACERT to the CA that signed "
            "Nomad's certificate, NOMAD_TLS_SERVER_NAME to the name it was issued for "
            "(e.g. server.global.nomad), and NOMAD_CLIENT_CERT/NOMAD_CLIENT_KEY if Nomad asks for one"
        )
    if isinstance(cause, requests.Timeout) and not isinstance(cause, requests.ConnectTimeout):
        return UnreachableError(f"{where} did not answer in time ({what})")
    if isinstance(cause, (requests.ConnectionError, requests.ConnectTimeout)):
        return UnreachableError(f"cannot reach {where} ({what}); is it running? set NOMAD_ADDR")
    return NomadError(f"talking to {where} failed ({what}): {_reason(cause)}")


def _reason(error: Any) -> str:
    inner = error.args[0] if isinstance(error, Exception) and error.args else error
    return str(getattr(inner, "reason", None) or inner)


@contextlib.contextmanager
def translated(settings: NomadSettings, what: str, needs: str = "read-job") -> Iterator[None]:
    """Run python-nomad calls; raise NomadError / UnreachableError instead of their errors.

    `needs` is the ACL capability the call needs, named when Nomad answers 403.
    """
    try:
        yield
    except (nomad_exc.BaseNomadException, requests.RequestException) as exc:
        raise nomad_error(exc, settings, what, needs) from exc


# ---- the adapter ------------------------------------------------------------------------------


# ---- sending ----------------------------------------------------------------------------------


class NomadTransport:
    """One NomadSettings applied to every call: python-nomad's client built from them, and
    the sending of plain calls and blocking queries. `NomadAPI` (servers/nomad.py) adds
    the endpoints nomadtf uses."""

    def __init__(self, settings: NomadSettings | None = None):
        self.settings = settings or NomadSettings.from_env()
        session = requests.Session()
        if self.settings.tls_server_name:
            session.mount("https://", _ServerNameAdapter(self.settings.tls_server_name))
        self.client = nomad.Nomad(
            address=self.settings.address,
            token=self.settings.token,
            namespace=self.settings.namespace,
            region=self.settings.region,
            verify=self.settings.verify,  # python-nomad's own default is not to verify
            cert=self.settings.client_cert or (),
            timeout=CALL_TIMEOUT_S,
            session=session,
        )

    @classmethod
    def from_env(cls: type[Transport], namespace: str | None = None, region: str | None = None) -> Transport:
        return cls(NomadSettings.from_env(namespace=namespace, region=region))

    def in_namespace(self: Transport, namespace: str) -> Transport:
        return type(self)(replace(self.settings, namespace=namespace))

    @property
    def address(self) -> str:
        return self.settings.address

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    def ui_url(self, job_id: str) -> str:
        return f"{self.address}/ui/jobs/{job_id}@{self.namespace}"

    def _send(
        self,
        requester: Requester,
        *path: str,
        method: str = "get",
        params: dict[str, Any] | None = None,
        json: Any = None,
        stream: bool = False,
        timeout: Any = None,
    ) -> requests.Response:
        """One request through python-nomad's requester. Namespace and region go on every
        call, also on endpoints python-nomad would leave them off (evaluations, validate)."""
        query = {"namespace": self.settings.namespace, **(params or {})}
        if self.settings.region:
            query["region"] = self.settings.region
        with warnings.catch_warnings():
            if self.settings.verify is False:  # asked for with NOMAD_SKIP_VERIFY; no warning per call
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
            return requester.request(
                *path, method=method, params=query, json=json, stream=stream, timeout=timeout or CALL_TIMEOUT_S
            )

    def _json(self, what: str, needs: str, requester: Requester, *path: str, **kwargs: Any) -> Any:
        with translated(self.settings, what, needs):
            return self._send(requester, *path, **kwargs).json()

    def _blocking(
        self, what: str, requester: Requester, *path: str, index: int, wait_s: float, params: dict[str, Any] | None = None
    ) -> tuple[Any, int]:
        """A blocking query: Nomad answers as soon as something changes, or after `wait_s`
        (plus up to 1/16 jitter). Returns (body or None when not found, X-Nomad-Index)."""
        params = {**(params or {}), "index": index, "wait": f"{wait_s:g}s"}
        try:
            with translated(self.settings, what):
                resp = self._send(requester, *path, params=params, timeout=wait_s * 1.1 + CALL_TIMEOUT_S)
        except NomadError as exc:
            if exc.status == 404:
                return None, index
            raise
        return resp.json(), int(resp.headers.get("X-Nomad-Index", index))
