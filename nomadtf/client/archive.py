"""A run's archive read back (written by runtime/archive.py): what `nomadtf status` and
`nomadtf logs` show once Nomad has collected the job (purged, or its allocations gone).

The client reads the store's folder directly, so it must reach it: on the local stack it is
the same filesystem (/tmp/nomadtf/<namespace>); elsewhere mount the shared store where the
tasks see it, or name its root in NOMADTF_ARCHIVE (`${NOMAD_NAMESPACE}` is expanded), the
same folder as job.json `archive.folder`.

Usage:
    run = latest_run(archive_root("default", os.environ), "digits")   # None: nothing kept
    read_outcome(run); attempts(run, "chief", 0, "stdout")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nomadtf import wire
from nomadtf.job.taskfile import expand_task_vars
from nomadtf.job.validate import namespace_folder, schema


def archive_root(namespace: str, environ: Mapping[str, str]) -> str | None:
    """The store's root for `namespace`: NOMADTF_ARCHIVE, else the default model_dir's
    namespace folder (the tasks' default root). Pure."""
    given = environ.get(wire.ENV_ARCHIVE_ROOT)
    if given:
        return expand_task_vars(given, {wire.ENV_NOMAD_NAMESPACE: namespace})
    default = schema()["properties"]["model_dir"]["default"]
    return namespace_folder(default, namespace)


def latest_run(root: str | None, job_id: str, run_id: str = "") -> Path | None:
    """The archive folder of `run_id`, or of the job's newest run that left one."""
    if not root:
        return None
    base = Path(root) / job_id
    if run_id:
        folder = base / run_id / wire.ARCHIVE_DIR
        return folder if folder.is_dir() else None
    try:
        runs = [path for path in base.glob(f"*/{wire.ARCHIVE_DIR}") if path.is_dir()]
    except OSError:
        return None
    return max(runs, key=lambda path: path.stat().st_mtime, default=None)


def read_outcome(run: Path) -> dict[str, Any] | None:
    """outcome.json, or None while nobody recorded one (or it cannot be read)."""
    try:
        return json.loads((run / wire.ARCHIVE_OUTCOME_FILE).read_text())
    except (OSError, ValueError):
        return None


def tasks(run: Path) -> list[str]:
    """The tasks that kept output: ["chief-0", "worker-0", ...]."""
    return sorted(path.name for path in run.iterdir() if path.is_dir())


def attempts(run: Path, role: str, index: int | None, stream: str) -> list[tuple[str, str]]:
    """(task/attempt, text) of every kept attempt of the matching tasks, oldest first."""
    found = []
    for task in tasks(run):
        name, _, number = task.rpartition("-")
        if name != role or (index is not None and number != str(index)):
            continue
        for path in sorted((run / task).glob(f"*.{stream}")):
            found.append((f"{task}/{path.name.rsplit('.', 1)[0]}", path.read_text(errors="replace")))
    return found


def describe_outcome(record: dict[str, Any]) -> list[str]:
    """The lines `status` prints for an archived run. Pure."""
    reason = f": {record['reason']}" if record.get("reason") else ""
    duration = f"  {record['duration_s']:.0f}s" if record.get("duration_s") is not None else ""
    lines = [f"  outcome: {record.get('outcome')}{reason}  (recorded by {record.get('recorded_by')}){duration}"]
    metrics = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in (record.get("metrics") or {}).items())
    if record.get("step") is not None or metrics:
        lines.append(f"  step {record.get('step')}  {metrics}".rstrip())
    return lines
