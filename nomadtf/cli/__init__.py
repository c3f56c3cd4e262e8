"""The command line: arguments -> core calls -> output and exit codes.

The only package that prints or exits. Every NomadtfError becomes one line (or a short
block) on stderr and its exit code; tracebacks only with --debug. One module per command
group: `jobs` (run, status, logs, ... at the top level), `dev`, `acl`, `env`, `admission`;
`display` is the terminal view of a run, `common` the option types they share.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from nomadtf.cli import jobs
from nomadtf.cli.acl import acl_app
from nomadtf.cli.admission import admission_app, usage
from nomadtf.cli.common import err, state
from nomadtf.cli.dev import dev_app
from nomadtf.cli.env import env_app
from nomadtf.errors import NomadtfError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Deploy and supervise distributed TensorFlow training on HashiCorp Nomad.",
    pretty_exceptions_enable=False,
)
app.add_typer(dev_app, name="dev")
app.add_typer(env_app, name="env")
app.add_typer(acl_app, name="acl")
app.add_typer(admission_app, name="admission")
jobs.register(app)
app.command()(usage)

@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks")] = False) -> None:
    state["debug"] = debug


def main() -> None:
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except NomadtfError as exc:
        if state["debug"]:
            raise
        err(f"error: {exc}")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err("aborted")
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: a wrong option, a missing argument
        show = getattr(exc, "show", None)
        if show:
            show()
        else:
            err(f"error: {exc}")
        sys.exit(getattr(exc, "exit_code", 2))
    except Exception as exc:  # anything unexpected: one line, the traceback only with --debug
        if state["debug"]:
            raise
        err(f"unexpected error: {exc.__class__.__name__}: {exc} (run with --debug for the traceback)")
        sys.exit(70)
