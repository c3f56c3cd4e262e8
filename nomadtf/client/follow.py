"""Following a submitted run to its one outcome (`Follower`): its allocations through Nomad
blocking queries (GET /v1/job/:id/allocations?index=&wait=), so a change is seen as soon as
Nomad knows it, with no polling sleep; events, environments, progress and the failure report
handed to callbacks: nothing here prints (the CLI decides how they look).

Usage:
    view = Follower(api, "digits", timeout=600, reschedule_attempts=2, on_view=show, on_event=log,
                    recorded_state=discovery.job_state, run_id=run_id).follow(eval_id)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nomadtf import roles
from nomadtf.admission import suspension
from nomadtf.client.runview import (
    JobView,
    describe_environment,
    of_run,
    summarize,
    task_events,
    versions_of_run,
)
from nomadtf.errors import (
    FollowTimeout,
    JobFailed,
    JobLost,
    JobStopped,
    JobTimedOut,
    ServerError,
)
from nomadtf.job import outcome as outcomes
from nomadtf.job import report
from nomadtf.job.answers import Allocation, Job
from nomadtf.job.outcome import RunOutcome, latest_allocs
from nomadtf.job.plan import explain_placement_failure, group_counts, requested_devices
from nomadtf.servers.nomad import NomadAPI
from nomadtf.wire import META_RUN


class Requeued(Exception):
    """The admission controller gave the run's placed part back (not placed whole within
    its gang timeout): it waits in the queue again. Not a failure: `Run.follow` waits for
    its admission and follows it again."""


# The error `nomadtf run` raises for each outcome but success (its exit code: outcome.py).
OUTCOME_ERRORS: dict[str, type[JobFailed]] = {
    outcomes.FAILED: JobFailed, outcomes.STOPPED: JobStopped, outcomes.TIMED_OUT: JobTimedOut, outcomes.LOST: JobLost,
}


STDERR_TAIL_BYTES = 16_384  # of a failed task's stderr: room for a traceback among TensorFlow's notices


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
            if job is not None and self.versions is not None and job.run_id == self.run_id and job.version not in self.versions:
                # An admission scales group by group: every version of this run is ours.
                self.versions |= versions_of_run(self.api.versions(self.job_id), self.run_id) | {job.version}
            if job is not None and job.run_id == self.run_id and not job.stop and suspension.is_waiting(job.document):
                raise Requeued(self._requeued_why())
            allocs = of_run(every, self.versions)
            self._report_events(allocs)
            self._report_environments()
            self._announce_tensorboard(allocs)
            self._warn_side_roles(allocs)
            view = summarize(job or Job(self.job_id, status="dead"), allocs)
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
            if event.meta.get(META_RUN) == self.run_id and event.meta.get(suspension.META_ADMISSION) in ("preempted", "requeued", "not-ready"):
                return f"{self.job_id} {event.message.removeprefix('nomadtf admission: ')}"
        return fallback

    def _recorded(self) -> Any:
        """The run's recorded state; outcome.UNKNOWN while Consul cannot be read."""
        try:
            return self.recorded_state()
        except ServerError:
            return outcomes.UNKNOWN

    def _ending_report(self, result: RunOutcome, view: JobView, allocs: list[Allocation]) -> str:
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
            failed = evaluation.failed_groups
            if failed:
                found = self.api.job(self.job_id)
                job = found.document if found else {}
                devices, counts = requested_devices(job), group_counts(job)
                reasons = [explain_placement_failure(g, m, devices.get(g), counts.get(g)) for g, m in sorted(failed.items())]
                raise JobFailed("the job cannot be placed:\n  " + "\n  ".join(reasons))
            if evaluation.ended:
                if evaluation.status != "complete":
                    raise JobFailed(f"evaluation {eval_id[:8]} {evaluation.status}: {evaluation.status_description}")
                self.on_event(f"placed: evaluation {eval_id[:8]} complete")
                return

    def _report_events(self, allocs: list[Allocation]) -> None:
        for alloc in sorted(allocs, key=lambda a: a.create_index):
            role, index = alloc.slot
            for when, _task, text in task_events(alloc):
                key = (alloc.id, when, text)
                if key in self.seen_events:
                    continue
                self.seen_events.add(key)
                if any(word in text for word in ("Received", "Task Setup", "Building Task Directory", "Downloading")):
                    continue  # routine steps; keep the output about what matters
                self.on_event(f"{role}[{index}] ({alloc.id[:8]}) {text}")

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

    def _announce_tensorboard(self, allocs: list[Allocation]) -> None:
        """Once: where TensorBoard serves, as soon as its task runs.  GET /v1/allocation/:id"""
        if self.tensorboard_announced:
            return
        running = [a for (r, _i), a in latest_allocs(allocs).items() if r == "tensorboard" and a.client_status == "running"]
        if not running:
            return
        try:
            address = self.api.allocation(running[0].id).port_address("tf")
        except ServerError:
            return
        if address:
            self.tensorboard_announced = True
            self.on_event(f"TensorBoard: http://{address}/")

    def _fill_progress(self, view: JobView, allocs: list[Allocation]) -> None:
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
            chief = [a for (r, _i), a in latest_allocs(allocs).items() if r == "chief" and a.client_status == "running"]
            if chief:
                tail = self._log_tail(chief[0], "chief", "stdout", 1024)
                lines = [line for line in tail.splitlines() if line.strip()]
                self.last_line = lines[-1][:120] if lines else self.last_line
        view.last_line = self.last_line

    def _log_tail(self, alloc: Allocation, task: str, stream: str, size: int) -> str:
        """GET /v1/client/fs/logs/:alloc_id?origin=end ; "" when Nomad cannot say."""
        try:
            return self.api.logs(alloc.id, task, stream, origin="end", offset=size)
        except ServerError:
            return ""

    def _failure_report(self, allocs: list[Allocation], decided: str = "") -> str:
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
            stderr = self._log_tail(alloc, alloc.task_group or alloc.slot[0], "stderr", STDERR_TAIL_BYTES)
            events = [text for _w, _t, text in task_events(alloc)[-4:]]
            task = report.FailedTask.of(alloc, stderr, events, cut=len(stderr.encode()) >= STDERR_TAIL_BYTES)
        return report.failure_text(self.job_id, told.reason if told else decided, task)

    def _warn_side_roles(self, allocs: list[Allocation]) -> None:
        """Once per failed evaluator or TensorBoard allocation: a warning with its own stderr.
        Training goes on (outcome.decide never counts side roles).

        GET /v1/client/fs/logs/:alloc_id?type=stderr&origin=end
        """
        for alloc in sorted(allocs, key=lambda a: a.create_index):
            role, index = alloc.slot
            if not roles.is_soft(role) or alloc.client_status != "failed" or alloc.id in self.warned_side_allocs:
                continue
            self.warned_side_allocs.add(alloc.id)
            stderr = self._log_tail(alloc, alloc.task_group or role, "stderr", STDERR_TAIL_BYTES)
            lines = report.side_role_warning(role, index, report.exit_code_of(alloc), stderr, cut=len(stderr.encode()) >= STDERR_TAIL_BYTES)
            self.on_event("\n".join(lines))
