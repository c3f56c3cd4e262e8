"""`nomadtf env`: the job environments cached on this Nomad client (job.json `environment`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

env_app = typer.Typer(no_args_is_help=True, help="The job environments cached on this Nomad client (job.json `environment`).")

EnvDir = Annotated[
    Optional[Path], typer.Option("--dir", help="The cache of environments; default NOMADTF_ENV_DIR, else ~/.cache/nomadtf/envs")
]


def _venv_cache(directory: Path | None):
    import os

    from nomadtf.runtime.venvcache import VenvCache
    from nomadtf.venvs import default_root

    return VenvCache(directory or default_root(dict(os.environ)))


def _age_s(text: str) -> float:
    """--older-than in seconds (nomadtf.durations: 7d, 12h, 30m, 2w)."""
    from nomadtf.durations import DurationError, parse_seconds
    from nomadtf.errors import NomadtfError

    try:
        seconds: float | None = parse_seconds(text)
    except DurationError:
        seconds = None
    if seconds is None or seconds < 0:
        raise NomadtfError(f"--older-than: {text!r} is not an age; write e.g. 7d, 12h or 30m")
    return seconds


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@env_app.command("list")
def env_list(directory: EnvDir = None) -> None:
    """The environments on this client: key, Python, last use, in use, requirements."""
    cache = _venv_cache(directory)
    entries = cache.entries()
    if not entries:
        typer.echo(f"no environments in {cache.root}")
        return
    now = time.time()
    for entry in entries:
        marker = entry.marker
        typer.echo(
            f"{entry.key}  python {marker.get('python_version', '?')}  last used {_ago(now - entry.last_used)} ago"
            f"  {'in use' if cache.in_use(entry.key) else 'idle'}  built in {marker.get('build_s', '?')}s"
            f"  {', '.join(marker.get('requirements', []))}"
        )


@env_app.command("gc")
def env_gc(
    older_than: Annotated[str, typer.Option("--older-than", help="Remove environments unused for longer than this (7d, 12h, 30m)")] = "7d",
    directory: EnvDir = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be removed")] = False,
) -> None:
    """Remove environments unused for longer than --older-than; never one a task uses."""
    cache = _venv_cache(directory)
    removed, busy = cache.gc(_age_s(older_than), dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for entry in removed:
        typer.echo(f"{verb} {entry.key} ({', '.join(entry.marker.get('requirements', []))})")
    for entry in busy:
        typer.echo(f"kept {entry.key}: in use by a task")
    typer.echo(f"{verb} {len(removed)} environment(s) from {cache.root}; {len(busy)} in use")
