"""What every command group shares: the option types, stderr lines, the --debug flag."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

state = {"debug": False}  # --debug: show tracebacks

JobFile = Annotated[Path, typer.Argument(help="job.json (or .yaml)", show_default=False)]
Vars = Annotated[Optional[list[str]], typer.Option("--var", help="Override a field: path=value (repeatable)")]
TemplatesDir = Annotated[
    Optional[Path],
    typer.Option(
        "--templates",
        help="Render with your own copies of the templates. They are trusted code: unsandboxed Jinja2 "
        "with nomadtf's wire module in reach, run with your tokens in the environment",
    ),
]
NomadVersion = Annotated[
    Optional[str],
    typer.Option(
        "--nomad-version",
        help="Render for this Nomad (e.g. 2.0.5: workload identity for Vault); default NOMADTF_NOMAD_VERSION, "
        "the cluster profile's, else 1.6. See docs/nomad-versions.md",
    ),
]
Namespace = Annotated[
    Optional[str], typer.Option("--namespace", help="Nomad namespace ('*' lists all); default NOMAD_NAMESPACE or default")
]
Region = Annotated[Optional[str], typer.Option("--region", help="Nomad region; default NOMAD_REGION or the agent's")]


def err(message: str) -> None:
    typer.echo(message, err=True)


def stamp(message: str) -> None:
    err(f"{time.strftime('%H:%M:%S')} {message}")
