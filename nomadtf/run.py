"""The client-side use case of `nomadtf run`: load → render → submit → follow → stop on
failure → outcome, and `nomadtf stop`.

Every Nomad call of a run goes to the namespace and region its job.json names. Nothing here
prints: what happens is handed to the caller's callbacks, and failures are raised.

Usage:
    run = Run.prepare(Path("job.json"), ["roles.worker.count=4"])
    submitted = run.submit()
    outcome = run.follow(submitted, timeout_s=None, on_view=show, on_event=log)
    outcome.final_lines   # ["chief: final_accuracy=0.93"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nomadtf import render, spec
from nomadtf.discovery import ConsulDiscovery
from nomadtf.errors import FollowTimeout, JobFailed, NomadtfError, ServerError
from nomadtf.follow import Follower, JobView, final_lines, require_nomadtf_job
from nomadtf.nomad import NomadAPI


@dataclass(frozen=True)
class Submitted:
    job_id: str
    namespace: str
    eval_id: str
    ui_url: str


@dataclass(frozen=True)
class Outcome:
    view: JobView
    final_lines: list[str]


class Run:
    """One run of one job.json, from the options file to the training's outcome."""

    def __init__(self, spec: dict[str, Any], job: dict[str, Any], api: NomadAPI, discovery: ConsulDiscovery):
        self.spec = spec
        self.job = job
        self.api = api
        self.discovery = discovery
        self.job_id: str = spec["name"]

    @classmethod
    def prepare(cls, job_file: Path, variables: list[str], templates: Path | None = None) -> Run:
        """Load and render (offline); the clients speak to the job's namespace and region."""
        normalised = spec.load_spec(job_file, variables)
        job = render.render_job(normalised, templates)
        api = NomadAPI.from_env(namespace=normalised["namespace"], region=normalised["region"])
        return cls(normalised, job, api, ConsulDiscovery(normalised["name"], normalised["namespace"]))

    def submit(self) -> Submitted:
        """Validate with Nomad, refuse to clobber a running job, clear the job's old KV state,
        register. Nothing is sent unless every check passed.

        POST /v1/validate/job ; GET /v1/job/:job_id ; DELETE /v1/kv/nomadtf/<ns>/<job>/?recurse ;
        POST /v1/jobs
        """
        self.api.validate(self.job)
        existing = self.api.job(self.job_id)
        if existing and existing.get("Status") != "dead":
            raise JobFailed(
                f"job {self.job_id} is already running; stop it first (nomadtf stop {self.job_id}) or pick another name"
            )
        try:
            self.discovery.delete_job_keys()  # a previous run's state must not leak into this one
        except ServerError as exc:
            raise ServerError(f"Consul is needed for the job's state: {exc}") from exc
        registered = self.api.register(self.job)
        return Submitted(self.job_id, self.api.namespace, registered["EvalID"], self.api.ui_url(self.job_id))

    def follow(
        self,
        submitted: Submitted,
        timeout_s: float | None,
        on_view: Callable[[JobView], None],
        on_event: Callable[[str], None],
    ) -> Outcome:
        """Follow the job to its outcome (see follow.Follower); a job that failed is stopped,
        one that timed out keeps running on purpose. `timeout_s` None: the job's deadline.

        DELETE /v1/job/:job_id after a failure ; GET /v1/client/fs/logs/:alloc_id at the end
        """
        follower = Follower(
            self.api,
            self.job_id,
            timeout=timeout_s or spec.duration_seconds(self.spec["recovery"]["deadline"]),
            reschedule_attempts=self.spec["recovery"]["reschedule_attempts"],
            on_view=on_view,
            on_event=on_event,
            progress=self.discovery.progress,
            recorded_state=self.discovery.job_state,
        )
        try:
            view = follower.follow(submitted.eval_id)
        except FollowTimeout:
            raise
        except NomadtfError:
            # A failed job must not keep holding capacity: parameter servers and workers
            # would wait for a chief that will never succeed.
            self._stop_after_failure(on_event)
            raise
        return Outcome(view, final_lines(self.api, self.job_id))

    def _stop_after_failure(self, on_event: Callable[[str], None]) -> None:
        """DELETE /v1/job/:job_id ; a failure to stop is reported, the job's failure raised."""
        try:
            self.api.stop(self.job_id)
        except ServerError as exc:
            on_event(f"could not stop {self.job_id}: {exc}")
            return
        on_event(f"stopped {self.job_id}")


def stop_job(api: NomadAPI, job_id: str, purge: bool = False) -> None:
    """Stop a job nomadtf started (JobFailed for any other); purge also drops its Consul keys.

    GET /v1/job/:job_id ; DELETE /v1/job/:job_id?purge= ; DELETE /v1/kv/nomadtf/<ns>/<job>/?recurse
    """
    require_nomadtf_job(api, job_id)
    api.stop(job_id, purge=purge)
    if purge:
        ConsulDiscovery(job_id, api.namespace).delete_job_keys()
