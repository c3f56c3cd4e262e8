"""Pure: a run's allocations as the client shows them: which belong to the current run, a
role's counts and restarts (`summarize` → `JobView`), the deciding allocation, a task's
events and addresses, an environment build's status in words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nomadtf.admission import suspension
from nomadtf.job.answers import Allocation, Job
from nomadtf.job.outcome import latest_allocs


@dataclass
class RoleView:
    wanted: int = 0
    pending: int = 0
    running: int = 0
    complete: int = 0
    failed: int = 0
    restarts: int = 0


@dataclass
class JobView:
    job_id: str
    status: str = "pending"
    roles: dict[str, RoleView] = field(default_factory=dict)
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    last_line: str = ""
    elapsed: float = 0.0


def versions_of_run(versions: list[Job], run_id: str) -> set[int]:
    """The job versions that belong to run `run_id` (one per registration, plus one per
    `nomadtf scale`; a later run of the same name has versions of its own). Pure."""
    return {v.version for v in versions if v.run_id == run_id}


def of_run(allocs: list[Allocation], versions: set[int] | None) -> list[Allocation]:
    """The allocations of one run (None: a job rendered without runs, every allocation).
    A re-run of the same job name never counts another run's allocations. Pure."""
    if versions is None:
        return list(allocs)
    return [a for a in allocs if a.job_version in versions]


def summarize(job: Job, allocs: list[Allocation]) -> JobView:
    """Pure: job + allocations -> one line per role."""
    view = JobView(job_id=job.id, status=job.status or "pending")
    for group, count in suspension.group_counts(job.document).items():
        if group != suspension.PLACEHOLDER_GROUP:
            view.roles[group] = RoleView(wanted=count)
    for (role, _index), alloc in latest_allocs(allocs).items():
        rv = view.roles.setdefault(role, RoleView())
        status = alloc.client_status
        if status == "running":
            rv.running += 1
        elif status == "complete":
            rv.complete += 1
        elif status in ("failed", "lost"):
            rv.failed += 1
        else:
            rv.pending += 1
    for alloc in allocs:
        view.roles.setdefault(alloc.slot[0], RoleView()).restarts += alloc.restarts
    return view


def deciding_alloc(allocs: list[Allocation]) -> Allocation | None:
    """The newest allocation of the task whose exit ends the training: chief[0], else worker[0]. Pure."""
    latest = latest_allocs(allocs)
    return latest.get(("chief", 0)) or latest.get(("worker", 0))


def task_events(alloc: Allocation) -> list[tuple[int, str, str]]:
    """(time ns, task, text) for every task event of an allocation."""
    out = []
    for task, event in alloc.events():
        text = event.text + (f" (exit {event.exit_code})" if event.exit_code else "")
        out.append((event.time, task, f"{event.type}: {text}"))
    return sorted(out)


def describe_environment(role: str, index: int, status: dict[str, Any]) -> str | None:
    """One line about a task's Python environment (job.json `environment`); None for a task
    without one (its record only says what its child runs, see `runs`). Pure."""
    who, key = f"{role}[{index}]", status.get("key", "")
    elapsed = status.get("elapsed_s", 0)
    state = status.get("state")
    if state == "started":
        return None
    if state == "building":
        return f"{who} building environment {key} ({status.get('requirements', '')}; Python {status.get('python', '?')}) ({elapsed:.0f} s)"
    if state == "waiting":
        return f"{who} waiting for environment {key}: another task on its client is building it"
    if state == "ready":
        how = "reused" if status.get("reused") else "built"
        return f"{who} environment {key} ready ({how} in {elapsed:.1f} s)"
    if state == "failed":
        return f"{who} environment failed: {status.get('error', '?')}"
    return f"{who} environment: {state}"
