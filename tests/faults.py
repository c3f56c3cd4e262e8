"""Fault injection on the local stack: find a job's processes, read its training step."""

from __future__ import annotations

import re
from pathlib import Path

from nomadtf.devstack.stack import pid_alive  # noqa: F401 - the one liveness check, re-exported for tests
from tests.helpers import allocations, task_log


def processes(job_id: str) -> dict[tuple[str, str, int], int]:
    """(kind, role, index) -> pid, kind "task" (nomadtf task) or "child" (TF / user code)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(
                item.split("=", 1)
                for item in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in item
            )
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if env.get("NOMAD_JOB_ID") != job_id:
            continue
        role = env.get("NOMADTF_ROLE", "?")
        if "nomadtf task" in cmdline:
            found[("task", role, int(env.get("NOMAD_ALLOC_INDEX", -1)))] = int(entry.name)
        elif "NOMADTF_INDEX" in env and ("TF_CONFIG" in env or "nomadtf.warmstart" in cmdline):
            # A child started ahead of the cluster got TF_CONFIG after it started: /proc shows
            # the environment it started with.
            found[("child", role, int(env["NOMADTF_INDEX"]))] = int(entry.name)
    return found


def restarts(job_id: str) -> dict[str, int]:
    out = {}
    for alloc in allocations(job_id):
        if alloc["ClientStatus"] == "running":
            out[alloc["Name"]] = sum(s.get("Restarts", 0) for s in (alloc.get("TaskStates") or {}).values())
    return out


def chief_stdout(job_id: str) -> str:
    return "\n".join(task_log(a["ID"], "chief") for a in allocations(job_id) if a["TaskGroup"] == "chief")


def step(job_id: str) -> int:
    steps = [int(s) for s in re.findall(r"step=(\d+)", chief_stdout(job_id))]
    return max(steps) if steps else 0
