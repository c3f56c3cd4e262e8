"""Reading runs back for `status` and `logs`: nomadtf's jobs in a namespace, one job's
report (its run, its outcome as recorded, its environments), the allocations whose logs a
command shows, a run's last lines. Asks Nomad through `NomadAPI`; prints nothing.

Usage:
    [(state.job, state.view) for state in nomadtf_jobs(api)]
    report = job_report(api, "digits", discovery_for)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nomadtf.client.runview import JobView, deciding_alloc, of_run, summarize, versions_of_run
from nomadtf.errors import (
    JobFailed,
    JobNotFound,
    NoAllocation,
    ServerError,
)
from nomadtf.job import outcome as outcomes
from nomadtf.job.answers import Allocation, Job
from nomadtf.job.outcome import RunOutcome
from nomadtf.servers.nomad import NomadAPI
from nomadtf.wire import META_VERSION

# ---- reading jobs back ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobState:
    """A nomadtf job as Nomad records it, also when nobody followed it; `allocs` are its
    current run's."""

    job: Job
    allocs: list[Allocation]

    @property
    def run_id(self) -> str:
        return self.job.run_id

    @property
    def view(self) -> JobView:
        return summarize(self.job, self.allocs)


def nomadtf_jobs(api: NomadAPI) -> list[JobState]:
    """The jobs that carry our Meta (never matched by name) in the API's namespace ("*": all).

    GET /v1/jobs?meta=true, then GET /v1/job/:id and GET /v1/job/:id/allocations for the
    ones that may be ours, each in its own namespace
    """
    states = []
    for stub in api.jobs():
        if stub.meta is not None and META_VERSION not in stub.meta:
            continue  # Nomad listed its Meta and it is not ours: no need to fetch it
        scoped = api.in_namespace(stub.namespace)
        job = scoped.job(stub.id)
        if job and job.ours:
            states.append(JobState(job, run_allocations(scoped, job)))
    return states


@dataclass(frozen=True)
class JobReport:
    """What `nomadtf status JOB` shows: the current run, its roles, progress and outcome."""

    state: JobState
    elapsed_s: float
    progress: dict[str, Any] | None
    recorded: str | None  # "succeeded", "failed: <why>", None while running (or unknown)
    consul_error: str = ""
    outcome: RunOutcome | None = None  # None while the run goes on (or cannot be told)
    runs: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # what the children run -> the tasks


def runs_of(environments: dict[tuple[str, int], dict[str, Any]]) -> dict[str, list[tuple[str, int]]]:
    """What the tasks' children run (their Python and TensorFlow), each line with the tasks
    that said it. Pure."""
    out: dict[str, list[tuple[str, int]]] = {}
    for slot, status in sorted(environments.items()):
        if status.get("runs"):
            out.setdefault(status["runs"], []).append(slot)
    return out


def describe_runs(line: str, slots: list[tuple[str, int]]) -> str:
    """`runs Python 3.11.2 (…), tensorflow-cpu 2.21.0  (chief 1, ps 1, worker 2)`. Pure."""
    counts = Counter(role for role, _index in slots)
    return f"runs {line}  (" + ", ".join(f"{role} {n}" for role, n in counts.items()) + ")"


def reschedule_attempts_of(job: Mapping[str, Any]) -> int:
    """The reschedule attempts the rendered job gives its groups (the same for every group
    nomadtf renders). Pure."""
    attempts = [(g.get("ReschedulePolicy") or {}).get("Attempts", 0) or 0 for g in job.get("TaskGroups") or []]
    return max(attempts, default=0)


def run_elapsed(allocs: list[Allocation], running: bool, now_ns: int) -> float:
    """Seconds from the run's first allocation to now (running) or to its last change. Pure."""
    if not allocs:
        return 0.0
    start = min(a.create_time or now_ns for a in allocs)
    end = now_ns if running else max(a.modify_time or now_ns for a in allocs)
    return max(0.0, (end - start) / 1e9)


def job_report(api: NomadAPI, job_id: str, discovery_for: Callable[[str], Any]) -> JobReport:
    """The job's current run with its recorded outcome and latest progress.
    `discovery_for(run_id)` gives the job's ConsulDiscovery for that run.

    GET /v1/job/:job_id ; GET /v1/job/:job_id/versions ; GET /v1/job/:job_id/allocations ;
    GET /v1/kv/nomadtf/<ns>/<job>/<run>/cluster/state ; GET .../progress ; GET .../environment/?recurse
    """
    state = job_state(api, job_id)
    elapsed = run_elapsed(state.allocs, not state.job.dead, time.time_ns())
    attempts = reschedule_attempts_of(state.job.document)
    try:
        discovery = discovery_for(state.run_id)
        recorded = discovery.job_state()
        result = outcomes.decide(state.job, state.allocs, recorded, state.run_id, attempts)
        return JobReport(state, elapsed, discovery.progress(), recorded, outcome=result, runs=runs_of(discovery.environments()))
    except ServerError as exc:
        result = outcomes.decide(state.job, state.allocs, outcomes.UNKNOWN, state.run_id, attempts)
        return JobReport(state, elapsed, None, None, str(exc), outcome=result)


def run_allocations(api: NomadAPI, job: Job) -> list[Allocation]:
    """The allocations of the job's current run.

    GET /v1/job/:job_id/versions (when the job has a run id) ; GET /v1/job/:job_id/allocations
    """
    versions = versions_of_run(api.versions(job.id), job.run_id) if job.run_id else None
    return of_run(api.allocations(job.id), versions)


def require_nomadtf_job(api: NomadAPI, job_id: str) -> Job:
    """GET /v1/job/:job_id ; JobFailed unless the job is there and carries our Meta."""
    job = api.job(job_id)
    if job is None:
        raise JobNotFound(f"no job {job_id!r} in Nomad namespace {api.namespace!r}")
    if not job.ours:
        raise JobFailed(f"job {job_id!r} was not started by nomadtf (no {META_VERSION} in its Meta); not touching it")
    return job


def job_state(api: NomadAPI, job_id: str) -> JobState:
    """GET /v1/job/:job_id ; GET /v1/job/:job_id/versions ; GET /v1/job/:job_id/allocations"""
    job = require_nomadtf_job(api, job_id)
    return JobState(job, run_allocations(api, job))


def pick_allocs(allocs: list[Allocation], role: str | None, index: int | None, newest_only: bool = False) -> list[Allocation]:
    """Every allocation of each matching (role, index), slot by slot and oldest first, so a
    replacement never hides the attempt that trained; `newest_only`: the newest per slot. Pure."""
    chosen = []
    for alloc in sorted(allocs, key=lambda a: (a.slot, a.create_index)):
        r, i = alloc.slot
        if (role is None or r == role) and (index is None or i == index):
            chosen.append(alloc)
    if newest_only:
        chosen = list({a.slot: a for a in chosen}.values())
    return chosen


def log_allocations(
    api: NomadAPI, job_id: str, role: str, index: int | None, newest_only: bool = False
) -> list[Allocation]:
    """The allocations of the current run whose logs `nomadtf logs` shows; NomadtfError
    when there is none.

    GET /v1/job/:job_id ; GET /v1/job/:job_id/versions ; GET /v1/job/:job_id/allocations
    """
    allocs = pick_allocs(job_state(api, job_id).allocs, role, index, newest_only)
    if not allocs:
        which = f" index {index}" if index is not None else ""
        raise NoAllocation(f"job {job_id} has no allocation for role {role!r}{which}")
    return allocs


def final_lines(api: NomadAPI, job_id: str, count: int = 3, versions: set[int] | None = None) -> list[str]:
    """The last lines printed by the task whose exit ends the training (chief, else worker 0).

    GET /v1/job/:job_id/allocations ; GET /v1/client/fs/logs/:alloc_id?origin=end
    """
    alloc = deciding_alloc(of_run(api.allocations(job_id), versions))
    if alloc is None:
        return []
    role, _index = alloc.slot
    try:
        out = api.logs(alloc.id, role, "stdout", origin="end", offset=600)
    except ServerError:
        return []
    return [f"{role}: {line}" for line in out.splitlines() if line.strip()][-count:]
