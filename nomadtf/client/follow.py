"""Following a submitted job to its outcome, and reading jobs back (status, logs).

The views and decisions are pure (`summarize`, `outcome`, `task_events`, `pick_allocs`);
`Follower` and the read-back functions ask Nomad through `NomadAPI`. Nothing here prints:
`Follower` hands `JobView`s and event lines to callbacks, and the CLI decides how they look.

Waiting uses Nomad blocking queries (GET /v1/job/:id/allocations?index=&wait=), so a
change is seen as soon as Nomad knows it, with no polling sleep in between.

Usage:
    view = Follower(api, "digits", timeout=600, reschedule_attempts=2, on_view=show, on_event=log,
                    recorded_state=discovery.job_state, run_id=run_id).follow(eval_id)
    [(state.job, state.view) for state in nomadtf_jobs(api)]
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nomadtf import roles
from nomadtf.admission import suspension
from nomadtf.errors import (
    FollowTimeout,
    JobFailed,
    JobLost,
    JobNotFound,
    JobStopped,
    JobTimedOut,
    NomadtfError,
    ServerError,
)
from nomadtf.job import outcome as outcomes
from nomadtf.job import report
from nomadtf.job.outcome import RunOutcome, alloc_slot, latest_allocs
from nomadtf.job.plan import explain_placement_failure, group_counts, requested_devices
from nomadtf.servers.nomad import NomadAPI
from nomadtf.wire import META_RUN, META_VERSION


class Requeued(Exception):
    """The admission controller gave the run's placed part back (not placed whole within
    its gang timeout): it waits in the queue again. Not a failure: `Run.follow` waits for
    its admission and follows it again."""


# The error `nomadtf run` raises for each outcome but success (its exit code: outcome.py).
OUTCOME_ERRORS: dict[str, type[JobFailed]] = {
    outcomes.FAILED: JobFailed, outcomes.STOPPED: JobStopped, outcomes.TIMED_OUT: JobTimedOut, outcomes.LOST: JobLost,
}
STDERR_TAIL_BYTES = 16_384  # of a failed task's stderr: room for a traceback among TensorFlow's notices


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


def run_of(job: dict[str, Any]) -> str:
    """The run id a job's current version carries ("" for a job rendered without one)."""
    return (job.get("Meta") or {}).get(META_RUN, "")


def versions_of_run(versions: list[dict[str, Any]], run_id: str) -> set[int]:
    """The job versions that belong to run `run_id` (one per registration, plus one per
    `nomadtf scale`; a later run of the same name has versions of its own). Pure."""
    return {v.get("Version", 0) for v in versions if (v.get("Meta") or {}).get(META_RUN) == run_id}


def of_run(allocs: list[dict[str, Any]], versions: set[int] | None) -> list[dict[str, Any]]:
    """The allocations of one run (None: a job rendered without runs, every allocation).
    A re-run of the same job name never counts another run's allocations. Pure."""
    if versions is None:
        return list(allocs)
    return [a for a in allocs if a.get("JobVersion", 0) in versions]


def restarts_of(alloc: dict[str, Any]) -> int:
    return sum(state.get("Restarts", 0) for state in (alloc.get("TaskStates") or {}).values())


def summarize(job: dict[str, Any], allocs: list[dict[str, Any]]) -> JobView:
    """Pure: job + allocations -> one line per role."""
    view = JobView(job_id=job["ID"], status=job.get("Status", "pending"))
    for group in suspension.without_placeholder(job.get("TaskGroups") or []):
        view.roles[group["Name"]] = RoleView(wanted=group.get("Count", 0))
    for (role, _index), alloc in latest_allocs(allocs).items():
        rv = view.roles.setdefault(role, RoleView())
        status = alloc.get("ClientStatus")
        if status == "running":
            rv.running += 1
        elif status == "complete":
            rv.complete += 1
        elif status in ("failed", "lost"):
            rv.failed += 1
        else:
            rv.pending += 1
    for alloc in allocs:
        role, _ = alloc_slot(alloc)
        view.roles.setdefault(role, RoleView()).restarts += restarts_of(alloc)
    return view


def deciding_alloc(allocs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest allocation of the task whose exit ends the training: chief[0], else worker[0]. Pure."""
    latest = latest_allocs(allocs)
    return latest.get(("chief", 0)) or latest.get(("worker", 0))


def port_address(alloc: dict[str, Any], label: str) -> str | None:
    """"host:port" of an allocation's port (from GET /v1/allocation/:id). Pure."""
    for port in ((alloc.get("AllocatedResources") or {}).get("Shared") or {}).get("Ports") or []:
        if port.get("Label") == label and port.get("Value"):
            return f"{port.get('HostIP') or '127.0.0.1'}:{port['Value']}"
    return None


def task_events(alloc: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(time ns, task, text) for every task event of an allocation."""
    out = []
    for task, state in (alloc.get("TaskStates") or {}).items():
        for event in state.get("Events") or []:
            text = event.get("DisplayMessage") or event.get("Type", "")
            if event.get("ExitCode"):
                text += f" (exit {event['ExitCode']})"
            out.append((event.get("Time", 0), task, f"{event.get('Type')}: {text}"))
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


class Follower:
    """Follows one run until its outcome (outcome.py) or the timeout.

    Usage:
        view = Follower(api, "digits", 600, 2, on_view=show, on_event=log,
                        recorded_state=discovery.job_state, run_id=run).follow(eval_id)
    """

    def __init__(
        self,
        api: NomadAPI,
        job_id: str,
        timeout: float | None,
        reschedule_attempts: int,
        on_view: Callable[[JobView], None],
        on_event: Callable[[str], None],
        *,
        # Required: success is only ever what the run recorded; a follower without the
        # record would call every finished run "lost".
        recorded_state: Callable[[], str | None],
        progress: Callable[[], dict[str, Any] | None] = lambda: None,
        first_version: int = 0,
        environments: Callable[[], dict[tuple[str, int], dict[str, Any]]] = lambda: {},
        run_id: str = "",
    ):
        self.api = api
        self.run_id = run_id
        # This run's job versions: the one it registered, and those `nomadtf scale` adds.
        self.versions: set[int] | None = {first_version} if run_id else None
        self.job_id = job_id
        self.deadline = time.monotonic() + timeout if timeout else None
        self.reschedule_attempts = reschedule_attempts
        self.on_view = on_view
        self.on_event = on_event
        self.progress = progress
        self.recorded_state = recorded_state
        self.environments = environments
        self.environment_lines: dict[tuple[str, int], str] = {}
        self.runs_said: set[str] = set()  # what the tasks' children run: each distinct line once
        self.started = time.monotonic()
        self.seen_events: set[tuple[str, int, str]] = set()
        self.last_line_at = 0.0
        self.last_line = ""
        self.tensorboard_announced = False
        self.warned_side_allocs: set[str] = set()

    def follow(self, eval_id: str) -> JobView:
        """The final view once the run succeeded; otherwise the outcome's error (JobFailed
        with the failing task's events and stderr, JobStopped, JobTimedOut, JobLost) or
        FollowTimeout.

        `eval_id` "" for a run the admission controller admitted: its placement (all or
        nothing, within the gang timeout) is the controller's to judge, and a run it gives
        back raises Requeued.

        GET /v1/evaluation/:eval_id (blocking) until placed, then in turn
        GET /v1/job/:job_id/allocations (blocking), GET /v1/job/:job_id,
        GET /v1/client/fs/logs/:alloc_id (the chief's last line; stderr of failed tasks)
        """
        if eval_id:
            self._wait_for_placement(eval_id)
        index = 0
        while True:
            self._check_deadline()
            every, index = self.api.watch_allocations(self.job_id, index)
            job = self.api.job(self.job_id)
            if job is not None and self.versions is not None and run_of(job) == self.run_id and job.get("Version", 0) not in self.versions:
                # An admission scales group by group: every version of this run is ours.
                self.versions |= versions_of_run(self.api.versions(self.job_id), self.run_id) | {job.get("Version", 0)}
            if job is not None and run_of(job) == self.run_id and not job.get("Stop") and suspension.is_waiting(job):
                raise Requeued(self._requeued_why())
            allocs = of_run(every, self.versions)
            self._report_events(allocs)
            self._report_environments()
            self._announce_tensorboard(allocs)
            self._warn_side_roles(allocs)
            view = summarize(job or {"ID": self.job_id, "Status": "dead"}, allocs)
            self._fill_progress(view, allocs)
            self.on_view(view)
            result = outcomes.decide(job, allocs, self._recorded(), self.run_id, self.reschedule_attempts)
            if result is None:
                continue
            if result.kind == outcomes.SUCCEEDED:
                return view
            raise OUTCOME_ERRORS[result.kind](self._ending_report(result, view, allocs))

    def _requeued_why(self) -> str:
        """What the controller said when it put the run back in line: preempted (by whom, at
        which step) or not placed whole in time.  GET /v1/job/:job_id/scale"""
        fallback = f"{self.job_id} run {self.run_id} was given back to the queue by the admission controller"
        try:
            events = self.api.scaling_events(self.job_id).get(suspension.PLACEHOLDER_GROUP) or []
        except ServerError:
            return fallback
        for event in events:  # newest first
            meta = event.get("Meta") or {}
            if meta.get(META_RUN) == self.run_id and meta.get(suspension.META_ADMISSION) in ("preempted", "requeued", "not-ready"):
                return f"{self.job_id} {str(event.get('Message') or '').removeprefix('nomadtf admission: ')}"
        return fallback

    def _recorded(self) -> Any:
        """The run's recorded state; outcome.UNKNOWN while Consul cannot be read."""
        try:
            return self.recorded_state()
        except ServerError:
            return outcomes.UNKNOWN

    def _ending_report(self, result: RunOutcome, view: JobView, allocs: list[dict[str, Any]]) -> str:
        """What `run` prints for an outcome other than success."""
        if result.kind == outcomes.STOPPED:
            step = f" at step {view.step}" if view.step is not None else ""
            return f"job {self.job_id} run {self.run_id or '?'} {result.reason}{step} after {view.elapsed:.0f}s; it did not finish training"
        return self._failure_report(allocs, result.reason)

    def _check_deadline(self) -> None:
        if self.deadline and time.monotonic() > self.deadline:
            raise FollowTimeout(f"job {self.job_id} did not finish within the timeout; it keeps running (nomadtf stop {self.job_id})")

    def _wait_for_placement(self, eval_id: str) -> None:
        """Block on the evaluation; placement failures become one explained error.

        GET /v1/evaluation/:eval_id?index= (blocking) ; GET /v1/job/:job_id when placement failed
        """
        index = 0
        while True:
            self._check_deadline()
            evaluation, index = self.api.watch_evaluation(eval_id, index)
            if not evaluation:
                continue
            failed = evaluation.get("FailedTGAllocs") or {}
            if failed:
                job = self.api.job(self.job_id) or {}
                devices, counts = requested_devices(job), group_counts(job)
                reasons = [explain_placement_failure(g, m, devices.get(g), counts.get(g)) for g, m in sorted(failed.items())]
                raise JobFailed("the job cannot be placed:\n  " + "\n  ".join(reasons))
            if evaluation.get("Status") in ("complete", "failed", "canceled"):
                if evaluation["Status"] != "complete":
                    raise JobFailed(f"evaluation {eval_id[:8]} {evaluation['Status']}: {evaluation.get('StatusDescription', '')}")
                self.on_event(f"placed: evaluation {eval_id[:8]} complete")
                return

    def _report_events(self, allocs: list[dict[str, Any]]) -> None:
        for alloc in sorted(allocs, key=lambda a: a.get("CreateIndex", 0)):
            role, index = alloc_slot(alloc)
            for when, _task, text in task_events(alloc):
                key = (alloc["ID"], when, text)
                if key in self.seen_events:
                    continue
                self.seen_events.add(key)
                if any(word in text for word in ("Received", "Task Setup", "Building Task Directory", "Downloading")):
                    continue  # routine steps; keep the output about what matters
                self.on_event(f"{role}[{index}] ({alloc['ID'][:8]}) {text}")

    def _report_environments(self) -> None:
        """A line whenever a task's environment changes state (a build: every 10 s or so)."""
        try:
            statuses = self.environments()
        except ServerError:
            return
        for slot, status in sorted(statuses.items()):
            line = describe_environment(*slot, status)
            if line and self.environment_lines.get(slot) != line:
                self.environment_lines[slot] = line
                self.on_event(line)
            runs = status.get("runs")
            # 64 tasks on one image say one thing: said by the first, again only if one differs.
            if runs and runs not in self.runs_said:
                self.runs_said.add(runs)
                self.on_event(f"{slot[0]}[{slot[1]}] runs {runs}")

    def _announce_tensorboard(self, allocs: list[dict[str, Any]]) -> None:
        """Once: where TensorBoard serves, as soon as its task runs.  GET /v1/allocation/:id"""
        if self.tensorboard_announced:
            return
        running = [a for (r, _i), a in latest_allocs(allocs).items() if r == "tensorboard" and a.get("ClientStatus") == "running"]
        if not running:
            return
        try:
            address = port_address(self.api.allocation(running[0]["ID"]), "tf")
        except ServerError:
            return
        if address:
            self.tensorboard_announced = True
            self.on_event(f"TensorBoard: http://{address}/")

    def _fill_progress(self, view: JobView, allocs: list[dict[str, Any]]) -> None:
        view.elapsed = time.monotonic() - self.started
        try:
            progress = self.progress()
        except ServerError:
            progress = None
        if progress:
            view.step = progress.get("step")
            view.metrics = progress.get("metrics") or {}
        if time.monotonic() - self.last_line_at > 3:
            self.last_line_at = time.monotonic()
            chief = [a for (r, _i), a in latest_allocs(allocs).items() if r == "chief" and a.get("ClientStatus") == "running"]
            if chief:
                tail = self._log_tail(chief[0], "chief", "stdout", 1024)
                lines = [line for line in tail.splitlines() if line.strip()]
                self.last_line = lines[-1][:120] if lines else self.last_line
        view.last_line = self.last_line

    def _log_tail(self, alloc: dict[str, Any], task: str, stream: str, size: int) -> str:
        """GET /v1/client/fs/logs/:alloc_id?origin=end ; "" when Nomad cannot say."""
        try:
            return self.api.logs(alloc["ID"], task, stream, origin="end", offset=size)
        except ServerError:
            return ""

    def _failure_report(self, allocs: list[dict[str, Any]], decided: str = "") -> str:
        """The job's recorded reason (else `decided`, the outcome's), then the failing task
        (report.failing_alloc: the one the record names, else the newest failed one, else
        the deciding one): its exit code, last events, traceback or last meaningful stderr
        lines, and what to do.

        GET /v1/client/fs/logs/:alloc_id?type=stderr&origin=end
        """
        try:
            recorded = self.recorded_state()
        except ServerError:
            recorded = None
        told = outcomes.from_record(recorded)
        alloc = report.failing_alloc(allocs, recorded, decided)
        task = None
        if alloc is not None:
            stderr = self._log_tail(alloc, alloc.get("TaskGroup", alloc_slot(alloc)[0]), "stderr", STDERR_TAIL_BYTES)
            events = [text for _w, _t, text in task_events(alloc)[-4:]]
            task = report.FailedTask.of(alloc, stderr, events, cut=len(stderr.encode()) >= STDERR_TAIL_BYTES)
        return report.failure_text(self.job_id, told.reason if told else decided, task)

    def _warn_side_roles(self, allocs: list[dict[str, Any]]) -> None:
        """Once per failed evaluator or TensorBoard allocation: a warning with its own stderr.
        Training goes on (outcome.decide never counts side roles).

        GET /v1/client/fs/logs/:alloc_id?type=stderr&origin=end
        """
        for alloc in sorted(allocs, key=lambda a: a.get("CreateIndex", 0)):
            role, index = alloc_slot(alloc)
            if not roles.is_soft(role) or alloc.get("ClientStatus") != "failed" or alloc["ID"] in self.warned_side_allocs:
                continue
            self.warned_side_allocs.add(alloc["ID"])
            stderr = self._log_tail(alloc, alloc.get("TaskGroup", role), "stderr", STDERR_TAIL_BYTES)
            lines = report.side_role_warning(role, index, report.exit_code_of(alloc), stderr, cut=len(stderr.encode()) >= STDERR_TAIL_BYTES)
            self.on_event("\n".join(lines))


# ---- reading jobs back ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobState:
    """A nomadtf job as Nomad records it, also when nobody followed it; `allocs` are its
    current run's."""

    job: dict[str, Any]
    allocs: list[dict[str, Any]]

    @property
    def run_id(self) -> str:
        return run_of(self.job)

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
        if stub.get("Meta") is not None and META_VERSION not in stub["Meta"]:
            continue  # Nomad listed its Meta and it is not ours: no need to fetch it
        scoped = api.in_namespace(stub.get("Namespace") or api.namespace)
        job = scoped.job(stub["ID"])
        if job and META_VERSION in (job.get("Meta") or {}):
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


def reschedule_attempts_of(job: dict[str, Any]) -> int:
    """The reschedule attempts the rendered job gives its groups (the same for every group
    nomadtf renders). Pure."""
    attempts = [(g.get("ReschedulePolicy") or {}).get("Attempts", 0) or 0 for g in job.get("TaskGroups") or []]
    return max(attempts, default=0)


def run_elapsed(allocs: list[dict[str, Any]], running: bool, now_ns: int) -> float:
    """Seconds from the run's first allocation to now (running) or to its last change. Pure."""
    if not allocs:
        return 0.0
    start = min(a.get("CreateTime", now_ns) for a in allocs)
    end = now_ns if running else max(a.get("ModifyTime", now_ns) for a in allocs)
    return max(0.0, (end - start) / 1e9)


def job_report(api: NomadAPI, job_id: str, discovery_for: Callable[[str], Any]) -> JobReport:
    """The job's current run with its recorded outcome and latest progress.
    `discovery_for(run_id)` gives the job's ConsulDiscovery for that run.

    GET /v1/job/:job_id ; GET /v1/job/:job_id/versions ; GET /v1/job/:job_id/allocations ;
    GET /v1/kv/nomadtf/<ns>/<job>/<run>/cluster/state ; GET .../progress ; GET .../environment/?recurse
    """
    state = job_state(api, job_id)
    elapsed = run_elapsed(state.allocs, state.job.get("Status") != "dead", time.time_ns())
    attempts = reschedule_attempts_of(state.job)
    try:
        discovery = discovery_for(state.run_id)
        recorded = discovery.job_state()
        result = outcomes.decide(state.job, state.allocs, recorded, state.run_id, attempts)
        return JobReport(state, elapsed, discovery.progress(), recorded, outcome=result, runs=runs_of(discovery.environments()))
    except ServerError as exc:
        result = outcomes.decide(state.job, state.allocs, outcomes.UNKNOWN, state.run_id, attempts)
        return JobReport(state, elapsed, None, None, str(exc), outcome=result)


def run_allocations(api: NomadAPI, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The allocations of the job's current run.

    GET /v1/job/:job_id/versions (when the job has a run id) ; GET /v1/job/:job_id/allocations
    """
    versions = versions_of_run(api.versions(job["ID"]), run_of(job)) if run_of(job) else None
    return of_run(api.allocations(job["ID"]), versions)


def require_nomadtf_job(api: NomadAPI, job_id: str) -> dict[str, Any]:
    """GET /v1/job/:job_id ; JobFailed unless the job is there and carries our Meta."""
    job = api.job(job_id)
    if job is None:
        raise JobNotFound(f"no job {job_id!r} in Nomad namespace {api.namespace!r}")
    if META_VERSION not in (job.get("Meta") or {}):
        raise JobFailed(f"job {job_id!r} was not started by nomadtf (no {META_VERSION} in its Meta); not touching it")
    return job


def job_state(api: NomadAPI, job_id: str) -> JobState:
    """GET /v1/job/:job_id ; GET /v1/job/:job_id/versions ; GET /v1/job/:job_id/allocations"""
    job = require_nomadtf_job(api, job_id)
    return JobState(job, run_allocations(api, job))


def pick_allocs(
    allocs: list[dict[str, Any]], role: str | None, index: int | None, newest_only: bool = False
) -> list[dict[str, Any]]:
    """Every allocation of each matching (role, index), slot by slot and oldest first, so a
    replacement never hides the attempt that trained; `newest_only`: the newest per slot. Pure."""
    chosen = []
    for alloc in sorted(allocs, key=lambda a: (alloc_slot(a), a.get("CreateIndex", 0))):
        r, i = alloc_slot(alloc)
        if (role is None or r == role) and (index is None or i == index):
            chosen.append(alloc)
    if newest_only:
        chosen = list({alloc_slot(a): a for a in chosen}.values())
    return chosen


def log_allocations(
    api: NomadAPI, job_id: str, role: str, index: int | None, newest_only: bool = False
) -> list[dict[str, Any]]:
    """The allocations of the current run whose logs `nomadtf logs` shows; NomadtfError
    when there is none.

    GET /v1/job/:job_id ; GET /v1/job/:job_id/versions ; GET /v1/job/:job_id/allocations
    """
    allocs = pick_allocs(job_state(api, job_id).allocs, role, index, newest_only)
    if not allocs:
        which = f" index {index}" if index is not None else ""
        raise NomadtfError(f"job {job_id} has no allocation for role {role!r}{which}")
    return allocs


def final_lines(api: NomadAPI, job_id: str, count: int = 3, versions: set[int] | None = None) -> list[str]:
    """The last lines printed by the task whose exit ends the training (chief, else worker 0).

    GET /v1/job/:job_id/allocations ; GET /v1/client/fs/logs/:alloc_id?origin=end
    """
    alloc = deciding_alloc(of_run(api.allocations(job_id), versions))
    if alloc is None:
        return []
    role, _index = alloc_slot(alloc)
    try:
        out = api.logs(alloc["ID"], role, "stdout", origin="end", offset=600)
    except ServerError:
        return []
    return [f"{role}: {line}" for line in out.splitlines() if line.strip()][-count:]
