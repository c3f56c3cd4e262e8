"""Thin adapter over python-nomad. The one place that maps its exceptions to ours.

Honours NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION, NOMAD_CACERT,
NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY like the nomad CLI.

Usage:
    api = NomadAPI.from_env()
    api.validate(job)["Warnings"]
    api.register(job)["EvalID"]
"""

from __future__ import annotations

import codecs
import contextlib
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import nomad
import nomad.api.exceptions as nomad_exc
import requests

from nomadtf.errors import NomadError, UnreachableError

DEFAULT_ADDR = "http://127.0.0.1:4646"
META_VERSION = "nomadtf.version"


def _describe(exc: nomad_exc.BaseNomadException) -> tuple[str, int | None]:
    resp = getattr(exc, "nomad_resp", None)
    if isinstance(resp, requests.Response):
        return resp.text.strip() or resp.reason, resp.status_code
    return str(resp or exc), None


@contextlib.contextmanager
def translated(address: str, what: str) -> Iterator[None]:
    """Run a python-nomad call; raise UnreachableError / NomadError instead of its errors."""
    try:
        yield
    except (nomad_exc.TimeoutNomadException, requests.ConnectionError) as exc:
        raise UnreachableError(f"cannot reach Nomad at {address} ({what}); is it running? set NOMAD_ADDR") from exc
    except nomad_exc.BaseNomadException as exc:
        message, status = _describe(exc)
        if status is None and "Connection" in message:
            raise UnreachableError(f"cannot reach Nomad at {address} ({what}); is it running? set NOMAD_ADDR") from exc
        raise NomadError(f"Nomad refused {what}: {message}", status) from exc


class NomadAPI:
    def __init__(self, address: str | None = None):
        self.address = address or os.environ.get("NOMAD_ADDR") or DEFAULT_ADDR
        parsed = urlparse(self.address if "://" in self.address else f"http://{self.address}")
        verify: Any = os.environ.get("NOMAD_CACERT") or True
        cert = ()
        if os.environ.get("NOMAD_CLIENT_CERT") and os.environ.get("NOMAD_CLIENT_KEY"):
            cert = (os.environ["NOMAD_CLIENT_CERT"], os.environ["NOMAD_CLIENT_KEY"])
        self.client = nomad.Nomad(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 4646,
            secure=parsed.scheme == "https",
            address=f"{parsed.scheme}://{parsed.netloc}",
            verify=verify,
            cert=cert,
            timeout=10,
        )

    @classmethod
    def from_env(cls) -> NomadAPI:
        return cls()

    def ui_url(self, job_id: str, namespace: str = "default") -> str:
        return f"{self.address.rstrip('/')}/ui/jobs/{job_id}@{namespace}"

    def validate(self, job: dict[str, Any]) -> list[str]:
        """Nomad's own validation; raises NomadError listing every problem, returns warnings.

        POST /v1/validate/job
        """
        with translated(self.address, "job validation"):
            result = self.client.validate.validate_job(job).json()
        errors = result.get("ValidationErrors") or ([result["Error"]] if result.get("Error") else [])
        if errors:
            raise NomadError("Nomad rejected the job; nothing was submitted:\n  " + "\n  ".join(errors))
        return [w for w in (result.get("Warnings") or "").split("\n") if w.strip()]

    def plan(self, job: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/job/:job_id/plan (with diff)"""
        with translated(self.address, "the plan"):
            return self.client.job.plan_job(job["Job"]["ID"], job, diff=True)

    def register(self, job: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/jobs"""
        with translated(self.address, "the job"):
            return self.client.jobs.register_job(job)

    def job(self, job_id: str) -> dict[str, Any] | None:
        """GET /v1/job/:job_id ; None when there is no such job."""
        try:
            with translated(self.address, f"job {job_id}"):
                return self.client.job.get_job(job_id)
        except NomadError as exc:
            if exc.status == 404:
                return None
            raise

    def jobs(self) -> list[dict[str, Any]]:
        """GET /v1/jobs?meta=true"""
        with translated(self.address, "the job list"):
            resp = self.client.jobs.request(method="get", params={"meta": "true"})
            return resp.json()

    def allocations(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/job/:job_id/allocations"""
        with translated(self.address, f"allocations of {job_id}"):
            return self.client.job.get_allocations(job_id)

    def allocation(self, alloc_id: str) -> dict[str, Any]:
        """GET /v1/allocation/:alloc_id"""
        with translated(self.address, f"allocation {alloc_id[:8]}"):
            return self.client.allocation.get_allocation(alloc_id)

    def evaluations(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/job/:job_id/evaluations"""
        with translated(self.address, f"evaluations of {job_id}"):
            return self.client.job.get_evaluations(job_id)

    def summary(self, job_id: str) -> dict[str, Any]:
        """GET /v1/job/:job_id/summary"""
        with translated(self.address, f"summary of {job_id}"):
            return self.client.job.get_summary(job_id)

    def stop(self, job_id: str, purge: bool = False) -> dict[str, Any]:
        """DELETE /v1/job/:job_id"""
        with translated(self.address, f"stopping {job_id}"):
            return self.client.job.deregister_job(job_id, purge=purge)

    def stop_allocation(self, alloc_id: str) -> dict[str, Any]:
        """POST /v1/allocation/:alloc_id/stop"""
        with translated(self.address, f"stopping allocation {alloc_id[:8]}"):
            return self.client.allocation.stop_allocation(alloc_id)

    def logs(self, alloc_id: str, task: str, stream: str = "stdout", origin: str = "start", offset: int = 0) -> str:
        """GET /v1/client/fs/logs/:alloc_id?task=&type=&plain=true"""
        with translated(self.address, f"logs of {alloc_id[:8]}"):
            return self.client.client.stream_logs.stream(
                alloc_id, task, stream, follow=False, origin=origin, offset=offset, plain=True
            )

    def follow_logs(self, alloc_id: str, task: str, stream: str = "stdout") -> Iterator[str]:
        """Stream a task's log until the task is dead.

        GET /v1/client/fs/logs/:alloc_id?follow=true&plain=true&offset=<bytes seen>
        Nomad keeps a follow stream open after the task ends, so the stream is read with a
        short read timeout; at each pause we ask whether the task is dead, reconnecting at
        the byte offset we reached otherwise.
        """
        url = f"{self.address.rstrip('/')}/v1/client/fs/logs/{alloc_id}"
        headers = {"X-Nomad-Token": os.environ["NOMAD_TOKEN"]} if os.environ.get("NOMAD_TOKEN") else {}
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        received = 0
        while True:
            params = {"task": task, "type": stream, "follow": "true", "plain": "true", "origin": "start", "offset": received}
            try:
                with requests.get(url, params=params, headers=headers, stream=True, timeout=(5, 2)) as resp:
                    if resp.status_code != 200:
                        raise NomadError(f"Nomad answered {resp.status_code} for logs of {alloc_id[:8]}: {resp.text.strip()}", resp.status_code)
                    for chunk in resp.iter_content(chunk_size=None):
                        received += len(chunk)
                        yield decoder.decode(chunk)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if "Read timed out" not in str(exc) and not isinstance(exc, requests.ReadTimeout):
                    raise UnreachableError(f"cannot reach Nomad at {self.address}: {exc.__class__.__name__}") from exc
            state = ((self.allocation(alloc_id).get("TaskStates") or {}).get(task) or {}).get("State")
            if state == "dead":
                rest = self.logs(alloc_id, task, stream, origin="start", offset=received)
                yield rest + decoder.decode(b"", final=True)
                return

    def blocking(self, path: str, index: int, wait: str = "10s", **params: Any) -> tuple[Any, int]:
        """GET /v1/<path>?index=&wait= ; returns (body, X-Nomad-Index).

        A blocking query: Nomad answers as soon as something changes, or after `wait`.
        """
        url = f"{self.address.rstrip('/')}/v1/{path}"
        headers = {"X-Nomad-Token": os.environ["NOMAD_TOKEN"]} if os.environ.get("NOMAD_TOKEN") else {}
        wait_s = float(wait.rstrip("s"))
        try:
            resp = requests.get(
                url,
                params={"index": index, "wait": wait, **params},
                headers=headers,
                timeout=wait_s + 10,
                verify=self.client.verify,
                cert=self.client.cert or None,
            )
        except requests.RequestException as exc:
            raise UnreachableError(f"cannot reach Nomad at {self.address}: {exc.__class__.__name__}") from exc
        if resp.status_code == 404:
            return None, index
        if resp.status_code != 200:
            raise NomadError(f"Nomad answered {resp.status_code} for {path}: {resp.text.strip()}", resp.status_code)
        return resp.json(), int(resp.headers.get("X-Nomad-Index", index))
