"""`nomadtf run` on a real terminal (tmux): the live table, then the outcome and exit code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import nomad, probe_job, purge, unique, wait_until, write_job

pytestmark = pytest.mark.stack


def _start_in_tmux(tmp_path, job_id: str, context: dict):
    """`nomadtf run` in a detached tmux session; returns (session, read-the-screen)."""
    assert shutil.which("tmux"), "tmux is needed (scripts/setup installs it)"
    job_file = write_job(tmp_path, probe_job(job_id, context=context))
    nomadtf = Path(sys.executable).parent / "nomadtf"
    session = f"nomadtf-{job_id}"
    command = f"{nomadtf} run {job_file}; echo EXIT=$?; sleep 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "40", command], check=True)

    def screen() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout

    return session, screen


def test_run_on_a_terminal_shows_a_live_table_per_role(stack, tmp_path):
    job_id = unique("tty")
    session, screen = _start_in_tmux(tmp_path, job_id, {"sleep": 6})
    try:
        table = wait_until(lambda: "┃ role" in screen() and screen(), 90, "the live table")
        for role in ("chief", "worker", "ps"):
            assert f"│ {role}" in table
        final = wait_until(lambda: "EXIT=" in screen() and screen(), 120, "the end of the run")
        assert "EXIT=0" in final and f"{job_id} succeeded" in final
        assert "┃ role" not in final  # the live table goes away and leaves the outcome
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        purge(job_id)


def test_ctrl_c_stops_following_and_leaves_the_job_running(stack, tmp_path):
    job_id = unique("ctrlc")
    session, screen = _start_in_tmux(tmp_path, job_id, {"sleep": -1})
    try:
        wait_until(lambda: "┃ role" in screen(), 90, "the live table")
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        final = wait_until(lambda: "EXIT=" in screen() and screen(), 30, "the run to end")
        assert "EXIT=130" in final and f"{job_id} keeps running" in final
        assert nomad(f"job/{job_id}")["Status"] == "running"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        purge(job_id)
