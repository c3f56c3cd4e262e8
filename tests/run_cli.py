"""Run the real `nomadtf` command line in a child process, as a user runs it.

The child goes through `nomadtf.cli.main`, so exit codes and stderr are exactly what a
user sees (typer's CliRunner would skip the error boundary in `main`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def nomadtf(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nomadtf", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        timeout=60,
    )
