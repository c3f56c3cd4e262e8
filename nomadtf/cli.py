"""The command line. Arguments -> core calls -> output and exit codes.

The only module that prints or exits. Every NomadtfError becomes one line (or a short
block) on stderr and its exit code; tracebacks only with --debug.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from nomadtf.errors import NomadtfError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Deploy and supervise distributed TensorFlow training on HashiCorp Nomad.",
    pretty_exceptions_enable=False,
)
dev_app = typer.Typer(no_args_is_help=True, help="The local Nomad + Consul + OpenBao stack for trying nomadtf.")
app.add_typer(dev_app, name="dev")

_state = {"debug": False}

JobFile = Annotated[Path, typer.Argument(help="job.json (or .yaml)", show_default=False)]
Vars = Annotated[Optional[list[str]], typer.Option("--var", help="Override a field: path=value (repeatable)")]
TemplatesDir = Annotated[Optional[Path], typer.Option("--templates", help="Render with your own copies of the templates")]


def _err(message: str) -> None:
    typer.echo(message, err=True)


def _stamp(message: str) -> None:
    _err(f"{time.strftime('%H:%M:%S')} {message}")


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks")] = False) -> None:
    _state["debug"] = debug


# ---- dev stack -------------------------------------------------------------------------


@dev_app.command("up")
def dev_up(timeout: Annotated[float, typer.Option(help="Seconds to wait for each server")] = 120.0) -> None:
    """Build or find the binaries and start Consul, OpenBao and Nomad on 127.0.0.1."""
    from nomadtf.devstack.stack import DevStack

    stack = DevStack.default()
    started = time.monotonic()
    if not stack.up(progress=_stamp, timeout=timeout):
        _err(f"the local stack is already up ({stack.state_dir})")
        return
    _err(f"local stack up in {time.monotonic() - started:.1f}s; state in {stack.state_dir}")
    _err('use it from a shell with: eval "$(nomadtf dev env)"')


@dev_app.command("down")
def dev_down() -> None:
    """Stop what `dev up` started and remove its state."""
    from nomadtf.devstack.stack import DevStack

    stack = DevStack.default()
    stack.down(progress=_stamp)
    _err("local stack stopped")


@dev_app.command("status")
def dev_status() -> None:
    """What runs, where, and where its log is."""
    from nomadtf.devstack.stack import DevStack

    rows = DevStack.default().status()
    if not rows:
        typer.echo("local stack: not running")
        raise typer.Exit(1)
    for row in rows:
        typer.echo(f"{row['component']:<8} {row['state']:<8} pid {row['pid']:<7} {row['address']:<24} log {row['log']}")
    if any(r["state"] != "running" for r in rows):
        raise typer.Exit(1)


@dev_app.command("env")
def dev_env() -> None:
    """Print export lines for a shell: eval "$(nomadtf dev env)"."""
    from nomadtf.devstack.stack import DevStack

    for key, value in DevStack.default().env().items():
        typer.echo(f"export {key}={value}")


# ---- inside an allocation ---------------------------------------------------------------


@app.command(hidden=True)
def task(role: Annotated[str, typer.Option("--role", help="chief, worker, ps, evaluator or tensorboard")]) -> None:
    """The supervisor inside every allocation of a rendered job (not for interactive use)."""
    import logging

    from nomadtf.task import run_task

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s nomadtf task {role}: %(message)s",
        datefmt="%H:%M:%S",
    )
    raise typer.Exit(run_task(role))


# ---- rendering ---------------------------------------------------------------------------


@app.command()
def render(
    job_file: JobFile,
    var: Vars = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write to this file instead of stdout")] = None,
    tf_config: Annotated[bool, typer.Option("--tf-config", help="Show every task's TF_CONFIG instead")] = False,
    templates: TemplatesDir = None,
) -> None:
    """Render job.json into the Nomad job (API JSON). Offline."""
    from nomadtf import cluster, render as render_mod, spec as spec_mod

    spec = spec_mod.load_spec(job_file, var or [])
    if tf_config:
        configs = cluster.all_tf_configs(spec["name"], spec["strategy"], spec_mod.role_counts(spec))
        text = json.dumps(configs, indent=2, sort_keys=True) + "\n"
    else:
        text = render_mod.job_json(render_mod.render_job(spec, templates))
    if out:
        out.write_text(text)
        _err(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


@app.command()
def validate(job_file: JobFile, var: Vars = None, templates: TemplatesDir = None) -> None:
    """Check job.json (schema, cross-field rules), then Nomad's own validation if reachable."""
    from nomadtf import render as render_mod, spec as spec_mod
    from nomadtf.errors import UnreachableError
    from nomadtf.nomad import NomadAPI

    spec = spec_mod.load_spec(job_file, var or [])
    job = render_mod.render_job(spec, templates)
    typer.echo(f"{job_file}: valid ({spec['strategy']}, roles {spec_mod.role_counts(spec)})")
    api = NomadAPI.from_env()
    try:
        result = api.validate(job)
    except UnreachableError as exc:
        typer.echo(f"Nomad validation skipped: {exc}")
        return
    errors = result.get("ValidationErrors") or []
    if result.get("Error") or errors:
        raise NomadtfError("Nomad rejected the job:\n  " + "\n  ".join(errors or [result["Error"]]))
    for warning in filter(None, (result.get("Warnings") or "").split("\n")):
        typer.echo(f"Nomad warning: {warning}")
    typer.echo(f"Nomad at {api.address}: valid")


@app.command()
def plan(job_file: JobFile, var: Vars = None, templates: TemplatesDir = None) -> None:
    """Nomad's plan for the job. Exit 0: no change; 1: changes or placement problems; 255: error."""
    from nomadtf import plan as plan_mod, render as render_mod, spec as spec_mod
    from nomadtf.nomad import NomadAPI

    try:
        spec = spec_mod.load_spec(job_file, var or [])
        job = render_mod.render_job(spec, templates)
        result = NomadAPI.from_env().plan(job)
    except NomadtfError as exc:
        _err(str(exc) if not _state["debug"] else repr(exc))
        raise typer.Exit(255) from exc
    summary = plan_mod.describe_plan(result, job["Job"])
    typer.echo("\n".join(summary.lines))
    raise typer.Exit(1 if summary.changes or summary.failures else 0)


def main() -> None:
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except NomadtfError as exc:
        if _state["debug"]:
            raise
        _err(f"error: {exc}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _err("aborted")
        sys.exit(130)
    except Exception as exc:  # click's usage errors and anything unexpected
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if _state["debug"]:
            raise
        _err(f"unexpected error: {exc.__class__.__name__}: {exc} (run with --debug for the traceback)")
        sys.exit(70)
