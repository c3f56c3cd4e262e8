"""The client-side use case of `nomadtf run`: load → render → submit a run → follow →
stop on failure → outcome, and `nomadtf stop`.

Every submission is a run with its own id (job Meta `nomadtf.run`, the tasks' spec file,
the Consul keys). Following, status and logs look only at the current run's allocations,
so the same job name run again reports its own outcome. Every Nomad call of a run goes to
the namespace and region its job.json names. Nothing here prints: what happens is handed
to the caller's callbacks, and failures are raised.

Usage:
    run = Run.from_job_file(Path("job.json"), ["roles.worker.count=4"])
    submitted = run.submit(replace=False, resume=False)
    submitted.notes          # ["resuming run 3f2a9c1e's model_dir (checkpoint at step 600)"]
    outcome = run.follow(submitted, timeout_s=None, on_view=show, on_event=log)
    outcome.final_lines      # ["chief: final_accuracy=0.93"]
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomadtf import wire
from nomadtf.admission import suspension
from nomadtf.client import cluster_facts, placement, queued
from nomadtf.client.follow import Follower, Requeued
from nomadtf.client.readback import final_lines, require_nomadtf_job
from nomadtf.client.runview import JobView, versions_of_run
from nomadtf.errors import (
    FollowTimeout,
    JobFailed,
    JobStopped,
    NomadError,
    NomadtfError,
    ServerError,
    UsageError,
)
from nomadtf.job import plan, render
from nomadtf.job.answers import Job, JobWrite
from nomadtf.job.options import load_options
from nomadtf.job.profile import offline_check_fill
from nomadtf.job.spec import JobSpec, RunInfo, parse_spec
from nomadtf.job.target import Target
from nomadtf.job.taskfile import expand_task_vars
from nomadtf.job.validate import normalize
from nomadtf.roles import SCALABLE_ROLES
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.servers.nomad import NomadAPI

REPLACE_WAIT_S = 60.0  # how long --replace waits for the running run's allocations to stop
NO_CONTROLLER = (
    "no admission controller leads on this cluster: the run goes to Nomad as it is, without queueing or an "
    "all-or-nothing start (an operator deploys one with: nomadtf admission deploy)"
)


@dataclass(frozen=True)
class Submitted:
    job_id: str
    namespace: str
    eval_id: str
    ui_url: str
    run_id: str = ""
    first_version: int = 0
    notes: list[str] = field(default_factory=list)
    # Registered suspended: the admission controller starts it (Run.wait_for_admission);
    # its placement is the controller's to judge, so there is no evaluation to follow.
    suspended: bool = False
    registered_index: int = 0  # the registration's JobModifyIndex


@dataclass(frozen=True)
class Outcome:
    view: JobView
    final_lines: list[str]


def new_run_id() -> str:
    return secrets.token_hex(4)


def checkpoint_step(model_dir: Path) -> int | None:
    """The global step of the latest checkpoint in `model_dir` as this machine sees it
    (TensorFlow's `checkpoint` index file names it, e.g. model.ckpt-600); None when there is
    none or the directory is not visible here."""
    try:
        text = (model_dir / "checkpoint").read_text()
    except OSError:
        return None
    match = re.search(r'^model_checkpoint_path:\s*"[^"]*?-(\d+)"', text, re.M)
    return int(match[1]) if match else None


def client_model_dir(spec: JobSpec, namespace: str, run_dir: str) -> Path | None:
    """model_dir as the submitting machine would see it (the local stack, or a shared
    filesystem mounted at the same path); None when it names task-only variables."""
    text = expand_task_vars(
        spec.model_dir,
        {"NOMAD_NAMESPACE": namespace, "NOMAD_JOB_ID": spec.name, "NOMAD_JOB_NAME": spec.name, "NOMADTF_RUN_ID": run_dir},
    )
    return None if "${" in text else Path(text)


class Run:
    """One run of one job.json, from the options file to the training's outcome."""

    def __init__(
        self,
        spec: JobSpec,
        api: NomadAPI,
        templates: Path | None = None,
        target: Target | None = None,
        notes: list[str] | None = None,
    ):
        self.spec = spec
        self.api = api
        self.templates = templates
        self.target = target  # the Nomad the job is rendered for (None: 1.6, as before targets)
        # What the cluster could not tell (cluster_facts) and what the rendering leaves out:
        # the caller shows them before submitting (Submitted.notes has only what submitting said).
        self.notes = list(notes or [])
        self.unreachable: ServerError | None = None  # Nomad did not answer when asked its version
        # (run id, suspended, JobModifyIndex) once a run is registered: what Ctrl-C during
        # `submit` has to act on (the caller has no Submitted yet).
        self.registered: tuple[str, bool, int] | None = None
        self.job_id: str = spec.name
        self.discovery: ConsulDiscovery | None = None
        # The job as `validate` and `plan` see it, rendered once: each submission stamps its
        # run on it (render.stamp_run), never renders again.
        self.rendered: dict[str, Any] = render.render_job(spec, templates, target=target)
        self.job: dict[str, Any] = self.rendered

    @classmethod
    def from_job_file(cls, job_file: Path, variables: list[str], templates: Path | None = None) -> Run:
        """Load and check the spec, filled from the cluster's profile, and render it for the
        server's Nomad version (cluster_facts); a job.json that is wrong in itself asks no
        server anything. The client speaks to the job's namespace and region.

        GET /v1/kv/nomadtf/_cluster/profile ; GET /v1/agent/self [; GET /v1/agent/members]
        """
        raw = load_options(job_file, variables)
        normalize(offline_check_fill(raw))  # checked only: every problem of job.json itself, before any server
        facts = cluster_facts.at_submission(NomadAPI.from_env(), os.environ)
        spec = parse_spec(facts.fill(raw))
        facts.require_target_for(spec)  # never a guess where the guess decides how tasks get Vault
        api = NomadAPI.from_env(namespace=spec.namespace, region=spec.region)
        made = cls(spec, api, templates, facts.target, facts.notes + render.rendering_notes(spec, facts.target))
        made.unreachable = facts.unreachable
        return made

    def submit(self, replace: bool = False, resume: bool = False) -> Submitted:
        """Validate with Nomad, handle a run of the same job that is still going (refused
        unless `replace`), work out what `resume` continues, ask Nomad's plan whether the
        whole run can ever fit (never: fail at once, nothing sent), and register the run:
        suspended, for the admission controller to start in its turn (docs/guide/queueing.md),
        or as it is where no controller leads. Nothing is sent unless every check passed.

        Registration is a check-and-set on the job's JobModifyIndex as read here (0: no job
        yet): of two `nomadtf run` of one name at the same moment exactly one registers, the
        other is refused and sends nothing more. Only after that are earlier runs' Consul
        keys deleted, never this run's.

        POST /v1/validate/job ; GET /v1/job/:job_id ; [DELETE /v1/job/:job_id and blocking
        GET /v1/job/:job_id/allocations with --replace] ; GET .../progress of the previous run ;
        POST /v1/job/:job_id/plan ; GET /v1/nodes?resources=true ;
        GET /v1/kv/nomadtf/_admission/leader ; POST /v1/jobs (EnforceIndex) ;
        GET /v1/job/:job_id/versions ; DELETE /v1/kv/nomadtf/<ns>/<job>/<other run>/?recurse
        """
        notes: list[str] = []
        run_id = new_run_id()
        existing = self.api.job(self.job_id)
        if existing is not None and not existing.ours:
            raise JobFailed(
                f"job {self.job_id!r} in namespace {self.api.namespace!r} was not started by nomadtf; "
                "pick another name (nomadtf never replaces a job it did not start)"
            )
        model_run = self._model_run(existing, run_id, resume, notes)
        job = render.stamp_run(self.rendered, self.spec, RunInfo(run_id, time.time(), model_run))
        self.api.validate(job)
        discovery = ConsulDiscovery(self.job_id, self.api.namespace, run_id=run_id)
        try:
            discovery.job_state()  # Consul holds the run's state: it must answer before we submit
        except ServerError as exc:
            raise ServerError(f"Consul is needed for the job's state: {exc}") from exc
        modify_index = existing.modify_index if existing is not None else 0
        if existing is not None and not existing.dead:
            if not replace and suspension.is_waiting(existing.document) and not existing.stop:
                raise JobFailed(
                    f"job {self.job_id} already has a run waiting in the admission queue in namespace {self.api.namespace} "
                    f"(run {existing.run_id or '?'}); add --replace to take its place, or remove it first (nomadtf stop {self.job_id})"
                )
            if not replace:
                raise JobFailed(
                    f"job {self.job_id} is already running in namespace {self.api.namespace} (run {existing.run_id or '?'}); "
                    f"add --replace to stop it and start a new run, or stop it first (nomadtf stop {self.job_id})"
                )
            modify_index = self._stop_running(existing, notes)
        verdict = placement.check(self.api, job)
        if verdict.verdict == plan.NEVER:
            raise JobFailed(verdict.failure_text())
        suspended = bool(queued.controller_leader())
        if not suspended:
            notes.append(NO_CONTROLLER)
        registration = self._register(run_id, model_run, modify_index, suspended)
        self.discovery = discovery
        try:
            discovery.delete_job_keys(keep_run=run_id)  # earlier runs' state goes, never ours
        except ServerError as exc:
            notes.append(f"could not delete earlier runs' Consul keys (harmless: every run has its own): {exc}")
        first = max(versions_of_run(self.api.versions(self.job_id), run_id), default=0)
        return Submitted(
            self.job_id, self.api.namespace, "" if suspended else registration.eval_id, self.api.ui_url(self.job_id), run_id,
            first, notes, suspended, registration.job_modify_index,
        )  # fmt: skip

    def wait_for_admission(self, submitted: Submitted, wait: queued.AdmissionWait, detach: bool = False) -> queued.Waiting | None:
        """Until the controller admitted the suspended run (None), or, with `detach`, at
        once while it waits (its place). The errors of AdmissionWait.wait."""
        result = wait.wait(detach=detach)
        return result if isinstance(result, queued.Waiting) else None

    def _register(self, run_id: str, model_run: str, modify_index: int, suspended: bool) -> JobWrite:
        """Stamp the run as of now on the rendered job and register it (suspended:
        suspension.suspend), a check-and-set on `modify_index`.

        POST /v1/jobs (EnforceIndex) ; GET /v1/job/:job_id after a refusal"""
        job = render.stamp_run(self.rendered, self.spec, RunInfo(run_id, time.time(), model_run))
        admission = self.spec.admission
        # The tasks' rendezvous waits out an environment build too: so does the controller.
        ready_s = admission.ready_timeout_s + (self.spec.environment.timeout_s if self.spec.environment and admission.ready_timeout_s else 0.0)
        minimum = {role: least for role, (least, _) in self.spec.elastic.items()}
        body = suspension.suspend(job, admission.gang_timeout_s, ready_s, admission.requeue_limit, minimum) if suspended else job
        try:
            registered = self.api.register(body, modify_index=modify_index)
            self.registered = (run_id, suspended, registered.job_modify_index)
        except NomadError as exc:
            if exc.status != 409:
                raise
            current = (self.api.job(self.job_id) or Job(self.job_id)).run_id
            raise JobFailed(
                f"another submission of {self.job_id} in namespace {self.api.namespace} registered first"
                f" (run {current or '?'}); this run was not submitted. Follow that one (nomadtf status {self.job_id})"
                " or add --replace to stop it"
            ) from exc
        self.job = job
        return registered

    def _model_run(self, existing: Job | None, run_id: str, resume: bool, notes: list[str]) -> str:
        """Whose model_dir this run trains in: its own (fresh), or with `resume` the
        previous run's; a note says which checkpoint, when this machine can see it."""
        uses_run_dir = "${NOMADTF_RUN_ID}" in self.spec.model_dir
        if resume:
            previous = existing.run_id if existing else ""
            if not existing or not previous:
                raise UsageError(
                    f"--resume: job {self.job_id} has no earlier run in namespace {self.api.namespace} to continue"
                )
            model_run = existing.meta.get(wire.META_MODEL_RUN) or previous
            if not uses_run_dir:
                notes.append(f"--resume: model_dir {self.spec.model_dir} is the same for every run")
        else:
            model_run = run_id
        directory = client_model_dir(self.spec, self.api.namespace, model_run)
        step = checkpoint_step(directory) if directory else None
        if resume:
            where = f"from its checkpoint at step {step}" if step is not None else "from its latest checkpoint"
            notes.append(f"resuming run {model_run}: training continues in {directory or self.spec.model_dir} {where}")
        elif step is not None:
            notes.append(f"model_dir {directory} already holds a checkpoint at step {step}: training resumes from it")
        return model_run

    def _stop_running(self, existing: Job, notes: list[str]) -> int:
        """--replace: stop the running run and wait (bounded) for its allocations to stop.
        The job's JobModifyIndex after the stop (what this run's registration must find)."""
        stopped = self.api.stop(self.job_id)
        deadline = time.monotonic() + REPLACE_WAIT_S
        index = 0
        while time.monotonic() < deadline:
            allocs, index = self.api.watch_allocations(self.job_id, index, wait_s=min(5.0, deadline - time.monotonic()))
            if all(a.client_status not in ("pending", "running") for a in allocs):
                break
        if suspension.is_waiting(existing.document):
            notes.append(f"took the queued run {existing.run_id or '?'} of {self.job_id} out of the queue (--replace)")
        else:
            notes.append(f"stopped the running run {existing.run_id or '?'} of {self.job_id} (--replace)")
        return stopped.job_modify_index or (self.api.job(self.job_id) or Job(self.job_id)).modify_index

    def follow(
        self,
        submitted: Submitted,
        timeout_s: float | None,
        on_view: Callable[[JobView], None],
        on_event: Callable[[str], None],
        requeued: Callable[[], None] = lambda: None,
    ) -> Outcome:
        """Follow the run to its outcome (see follow.Follower); a run that failed is stopped,
        one that timed out keeps running on purpose. `timeout_s` None: the job's deadline.
        A run the admission controller gives back to the queue is waited for (`requeued`
        returns once it is admitted again) and followed again.

        DELETE /v1/job/:job_id after a failure ; GET /v1/client/fs/logs/:alloc_id at the end
        """
        while True:
            try:
                return self._follow_once(submitted, timeout_s, on_view, on_event)
            except Requeued as exc:
                on_event(f"{exc}: it waits for its turn again")
                requeued()

    def _follow_once(
        self, submitted: Submitted, timeout_s: float | None, on_view: Callable[[JobView], None], on_event: Callable[[str], None]
    ) -> Outcome:
        discovery = self.discovery or ConsulDiscovery(self.job_id, self.api.namespace, run_id=submitted.run_id)
        follower = Follower(
            self.api,
            self.job_id,
            timeout=timeout_s or self.spec.recovery.deadline_s,
            reschedule_attempts=self.spec.recovery.reschedule_attempts,
            on_view=on_view,
            on_event=on_event,
            progress=discovery.progress,
            recorded_state=discovery.job_state,
            first_version=submitted.first_version,
            # Each task's environment build (job.json `environment`) and what its child runs (any job).
            environments=discovery.environments,
            run_id=submitted.run_id,
        )
        try:
            view = follower.follow(submitted.eval_id)
        except (FollowTimeout, JobStopped):
            raise  # still running on purpose / already stopped by someone else
        except NomadtfError:
            # A failed job must not keep holding capacity: parameter servers and workers
            # would wait for a chief that will never succeed.
            self._stop_after_failure(submitted.run_id, on_event)
            raise
        return Outcome(view, final_lines(self.api, self.job_id, versions=follower.versions))

    def _stop_after_failure(self, run_id: str, on_event: Callable[[str], None]) -> None:
        """Stop the job while it still holds this run (never another run of the same name);
        a failure to stop is reported, the run's failure raised.

        GET /v1/job/:job_id ; DELETE /v1/job/:job_id"""
        try:
            job = self.api.job(self.job_id)
            if job is None or job.stop or (run_id and job.run_id != run_id):
                return
            self.api.stop(self.job_id)
        except ServerError as exc:
            on_event(f"could not stop {self.job_id}: {exc}")
            return
        on_event(f"stopped {self.job_id}")




def parse_scale(targets: list[str]) -> dict[str, int]:
    """["worker=3"] -> {"worker": 3}; UsageError naming the fix otherwise. Pure."""
    counts: dict[str, int] = {}
    for target in targets:
        role, _, number = target.partition("=")
        if role not in SCALABLE_ROLES or not number.isdigit():
            raise UsageError(f"scale target {target!r}: write ROLE=COUNT with ROLE one of {', '.join(SCALABLE_ROLES)}, e.g. worker=3")
        counts[role] = int(number)
    if not counts:
        raise UsageError("scale: name at least one target, e.g. worker=3")
    return counts


def scale_job(api: NomadAPI, job_id: str, counts: dict[str, int]) -> dict[str, int]:
    """Resize roles of a running run: the tasks learn the new counts from Consul first (so
    a shrinking cluster is complete at once and a growing one waits for its new members),
    then Nomad changes the groups. Returns the counts before.

    GET /v1/job/:job_id ; PUT /v1/kv/nomadtf/<ns>/<job>/<run>/cluster/counts ;
    POST /v1/job/:job_id/scale per role
    """
    job = require_nomadtf_job(api, job_id)
    if job.dead:
        raise JobFailed(f"job {job_id} is not running; nothing to scale")
    if suspension.is_waiting(job.document):
        raise JobFailed(f"job {job_id} waits in the admission queue; scale it once it runs (or run it again with --var)")
    groups = {g: n for g, n in suspension.group_counts(job.document).items() if g != suspension.PLACEHOLDER_GROUP}
    for role, count in counts.items():
        if role not in groups:
            raise UsageError(f"job {job_id} has no {role} group to scale")
        if count < 1:
            raise UsageError(f"{role}={count}: a running job needs at least one {role}; stop the job to end it")
    ConsulDiscovery(job_id, api.namespace, run_id=job.run_id).set_counts(counts)
    for role, count in counts.items():
        api.scale(job_id, role, count, f"nomadtf scale {role}={count}")
    return {role: groups[role] for role in counts}


def stop_job(api: NomadAPI, job_id: str, purge: bool = False) -> Job:
    """Stop a job nomadtf started (JobFailed for any other); purge also drops its Consul
    keys. The job as it was before the stop (a queued run leaves the queue so: the
    controller never scales a stopped job into running).

    GET /v1/job/:job_id ; DELETE /v1/job/:job_id?purge= ; DELETE /v1/kv/nomadtf/<ns>/<job>/?recurse
    """
    job = require_nomadtf_job(api, job_id)
    api.stop(job_id, purge=purge)
    if purge:
        ConsulDiscovery(job_id, api.namespace).delete_job_keys()
    return job
