"""The Nomad adapter: every Nomad HTTP call goes through python-nomad, and this is the one
place that maps python-nomad's exceptions to ours.

Where and how to reach Nomad comes from the nomad CLI's environment variables, read once
into `NomadSettings` and applied to every call alike (plain calls, blocking queries, log
streams): NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT,
NOMAD_CLIENT_CERT + NOMAD_CLIENT_KEY, NOMAD_TLS_SERVER_NAME and NOMAD_SKIP_VERIFY.
A caller that knows better (a job.json names its namespace and region) passes them.

Usage:
    api = NomadAPI.from_env(namespace="ml", region="global")
    api.validate(job)                      # Nomad's warnings
    api.register(job)["EvalID"]
    allocs, index = api.watch_allocations("digits", index=0)
"""

from __future__ import annotations

import codecs
import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import nomad
import nomad.api.exceptions as nomad_exc
import requests
import requests.adapters
import urllib3.exceptions
from nomad.api.base import Requester

from nomadtf import wire
from nomadtf.errors import NomadError, UnreachableError
from nomadtf.job import capacity

DEFAULT_ADDR = "http://127.0.0.1:4646"
CALL_TIMEOUT_S = 10.0
# A follow stream stays open after its task ended; pausing this long without bytes is our
# cue to ask whether the task is dead.
STREAM_TIMEOUT_S = (5.0, 2.0)
_TRUE = ("1", "t", "true")  # what Go's strconv.ParseBool accepts, as the nomad CLI reads it
_FALSE = ("0", "f", "false")


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


def _is_read_pause(exc: BaseException) -> bool:
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


class NomadAPI:
    """Nomad's HTTP API as nomadtf uses it, with one NomadSettings applied to every call.

    Usage:
        api = NomadAPI.from_env(namespace=spec.namespace, region=spec.region)
        api.job("digits")            # None when there is no such job
        api.in_namespace("*").jobs()  # every namespace the token may list
    """

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
    def from_env(cls, namespace: str | None = None, region: str | None = None) -> NomadAPI:
        return cls(NomadSettings.from_env(namespace=namespace, region=region))

    def in_namespace(self, namespace: str) -> NomadAPI:
        return NomadAPI(replace(self.settings, namespace=namespace))

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

    # ---- the agent ----------------------------------------------------------------------------

    def agent_version(self) -> str:
        """The Nomad version of the agent at NOMAD_ADDR, as it prints it ("1.6.1",
        "1.10.0-beta.1"): what a job is rendered for (target.py). Needs agent:read under ACLs.

        GET /v1/agent/self
        """
        data = self._json("reading the agent's version", "agent:read", self.client.agent, "self")
        version = ((data.get("config") or {}).get("Version") or {})
        text = version.get("Version") or ((data.get("member") or {}).get("Tags") or {}).get("build", "")
        if not text:
            raise NomadError("Nomad's /v1/agent/self named no version")
        prerelease = version.get("VersionPrerelease")
        return f"{text}-{prerelease}" if prerelease and "-" not in text else text

    def server_versions(self) -> list[str]:
        """The Nomad version of every server of the answering agent's region that is alive, as
        its gossip tags say ("build": "1.6.1"): what a job is rendered for when the agent refuses /v1/agent/self. Needs
        only node:read under ACLs, which admission needs as well.

        GET /v1/agent/members
        """
        data = self._json("reading the servers' versions", "node:read", self.client.agent, "members") or {}
        # Server gossip spans every federated region: only this region's servers decide.
        region = data.get("ServerRegion") or ""
        return [
            member["Tags"]["build"]
            for member in data.get("Members") or []
            if member.get("Status") == "alive" and (member.get("Tags") or {}).get("build")
            and (not region or member["Tags"].get("region", region) == region)
        ]

    # ---- jobs -----------------------------------------------------------------------------

    def validate(self, job: dict[str, Any]) -> list[str]:
        """Nomad's own validation; raises NomadError listing every problem, returns warnings.

        POST /v1/validate/job
        """
        result = self._json("job validation", "read-job", self.client.validate, "job", method="post", json=job)
        errors = result.get("ValidationErrors") or ([result["Error"]] if result.get("Error") else [])
        if errors:
            raise NomadError("Nomad rejected the job; nothing was submitted:\n  " + "\n  ".join(errors))
        return [w for w in (result.get("Warnings") or "").split("\n") if w.strip()]

    def plan(self, job: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/job/:job_id/plan (with diff)"""
        job_id = job["Job"]["ID"]
        body = {**job, "Diff": True}
        return self._json("the plan", "submit-job", self.client.job, job_id, "plan", method="post", json=body)

    def register(self, job: dict[str, Any], modify_index: int | None = None) -> dict[str, Any]:
        """POST /v1/jobs ; with `modify_index` a check-and-set: Nomad registers only while the
        job's JobModifyIndex is still that (0: only while there is no such job), so of two
        submissions that read the same job exactly one goes through.
        NomadError(status 409 here) for the other."""
        body = dict(job)
        if modify_index is not None:
            body.update(EnforceIndex=True, JobModifyIndex=modify_index)
        try:
            return self._json(f"submitting job {job['Job']['ID']}", "submit-job", self.client.jobs, method="post", json=body)
        except NomadError as exc:
            if modify_index is not None and "enforcing job modify index" in str(exc).lower():
                raise NomadError(str(exc), status=409) from exc
            raise

    def job(self, job_id: str) -> dict[str, Any] | None:
        """GET /v1/job/:job_id ; None when there is no such job."""
        try:
            return self._json(f"job {job_id}", "read-job", self.client.job, job_id)
        except NomadError as exc:
            if exc.status == 404:
                return None
            raise

    def watch_job(self, job_id: str, index: int, wait_s: float = 10.0) -> tuple[dict[str, Any] | None, int]:
        """GET /v1/job/:job_id?index=&wait= (blocking: answers when this job changes) ; (None when no such job, index)"""
        return self._blocking(f"job {job_id}", self.client.job, job_id, index=index, wait_s=wait_s)

    def jobs(self) -> list[dict[str, Any]]:
        """GET /v1/jobs?meta=true (namespace "*": every namespace the token may list)"""
        return self._json("the job list", "list-jobs", self.client.jobs, params={"meta": "true"})

    def versions(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/job/:job_id/versions ; newest first"""
        data = self._json(f"versions of {job_id}", "read-job", self.client.job, job_id, "versions")
        return data.get("Versions") or []

    def summary(self, job_id: str) -> dict[str, Any]:
        """GET /v1/job/:job_id/summary"""
        return self._json(f"summary of {job_id}", "read-job", self.client.job, job_id, "summary")

    def watch_jobs(self, index: int = 0, wait_s: float = 5.0) -> tuple[list[dict[str, Any]], int]:
        """(every job the token may list, with Meta and summaries; X-Nomad-Index); with
        `index` a blocking query that answers on the next change of any job or summary.

        GET /v1/jobs?meta=true[&index=&wait=]"""
        if index:
            stubs, new_index = self._blocking("the job list", self.client.jobs, index=index, wait_s=wait_s, params={"meta": "true"})
            return stubs or [], new_index
        with translated(self.settings, "the job list", "list-jobs"):
            resp = self._send(self.client.jobs, params={"meta": "true"})
        return resp.json(), int(resp.headers.get("X-Nomad-Index", 0))

    def scale(
        self, job_id: str, group: str, count: int, message: str, modify_index: int = 0, meta: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """POST /v1/job/:job_id/scale ; with `modify_index` Nomad scales only while the job's
        JobModifyIndex is still that (NomadError with status 409 otherwise)."""
        body: dict[str, Any] = {"Count": count, "Target": {"Group": group}, "Message": message}
        if modify_index:
            body["JobModifyIndex"] = modify_index
        if meta:
            body["Meta"] = dict(meta)
        try:
            return self._json(f"scaling {job_id}", "scale-job", self.client.job, job_id, "scale", method="post", json=body)
        except NomadError as exc:
            if modify_index and "conflicting job modify index" in str(exc).lower():
                raise NomadError(str(exc), status=409) from exc
            raise

    def scaling_events(self, job_id: str) -> dict[str, list[dict[str, Any]]]:
        """Each group's scaling events, newest first (what the admission controller said).

        GET /v1/job/:job_id/scale"""
        data = self._json(f"scaling status of {job_id}", "read-job-scaling", self.client.job, job_id, "scale")
        return {group: list(status.get("Events") or []) for group, status in (data.get("TaskGroups") or {}).items()}

    def stop(self, job_id: str, purge: bool = False) -> dict[str, Any]:
        """DELETE /v1/job/:job_id?purge="""
        params = {"purge": "true"} if purge else {}
        return self._json(f"stopping {job_id}", "submit-job", self.client.job, job_id, method="delete", params=params)

    # ---- the cluster: nodes, every namespace's allocations -------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        """Every client node with its resources and what its operator reserved.

        GET /v1/nodes?resources=true"""
        return self._json("the node list", "node:read", self.client.nodes, params={"resources": "true"})

    def cluster_allocations(self, index: int = 0, wait_s: float = 30.0, holding_only: bool = False) -> tuple[list[dict[str, Any]], int]:
        """(allocations with their resources, X-Nomad-Index) in every namespace the token
        may read; with `index` a blocking query that answers on the next change of any;
        `holding_only`: only those whose client status holds resources (Nomad filters: the
        answer does not grow with the finished allocations the cluster keeps until its GC).

        GET /v1/allocations?namespace=*&resources=true&task_states=false[&filter=][&index=&wait=]"""
        params = {"namespace": "*", "resources": "true", "task_states": "false"}
        if holding_only:
            params["filter"] = " or ".join(f'ClientStatus == "{state}"' for state in capacity.HOLDING_CLIENT_STATES)
        if index:
            allocs, new_index = self._blocking("the allocation list", self.client.allocations, index=index, wait_s=wait_s, params=params)
            return allocs or [], new_index
        with translated(self.settings, "the allocation list", "read-job"):
            resp = self._send(self.client.allocations, params=params)
        return resp.json(), int(resp.headers.get("X-Nomad-Index", 0))

    def put_variable(self, path: str, items: Mapping[str, str]) -> dict[str, Any]:
        """Write a Nomad variable in this namespace (a job's tasks may read `nomad/jobs/<job>`
        through their workload identity).  PUT /v1/var/:path"""
        body = {"Namespace": self.namespace, "Path": path, "Items": dict(items)}
        return self._json(f"the variable {path}", "variables write", self.client.variable, path, method="put", json=body)

    def namespaces(self) -> list[str]:
        """The namespaces the token may use (Nomad lists no others).  GET /v1/namespaces"""
        return [ns["Name"] for ns in self._json("the namespace list", "read-job", self.client.namespaces)]

    # ---- allocations and evaluations ------------------------------------------------------

    def allocations(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/job/:job_id/allocations"""
        return self._json(f"allocations of {job_id}", "read-job", self.client.job, job_id, "allocations")

    def watch_allocations(self, job_id: str, index: int, wait_s: float = 5.0) -> tuple[list[dict[str, Any]], int]:
        """GET /v1/job/:job_id/allocations?index=&wait= (blocking) ; ([] when no such job, index)"""
        allocs, index = self._blocking(f"allocations of {job_id}", self.client.job, job_id, "allocations", index=index, wait_s=wait_s)
        return allocs or [], index

    def allocation(self, alloc_id: str) -> dict[str, Any]:
        """GET /v1/allocation/:alloc_id"""
        return self._json(f"allocation {alloc_id[:8]}", "read-job", self.client.allocation, alloc_id)

    def stop_allocation(self, alloc_id: str) -> dict[str, Any]:
        """POST /v1/allocation/:alloc_id/stop"""
        return self._json(
            f"stopping allocation {alloc_id[:8]}", "alloc-lifecycle", self.client.allocation, alloc_id, "stop", method="post"
        )

    def signal_allocation(self, alloc_id: str, signal: str) -> None:
        """`signal` to every task of the allocation (the admission controller's checkpoint
        request before a preemption).  POST /v1/client/allocation/:alloc_id/signal"""
        with translated(self.settings, f"signalling allocation {alloc_id[:8]}", "alloc-lifecycle"):
            self._send(self.client.client.allocation, alloc_id, "signal", method="post", json={"Signal": signal, "Task": None})

    def evaluations(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/job/:job_id/evaluations"""
        return self._json(f"evaluations of {job_id}", "read-job", self.client.job, job_id, "evaluations")

    def watch_evaluation(self, eval_id: str, index: int, wait_s: float = 5.0) -> tuple[dict[str, Any] | None, int]:
        """GET /v1/evaluation/:eval_id?index=&wait= (blocking) ; (None while not found, index)"""
        return self._blocking(f"evaluation {eval_id[:8]}", self.client.evaluation, eval_id, index=index, wait_s=wait_s)

    # ---- logs -----------------------------------------------------------------------------

    def logs(self, alloc_id: str, task: str, stream: str = "stdout", origin: str = "start", offset: int = 0) -> str:
        """GET /v1/client/fs/logs/:alloc_id?task=&type=&origin=&offset=&plain=true"""
        params = {"task": task, "type": stream, "origin": origin, "offset": offset, "plain": "true"}
        with translated(self.settings, f"logs of {alloc_id[:8]}", "read-logs"):
            return self._send(self.client.client.stream_logs, alloc_id, params=params).text

    def follow_logs(self, alloc_id: str, task: str, stream: str = "stdout") -> Iterator[str]:
        """Stream a task's log until the task is dead.

        GET /v1/client/fs/logs/:alloc_id?follow=true&plain=true&offset=<bytes seen> ;
        GET /v1/allocation/:alloc_id at each pause.
        Nomad keeps a follow stream open after the task ends, so the stream is read with a
        short read timeout; at each pause we ask whether the task is dead, reconnecting at
        the byte offset we reached otherwise.
        """
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        received = 0
        while True:
            params = {"task": task, "type": stream, "follow": "true", "plain": "true", "origin": "start", "offset": received}
            with translated(self.settings, f"logs of {alloc_id[:8]}", "read-logs"):
                try:
                    with self._send(
                        self.client.client.stream_logs, alloc_id, params=params, stream=True, timeout=STREAM_TIMEOUT_S
                    ) as resp:
                        for chunk in resp.iter_content(chunk_size=None):
                            received += len(chunk)
                            yield decoder.decode(chunk)
                except (nomad_exc.BaseNomadException, requests.RequestException) as exc:
                    if not _is_read_pause(exc):
                        raise
            state = ((self.allocation(alloc_id).get("TaskStates") or {}).get(task) or {}).get("State")
            if state == "dead":
                rest = self.logs(alloc_id, task, stream, origin="start", offset=received)
                yield rest + decoder.decode(b"", final=True)
                return
