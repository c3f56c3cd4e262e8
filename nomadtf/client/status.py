"""What `nomadtf status` says, and `nomadtf stop` does: the lines are made here, from Nomad,
Consul and (once Nomad has collected a run) the run's archive; the command line prints them.

    lines = overview(namespace, region)              # every nomadtf job, one line each
    lines = job_status(job_id, namespace, region)    # one job in detail; JobNotFound: neither
                                                     # Nomad nor an archive has it
    found = archived_logs(job_id, namespace, role, index, stream)   # None: nothing kept
    lines = stop(job_id, namespace, region, purge)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from nomadtf.admission import suspension
from nomadtf.client import archive
from nomadtf.client.queued import QueueStatus, preemptions, read_board, refusal
from nomadtf.client.readback import describe_runs, job_report, nomadtf_jobs
from nomadtf.client.run import stop_job
from nomadtf.errors import JobNotFound
from nomadtf.job.answers import Job
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.servers.nomad import NomadAPI
from nomadtf.wire import DEFAULT_NAMESPACE, META_STRATEGY, META_VERSION, queue_ticket


def overview(namespace: str | None, region: str | None) -> list[str]:
    api = NomadAPI.from_env(namespace=namespace, region=region)
    queue_line = _queue_lines()
    states = nomadtf_jobs(api)
    if not states:
        return ["no nomadtf jobs"]
    lines = []
    for state in states:
        job, view = state.job, state.view
        name = job.id if job.namespace == DEFAULT_NAMESPACE else f"{job.id}@{job.namespace}"
        if suspension.is_waiting(job.document):
            lines.append(f"{name:<24} {queue_line(job)}")
            continue
        age = time.time() - job.submit_time / 1e9
        roles = ", ".join(f"{r} {v.running}/{v.wanted}" + (f" ({v.restarts} restarts)" if v.restarts else "") for r, v in view.roles.items())
        lines.append(f"{name:<24} {job.status:<8} {age / 60:6.1f}m  {roles}")
    return lines


def job_status(job_id: str, namespace: str | None, region: str | None) -> list[str]:
    api = NomadAPI.from_env(namespace=namespace, region=region)
    try:
        report = job_report(api, job_id, lambda run_id: ConsulDiscovery(job_id, api.namespace, run_id=run_id))
    except JobNotFound:
        kept = archived_status(job_id, api.namespace)
        if kept is None:
            raise
        return kept
    queue_line = _queue_lines()
    history = preemptions(api, job_id, report.state.run_id) if report.state.run_id else []
    if suspension.is_waiting(report.state.job.document):
        return [f"{job_id}: run {report.state.run_id} {queue_line(report.state.job)}", *(f"  {line}" for line in history)]
    if suspension.state(report.state.job.document) == suspension.REFUSED:
        return [f"{job_id}: dead  run {report.state.run_id or '-'}  not admitted: {refusal(api, job_id)}"]
    state, job = report.state, report.state.job
    lines = [
        f"{job_id}: {job.status}  run {state.run_id or '-'}  {report.elapsed_s:.0f}s  "
        f"strategy {job.meta.get(META_STRATEGY, '?')}  nomadtf {job.meta.get(META_VERSION, '?')}"
    ]
    if report.outcome:
        lines.append(f"  outcome: {report.outcome}")
    elif report.recorded:
        lines.append(f"  recorded: {report.recorded} (its tasks are still stopping)")
    if report.progress:
        metrics = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in (report.progress.get("metrics") or {}).items())
        lines.append(f"  step {report.progress.get('step')}  {metrics}".rstrip())
    if report.consul_error:
        lines.append(f"  (no outcome or progress: {report.consul_error})")
    lines += [f"  {line}" for line in history]
    lines += [f"  {describe_runs(line, slots)}" for line, slots in report.runs.items()]
    for role, rv in state.view.roles.items():
        lines.append(f"  {role:<11} wanted {rv.wanted}  running {rv.running}  complete {rv.complete}  failed {rv.failed}  restarts {rv.restarts}")
    for alloc in sorted(state.allocs, key=lambda a: a.create_index):
        role, index = alloc.slot
        lines.append(f"    {role}[{index}] {alloc.id[:8]} {alloc.client_status:<9} restarts {alloc.restarts}")
    return lines


def archived_status(job_id: str, namespace: str) -> list[str] | None:
    """`status` of a run Nomad no longer has, from its archive; None: none kept."""
    run = archive.latest_run(archive.archive_root(namespace, os.environ), job_id)
    if run is None:
        return None
    record = archive.read_outcome(run)
    run_id = record.get("run_id") if record else run.parent.name
    lines = [f"{job_id}: collected by Nomad  run {run_id}  (from its archive, {run})"]
    if record:
        lines += archive.describe_outcome(record)
    else:
        lines.append("  outcome: none recorded (the run was stopped or lost before a task could record one)")
    lines.append(f"  tasks kept: {', '.join(archive.tasks(run)) or 'none'}")
    return lines


@dataclass(frozen=True)
class ArchivedLogs:
    note: str  # for stderr: where they come from
    attempts: list[tuple[str, str]]  # (attempt, its text), oldest first


def archived_logs(job_id: str, namespace: str, role: str, index: int | None, stream: str) -> ArchivedLogs | None:
    """`logs` of a run Nomad no longer has, from its archive; None: nothing kept."""
    run = archive.latest_run(archive.archive_root(namespace, os.environ), job_id)
    kept = archive.attempts(run, role, index, stream) if run else []
    if not kept:
        return None
    return ArchivedLogs(f"{job_id}: collected by Nomad; from its archive ({run})", kept)


def stop(job_id: str, namespace: str | None, region: str | None, purge: bool) -> list[str]:
    """Stop a job (a queued run leaves the queue); what happened, as lines."""
    job = stop_job(NomadAPI.from_env(namespace=namespace, region=region), job_id, purge=purge)
    lines = []
    if suspension.is_waiting(job.document):
        lines.append(f"removed {job_id} run {job.run_id or '?'} from the queue")
    lines.append(f"stopped {job_id}" + (" and purged it" if purge else ""))
    return lines


def _queue_lines() -> Callable[[Job], str]:
    """What a waiting run's board line says; the board is read once per command, when needed."""
    board = None

    def queue_line(job: Job) -> str:
        nonlocal board
        board = board or read_board()
        line = board.line_of(queue_ticket(job.namespace, job.id, job.run_id))
        return "queued: " + QueueStatus(f"{job.namespace}/{job.id}", job.run_id, line, board.length, board.leader if board.age_s() < 600 else "").describe()

    return queue_line
