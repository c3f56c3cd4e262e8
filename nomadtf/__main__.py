"""`python -m nomadtf` is the same as the `nomadtf` console script (tasks use this form)."""

import os
import signal
import sys

# Before anything is imported: a SIGHUP (a template re-render, `nomad alloc signal`) that
# arrives while the interpreter is still starting must not end the task with exit 129.
# The runtime installs its own handler once it runs (nomadtf.runtime.loop).
signal.signal(signal.SIGHUP, signal.SIG_IGN)

if sys.argv[1:2] == ["task"] and os.environ.get("NOMAD_PORT_health", "").isdigit():
    # A task answers its health check before the runtime (about 0.3 s of imports) loads:
    # the whole cluster's rendezvous waits for every task's first passing check.
    from nomadtf.usercode import health

    try:
        health.serve(int(os.environ["NOMAD_PORT_health"]))
    except OSError:
        pass  # the supervisor tries again and reports it


def _task_role(argv: list[str]) -> str | None:
    """ROLE when argv is exactly a rendered job's `task --role ROLE`, else None."""
    if argv[:2] == ["task", "--role"] and len(argv) == 3:
        return argv[2]
    if len(argv) == 2 and argv[0] == "task" and argv[1].startswith("--role="):
        return argv[1].removeprefix("--role=")
    return None


role = _task_role(sys.argv[1:])
if role is not None:
    # Inside an allocation: straight to the runtime, without the command line's imports
    # (typer and rich); run_task ends the task as `nomadtf.cli.main` would end it.
    from nomadtf.runtime import run_task

    sys.exit(run_task(role))

from nomadtf.cli import main  # noqa: E402 - after the signal disposition, on purpose

main()
