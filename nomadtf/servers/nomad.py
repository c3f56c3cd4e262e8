"""The Nomad adapter: every Nomad HTTP call nomadtf makes, through python-nomad, each with
the ACL capability it needs (named when Nomad answers 403). How Nomad is reached, and the
one mapping of python-nomad's exceptions to ours, are `nomadhttp.py`'s.

Usage:
    api = NomadAPI.from_env(namespace="ml", region="global")
    api.validate(job)                      # Nomad's warnings
    api.register(job).eval_id
    allocs, index = api.watch_allocations("digits", index=0)
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Mapping
from typing import Any

import nomad.api.exceptions as nomad_exc
import requests

from nomadtf.errors import NomadError
from nomadtf.job import capacity
from nomadtf.job.answers import (
    Allocation,
    Evaluation,
    Job,
    JobStub,
    JobWrite,
    Node,
    PlanResult,
    ScalingEvent,
    TaskState,
)
from nomadtf.servers.nomadhttp import NomadTransport, is_read_pause, translated

# A follow stream stays open after its task ended; pausing this long without bytes is our
# cue to ask whether the task is dead.
STREAM_TIMEOUT_S = (5.0, 2.0)


class NomadAPI(NomadTransport):
    """Nomad's HTTP API as nomadtf uses it (the sending, one NomadSettings for every call: nomadhttp.py).
    Usage:
        api = NomadAPI.from_env(namespace=spec.namespace, region=spec.region)
        api.job("digits")            # None when there is no such job
        api.in_namespace("*").jobs()  # every namespace the token may list
    """

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

    def plan(self, job: dict[str, Any]) -> PlanResult:
        """POST /v1/job/:job_id/plan (with diff)"""
        job_id = job["Job"]["ID"]
        body = {**job, "Diff": True}
        return PlanResult.from_api(self._json("the plan", "submit-job", self.client.job, job_id, "plan", method="post", json=body))

    def register(self, job: dict[str, Any], modify_index: int | None = None) -> JobWrite:
        """POST /v1/jobs ; with `modify_index` a check-and-set: Nomad registers only while the
        job's JobModifyIndex is still that (0: only while there is no such job), so of two
        submissions that read the same job exactly one goes through.
        NomadError(status 409 here) for the other."""
        body = dict(job)
        if modify_index is not None:
            body.update(EnforceIndex=True, JobModifyIndex=modify_index)
        try:
            return JobWrite.from_api(self._json(f"submitting job {job['Job']['ID']}", "submit-job", self.client.jobs, method="post", json=body))
        except NomadError as exc:
            if modify_index is not None and "enforcing job modify index" in str(exc).lower():
                raise NomadError(str(exc), status=409) from exc
            raise

    def job(self, job_id: str) -> Job | None:
        """GET /v1/job/:job_id ; None when there is no such job."""
        try:
            return Job.from_api(self._json(f"job {job_id}", "read-job", self.client.job, job_id))
        except NomadError as exc:
            if exc.status == 404:
                return None
            raise

    def watch_job(self, job_id: str, index: int, wait_s: float = 10.0) -> tuple[Job | None, int]:
        """GET /v1/job/:job_id?index=&wait= (blocking: answers when this job changes) ; (None when no such job, index)"""
        job, index = self._blocking(f"job {job_id}", self.client.job, job_id, index=index, wait_s=wait_s)
        return (None if job is None else Job.from_api(job)), index

    def jobs(self) -> list[JobStub]:
        """GET /v1/jobs?meta=true (namespace "*": every namespace the token may list)"""
        return [JobStub.from_api(j) for j in self._json("the job list", "list-jobs", self.client.jobs, params={"meta": "true"})]

    def versions(self, job_id: str) -> list[Job]:
        """GET /v1/job/:job_id/versions ; newest first"""
        data = self._json(f"versions of {job_id}", "read-job", self.client.job, job_id, "versions")
        return [Job.from_api(version) for version in data.get("Versions") or []]

    def watch_jobs(self, index: int = 0, wait_s: float = 5.0) -> tuple[list[JobStub], int]:
        """(every job the token may list, with Meta and summaries; X-Nomad-Index); with
        `index` a blocking query that answers on the next change of any job or summary.

        GET /v1/jobs?meta=true[&index=&wait=]"""
        if index:
            stubs, new_index = self._blocking("the job list", self.client.jobs, index=index, wait_s=wait_s, params={"meta": "true"})
            return [JobStub.from_api(j) for j in stubs or []], new_index
        with translated(self.settings, "the job list", "list-jobs"):
            resp = self._send(self.client.jobs, params={"meta": "true"})
        return [JobStub.from_api(j) for j in resp.json()], int(resp.headers.get("X-Nomad-Index", 0))

    def scale(
        self, job_id: str, group: str, count: int, message: str, modify_index: int = 0, meta: Mapping[str, str] | None = None
    ) -> JobWrite:
        """POST /v1/job/:job_id/scale ; with `modify_index` Nomad scales only while the job's
        JobModifyIndex is still that (NomadError with status 409 otherwise)."""
        body: dict[str, Any] = {"Count": count, "Target": {"Group": group}, "Message": message}
        if modify_index:
            body["JobModifyIndex"] = modify_index
        if meta:
            body["Meta"] = dict(meta)
        try:
            return JobWrite.from_api(self._json(f"scaling {job_id}", "scale-job", self.client.job, job_id, "scale", method="post", json=body))
        except NomadError as exc:
            if modify_index and "conflicting job modify index" in str(exc).lower():
                raise NomadError(str(exc), status=409) from exc
            raise

    def scaling_events(self, job_id: str) -> dict[str, list[ScalingEvent]]:
        """Each group's scaling events, newest first (what the admission controller said).

        GET /v1/job/:job_id/scale"""
        data = self._json(f"scaling status of {job_id}", "read-job-scaling", self.client.job, job_id, "scale")
        return {group: [ScalingEvent.from_api(e) for e in status.get("Events") or []] for group, status in (data.get("TaskGroups") or {}).items()}

    def stop(self, job_id: str, purge: bool = False) -> JobWrite:
        """DELETE /v1/job/:job_id?purge="""
        params = {"purge": "true"} if purge else {}
        return JobWrite.from_api(self._json(f"stopping {job_id}", "submit-job", self.client.job, job_id, method="delete", params=params))

    # ---- the cluster: nodes, every namespace's allocations -------------------------------

    def nodes(self) -> list[Node]:
        """Every client node with what it offers allocations.  GET /v1/nodes?resources=true"""
        return [Node.from_api(n) for n in self._json("the node list", "node:read", self.client.nodes, params={"resources": "true"})]

    def cluster_allocations(self, index: int = 0, wait_s: float = 30.0, holding_only: bool = False) -> tuple[list[Allocation], int]:
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
            return [Allocation.from_api(a) for a in allocs or []], new_index
        with translated(self.settings, "the allocation list", "read-job"):
            resp = self._send(self.client.allocations, params=params)
        return [Allocation.from_api(a) for a in resp.json()], int(resp.headers.get("X-Nomad-Index", 0))

    def put_variable(self, path: str, items: Mapping[str, str]) -> None:
        """Write a Nomad variable in this namespace (a job's tasks may read `nomad/jobs/<job>`
        through their workload identity).  PUT /v1/var/:path"""
        body = {"Namespace": self.namespace, "Path": path, "Items": dict(items)}
        self._json(f"the variable {path}", "variables write", self.client.variable, path, method="put", json=body)

    def namespaces(self) -> list[str]:
        """The namespaces the token may use (Nomad lists no others).  GET /v1/namespaces"""
        return [ns["Name"] for ns in self._json("the namespace list", "read-job", self.client.namespaces)]

    # ---- allocations and evaluations ------------------------------------------------------

    def allocations(self, job_id: str) -> list[Allocation]:
        """GET /v1/job/:job_id/allocations"""
        return [Allocation.from_api(a) for a in self._json(f"allocations of {job_id}", "read-job", self.client.job, job_id, "allocations")]

    def watch_allocations(self, job_id: str, index: int, wait_s: float = 5.0) -> tuple[list[Allocation], int]:
        """GET /v1/job/:job_id/allocations?index=&wait= (blocking) ; ([] when no such job, index)"""
        allocs, index = self._blocking(f"allocations of {job_id}", self.client.job, job_id, "allocations", index=index, wait_s=wait_s)
        return [Allocation.from_api(a) for a in allocs or []], index

    def allocation(self, alloc_id: str) -> Allocation:
        """GET /v1/allocation/:alloc_id"""
        return Allocation.from_api(self._json(f"allocation {alloc_id[:8]}", "read-job", self.client.allocation, alloc_id))

    def stop_allocation(self, alloc_id: str) -> None:
        """POST /v1/allocation/:alloc_id/stop"""
        self._json(
            f"stopping allocation {alloc_id[:8]}", "alloc-lifecycle", self.client.allocation, alloc_id, "stop", method="post"
        )

    def signal_allocation(self, alloc_id: str, signal: str) -> None:
        """`signal` to every task of the allocation (the admission controller's checkpoint
        request before a preemption).  POST /v1/client/allocation/:alloc_id/signal"""
        with translated(self.settings, f"signalling allocation {alloc_id[:8]}", "alloc-lifecycle"):
            self._send(self.client.client.allocation, alloc_id, "signal", method="post", json={"Signal": signal, "Task": None})

    def evaluations(self, job_id: str) -> list[Evaluation]:
        """GET /v1/job/:job_id/evaluations"""
        return [Evaluation.from_api(e) for e in self._json(f"evaluations of {job_id}", "read-job", self.client.job, job_id, "evaluations")]

    def watch_evaluation(self, eval_id: str, index: int, wait_s: float = 5.0) -> tuple[Evaluation | None, int]:
        """GET /v1/evaluation/:eval_id?index=&wait= (blocking) ; (None while not found, index)"""
        evaluation, index = self._blocking(f"evaluation {eval_id[:8]}", self.client.evaluation, eval_id, index=index, wait_s=wait_s)
        return (Evaluation.from_api(evaluation) if evaluation is not None else None), index

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
                    if not is_read_pause(exc):
                        raise
            state = self.allocation(alloc_id).task_states.get(task, TaskState()).state
            if state == "dead":
                rest = self.logs(alloc_id, task, stream, origin="start", offset=received)
                yield rest + decoder.decode(b"", final=True)
                return
