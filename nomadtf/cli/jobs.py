"""The job commands: run, status, logs, scale, stop, render, validate, plan, convert-dcos,
and `task` (what every allocation runs)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from nomadtf.cli.common import JobFile, Namespace, NomadVersion, Region, TemplatesDir, Vars, err, stamp, state
from nomadtf.cli.display import Display
from nomadtf.errors import JobNotFound, NoAllocation, NomadtfError


def register(app: typer.Typer) -> None:
    """The job commands sit at the top level (`nomadtf run`, not `nomadtf jobs run`)."""
    for command in (task, run, status, logs, scale, stop, render, validate, plan):
        hidden = command is task
        app.command(hidden=hidden)(command)
    app.command("convert-dcos")(convert_dcos)


def task(role: Annotated[str, typer.Option("--role", help="chief, worker, ps, evaluator, tensorboard, data_dispatcher or data_worker")]) -> None:
    """The supervisor inside every allocation of a rendered job (not for interactive use)."""
    from nomadtf.runtime import run_task

    raise typer.Exit(run_task(role, debug=state["debug"]))


def run(
    job_file: JobFile,
    var: Vars = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once Nomad accepted the job (or, with an admission controller, once it is queued)")] = False,
    timeout: Annotated[Optional[str], typer.Option("--timeout", help="Give up after this long (e.g. 30m), exit 3: a run still queued is removed, a running one goes on")] = None,
    on_interrupt: Annotated[str, typer.Option("--on-interrupt", help="What Ctrl-C does to a run waiting in the queue: remove it, or leave it queued for the admission controller")] = "remove",
    templates: TemplatesDir = None,
    replace: Annotated[bool, typer.Option("--replace", help="Stop a run of this job that is still going, then start this one")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint of the job's previous run")] = False,
) -> None:
    """Validate, render, submit a new run, and follow it to its outcome.

    A run that does not fit now waits in the cluster's queue and says what it waits for
    (docs/guide/queueing.md); one that can never fit fails at once.

    Exit codes: 0 succeeded, 1 failed, 2 bad job.json, 3 --timeout passed (a queued run is
    removed, a running one goes on), 4 stopped from outside, 5 past recovery.deadline,
    6 lost, 130 interrupted (a running run goes on; a queued one as --on-interrupt says).
    """
    from nomadtf.client.queued import LEAVE, REMOVE, AdmissionWait
    from nomadtf.client.run import Run

    if on_interrupt not in (REMOVE, LEAVE):
        raise typer.BadParameter(f"{on_interrupt!r}: write {REMOVE} or {LEAVE}", param_hint="--on-interrupt")
    timeout_s = _timeout_s(timeout) if timeout else None
    started = time.monotonic()
    job_run = Run.from_job_file(job_file, var or [], templates)
    if job_run.unreachable is not None:
        raise job_run.unreachable  # one clear line, not a note about the version first
    for note in job_run.notes:  # before anything is sent, also for a run that will wait in the queue
        stamp(note)
    try:
        submitted = job_run.submit(replace=replace, resume=resume)
    except KeyboardInterrupt:
        if job_run.registered is None or not job_run.registered[1]:
            raise  # nothing registered yet, or a plain run: it goes on as Nomad placed it
        run_id, _, index = job_run.registered
        raise AdmissionWait(job_run.api, job_run.job_id, run_id, on_interrupt=on_interrupt, registered_index=index).interrupted() from None
    job_id = submitted.job_id
    where = "" if submitted.namespace == "default" else f" --namespace {submitted.namespace}"
    for note in submitted.notes:
        stamp(note)

    def admission_wait() -> AdmissionWait:
        left = None if timeout_s is None else max(1.0, timeout_s - (time.monotonic() - started))
        return AdmissionWait(
            job_run.api, job_id, submitted.run_id, on_status=lambda s: stamp(f"queued: {s.describe()}"), on_event=stamp,
            timeout_s=left, on_interrupt=on_interrupt, registered_index=submitted.registered_index,
        )  # fmt: skip

    if submitted.suspended:
        stamp(f"submitted {job_id} run {submitted.run_id}, suspended for the admission controller; Nomad UI: {submitted.ui_url}")
        waiting = job_run.wait_for_admission(submitted, admission_wait(), detach=detach)
        if waiting is not None:
            place = f" at place {waiting.place} of {waiting.length}" if waiting.place else ""
            stamp(f"queued {job_id} run {submitted.run_id}{place}; the admission controller starts it in its turn")
            typer.echo(f"see it with: nomadtf status {job_id}{where}  |  remove it with: nomadtf stop {job_id}{where}")
            return
        stamp(f"admitted {job_id} run {submitted.run_id}")
    else:
        stamp(f"submitted {job_id} run {submitted.run_id} (evaluation {submitted.eval_id[:8]}); Nomad UI: {submitted.ui_url}")
    if timeout_s is not None:  # one --timeout for the wait in the queue and the run together
        timeout_s = max(1.0, timeout_s - (time.monotonic() - started))
    if detach:
        typer.echo(f"follow it with: nomadtf status {job_id}{where}  |  nomadtf logs {job_id}{where} --role chief --follow")
        return
    display = Display()
    try:
        outcome = job_run.follow(
            submitted, timeout_s, on_view=display.view, on_event=display.event,
            requeued=lambda: job_run.wait_for_admission(submitted, admission_wait()),
        )  # fmt: skip
    except KeyboardInterrupt:
        display.close()
        err(f"stopped following; {job_id} keeps running (nomadtf status {job_id}{where}, nomadtf stop {job_id}{where})")
        raise typer.Exit(130) from None
    finally:
        display.close()
    for line in outcome.final_lines:
        typer.echo(line)
    stamp(f"{job_id} succeeded in {outcome.view.elapsed:.0f}s")


def _timeout_s(text: str) -> float:
    from nomadtf.durations import DurationError, parse_seconds
    from nomadtf.errors import SpecError

    try:
        seconds = parse_seconds(text)
    except DurationError as exc:
        raise SpecError(f"--timeout: {exc}") from None
    if seconds < 0:
        raise SpecError(f"--timeout: {text!r} is negative; write e.g. 30m")
    return seconds


def status(
    job_id: Annotated[Optional[str], typer.Argument(help="One job in detail")] = None,
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """The jobs nomadtf started (matched by their Meta), or one of them in detail."""
    from nomadtf.client import status as statuses

    lines = statuses.overview(namespace, region) if job_id is None else statuses.job_status(job_id, namespace, region)
    for line in lines:
        typer.echo(line)


def logs(
    job_id: Annotated[str, typer.Argument(help="Job ID")],
    role: Annotated[str, typer.Option("--role", help="Role whose task logs to show")] = "chief",
    index: Annotated[Optional[int], typer.Option("--index", help="Task index within the role")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="stderr instead of stdout")] = False,
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """A task's logs through Nomad's API (also after the job finished, until Nomad's GC)."""
    from nomadtf.client import status as statuses
    from nomadtf.client.readback import log_allocations
    from nomadtf.servers.nomad import NomadAPI

    api = NomadAPI.from_env(namespace=namespace, region=region)
    stream = "stderr" if stderr else "stdout"
    # Every attempt of the slot in the current run (a replacement never hides the one that
    # trained); following streams the newest. Once Nomad has collected them: the archive (never
    # after a refusal: a token that may not read the job may not read its archive through us).
    try:
        allocs = log_allocations(api, job_id, role, index, newest_only=follow)
    except (JobNotFound, NoAllocation):
        kept = statuses.archived_logs(job_id, api.namespace, role, index, stream)
        if kept is None:
            raise
        err(kept.note)
        for name, text in kept.attempts:
            if len(kept.attempts) > 1:
                typer.echo(f"==> {name}")
            typer.echo(text, nl=False)
        return
    for alloc in allocs:
        if len(allocs) > 1:
            typer.echo(f"==> {alloc.name} ({alloc.id[:8]}, {alloc.client_status})")
        if follow:
            for chunk in api.follow_logs(alloc.id, role, stream):
                typer.echo(chunk, nl=False)
        else:
            typer.echo(api.logs(alloc.id, role, stream), nl=False)


def scale(
    job_id: Annotated[str, typer.Argument(help="Job ID")],
    targets: Annotated[list[str], typer.Argument(help="ROLE=COUNT, e.g. worker=3", show_default=False)],
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """Resize the workers of a running job; the chief restarts once from its checkpoint."""
    from nomadtf.client.run import parse_scale, scale_job
    from nomadtf.servers.nomad import NomadAPI

    counts = parse_scale(targets)
    before = scale_job(NomadAPI.from_env(namespace=namespace, region=region), job_id, counts)
    for role, count in counts.items():
        typer.echo(f"{job_id}: {role} {before[role]} -> {count}")


def stop(
    job_id: Annotated[str, typer.Argument(help="Job ID")],
    purge: Annotated[bool, typer.Option("--purge", help="Also remove it from Nomad and its keys from Consul")] = False,
    namespace: Namespace = None,
    region: Region = None,
) -> None:
    """Stop a nomadtf job (a queued run leaves the queue); nothing else is touched."""
    from nomadtf.client import status as statuses

    for line in statuses.stop(job_id, namespace, region, purge):
        typer.echo(line)


def render(
    job_file: JobFile,
    var: Vars = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout")] = None,
    tf_config: Annotated[bool, typer.Option("--tf-config", help="Show every task's TF_CONFIG instead (strategy jax: its JAX environment)")] = False,
    templates: TemplatesDir = None,
    nomad_version: NomadVersion = None,
) -> None:
    """Render job.json into the Nomad job (API JSON) for a Nomad version. Offline."""
    from nomadtf import jaxenv, roles, tfconfig
    from nomadtf.client import cluster_facts
    from nomadtf.job import render as render_mod
    from nomadtf.job.options import load_options
    from nomadtf.job.spec import parse_spec

    facts = cluster_facts.offline(nomad_version)
    for note in facts.notes:
        err(note)
    spec = parse_spec(facts.fill(load_options(job_file, var or [])))
    if tf_config and not roles.uses_tf_config(spec.strategy):
        text = json.dumps(jaxenv.all_process_envs(spec.name, spec.strategy, spec.counts), indent=2, sort_keys=True) + "\n"
    elif tf_config:
        configs = tfconfig.all_tf_configs(spec.name, spec.strategy, spec.counts)
        text = json.dumps(configs, indent=2, sort_keys=True) + "\n"
    else:
        text = render_mod.job_json(render_mod.render_job(spec, templates, target=facts.target))
        for note in render_mod.rendering_notes(spec, facts.target):
            err(note)
    if out:
        out.write_text(text)
        err(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


def validate(job_file: JobFile, var: Vars = None, templates: TemplatesDir = None) -> None:
    """Check job.json (schema, cross-field rules), then Nomad's own validation if reachable."""
    from nomadtf.client.run import Run
    from nomadtf.errors import UnreachableError
    from nomadtf.job.render import docker_image_needs

    job_run = Run.from_job_file(job_file, var or [], templates)
    for note in job_run.notes:
        err(note)
    typer.echo(f"{job_file}: valid ({job_run.spec.strategy}, roles {job_run.spec.counts})")
    for line in docker_image_needs(job_run.spec):
        typer.echo(line)
    try:
        warnings = job_run.api.validate(job_run.job)
    except UnreachableError as exc:
        typer.echo(f"Nomad validation skipped: {exc}")
        return
    for warning in warnings:
        typer.echo(f"Nomad warning: {warning}")
    typer.echo(f"Nomad at {job_run.api.address}: valid")
    typer.echo(_placement_line(job_run))


def _placement_line(job_run) -> str:
    """Whether the job fits now, later (it would queue) or never, from Nomad's plan."""
    from nomadtf.client import placement as placements
    from nomadtf.errors import ServerError
    from nomadtf.job import plan as plan_mod

    try:
        placement = placements.check(job_run.api, job_run.job)
    except ServerError as exc:
        return f"placement not checked: {exc}"
    if placement.verdict == plan_mod.FITS:
        return "placement: it fits now"
    if placement.verdict == plan_mod.NOT_NOW:
        return "placement: it does not fit now (capacity in use); nomadtf run queues it until enough is free"
    return f"placement: it can never fit: {placement.why_never}"


def plan(job_file: JobFile, var: Vars = None, templates: TemplatesDir = None) -> None:
    """Nomad's plan for the job. Exit 0: no change; 1: changes or placement problems; 255: error."""
    from nomadtf.client import placement as placements
    from nomadtf.client.run import Run
    from nomadtf.job import plan as plan_mod

    try:
        job_run = Run.from_job_file(job_file, var or [], templates)
        if job_run.unreachable is not None:
            raise job_run.unreachable
        for note in job_run.notes:
            err(note)
        result = job_run.api.plan(job_run.job)
        placement = placements.classify(job_run.api, result, job_run.job)
    except NomadtfError as exc:
        err(str(exc) if not state["debug"] else repr(exc))
        raise typer.Exit(255) from exc
    summary = plan_mod.describe_plan(result, job_run.job["Job"], placement)
    typer.echo("\n".join(summary.lines))
    raise typer.Exit(1 if summary.changes or summary.failures else 0)


def convert_dcos(
    options_file: Annotated[Path, typer.Argument(help="options.json of the DC/OS beta-tensorflow package", show_default=False)],
    out: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout")] = None,
) -> None:
    """Convert a DC/OS beta-tensorflow options file into a nomadtf job.json. Offline."""
    from nomadtf.job import dcos
    from nomadtf.job.options import read_options
    from nomadtf.job.validate import normalize

    conversion = dcos.convert_options(read_options(options_file))
    for note in conversion.notes:
        err(f"not carried over: {note}")
    normalize(conversion.job)
    text = json.dumps(conversion.job, indent=2) + "\n"
    if out:
        out.write_text(text)
        err(f"wrote {out}")
    else:
        typer.echo(text, nl=False)
