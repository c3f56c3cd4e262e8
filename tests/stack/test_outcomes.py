"""True outcomes on the real stack: a run stopped from another shell (nomadtf stop, Nomad's
own stop, a colleague's --replace) is reported stopped with exit 4, never succeeded; two
`nomadtf run` of one name at the same moment: exactly one runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from tests.helpers import allocations, nomadtf, probe_job, purge, unique, wait_until, write_job

pytestmark = pytest.mark.stack

NOMADTF = str(Path(sys.executable).parent / "nomadtf")


def _start_run(job: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([NOMADTF, "run", str(job), "--timeout", "4m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _chief_running(job_id: str) -> bool:
    return any(a["TaskGroup"] == "chief" and a["ClientStatus"] == "running" for a in allocations(job_id))


def _nomad_job_stop(job_id: str) -> None:
    """What `nomad job stop` does: DELETE /v1/job/:job_id."""
    requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{job_id}", timeout=10).raise_for_status()


@pytest.mark.parametrize("how", ["nomadtf stop", "nomad job stop"])
def test_a_run_stopped_from_another_shell_is_reported_stopped(stack, tmp_path, how):
    name = unique("stopme")
    job = write_job(tmp_path, probe_job(name, context={"sleep": 120}))
    follower = _start_run(job)
    try:
        wait_until(lambda: _chief_running(name), 90, "the chief to run")
        if how == "nomadtf stop":
            stopped = nomadtf("stop", name)
            assert stopped.returncode == 0, stopped.stderr
        else:
            _nomad_job_stop(name)
        _out, err = follower.communicate(timeout=120)
        assert follower.returncode == 4, err
        assert "stopped from outside" in err and "succeeded" not in err, err
        status = nomadtf("status", name)
        assert status.returncode == 0, status.stderr
        assert "outcome: stopped" in status.stdout, status.stdout
    finally:
        follower.kill()
        purge(name)


def test_a_colleagues_replace_stops_the_run_being_followed_and_only_that_one(stack, tmp_path):
    name = unique("replaced")
    job = write_job(tmp_path, probe_job(name, context={"sleep": 120}))
    first = _start_run(job)
    try:
        wait_until(lambda: _chief_running(name), 90, "the first run's chief")
        short = write_job(tmp_path, probe_job(name, context={"sleep": 3}))  # the first run has read its file
        second = nomadtf("run", str(short), "--replace", "--timeout", "4m")
        _out, err = first.communicate(timeout=60)
        assert first.returncode == 4, err
        assert "stopped from outside" in err or "replaced by run" in err, err
        # The first follower never stopped (or followed) the colleague's run: it trained to its end.
        assert second.returncode == 0, second.stderr
        assert "succeeded" in second.stderr
    finally:
        first.kill()
        purge(name)


def test_two_runs_of_one_name_at_the_same_moment_exactly_one_runs(stack, tmp_path):
    name = unique("twins")
    job = write_job(tmp_path, probe_job(name, context={"sleep": 2}))
    results: list[subprocess.CompletedProcess] = []
    barrier = threading.Barrier(2)

    def launch() -> None:
        barrier.wait()
        results.append(nomadtf("run", str(job), "--timeout", "4m"))

    threads = [threading.Thread(target=launch) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        codes = sorted(r.returncode for r in results)
        text = "\n".join(r.stderr for r in results)
        assert codes == [0, 1], text
        refused = next(r for r in results if r.returncode == 1)
        said = refused.stderr
        assert "registered first" in said or "already running" in said or "already has a run waiting in the admission queue" in said, said
        # One run's allocations only: one chief ever placed.
        chiefs = [a for a in allocations(name) if a["TaskGroup"] == "chief"]
        assert len(chiefs) == 1, chiefs
    finally:
        purge(name)
