"""A job's whole life on the real stack: the end of a job is as clean as its start."""

from __future__ import annotations

import time

import pytest

from tests.helpers import allocations, nomadtf, probe_job, purge, unique, write_job

pytestmark = pytest.mark.stack


def test_a_finished_template_mode_job_does_not_churn(stack, tmp_path):
    """Template mode: at the end every task's cluster file is re-rendered while its peers
    stop. No allocation may fail or be replaced after the job succeeded (a change signal
    sent to a finishing task made Nomad fail and reschedule it)."""
    job_id = unique("tmpl-end")
    spec = probe_job(job_id, context={"sleep": 4}, discovery={"reconfigure": "template", "rendezvous_timeout": "2m"})
    spec["recovery"] = {"restart_attempts": 2, "reschedule_attempts": 2, "reschedule_delay": "5s"}
    try:
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "4m")
        assert out.returncode == 0, out.stderr
        time.sleep(12)  # what used to go wrong did so within ~10 s of the end
        allocs = allocations(job_id)
        assert len(allocs) == 3, [(a["Name"], a["ClientStatus"]) for a in allocs]
        assert {a["ClientStatus"] for a in allocs} == {"complete"}, [(a["Name"], a["ClientStatus"]) for a in allocs]
        for alloc in allocs:
            for state in (alloc.get("TaskStates") or {}).values():
                assert not state.get("Failed")
                assert not any("Template failed" in (e.get("DisplayMessage") or "") for e in state.get("Events") or [])
    finally:
        purge(job_id)


def _source_job(name: str, url: str) -> dict:
    spec = probe_job(name, context={"sleep": 1})
    spec["entrypoint"] = {"script": "probe.py"}  # no workdir: the code is where Nomad unpacked it
    spec["source"] = {"url": url}
    return spec


@pytest.mark.parametrize("archive", ["code.zip", "code.tar.gz"])
def test_code_as_an_artifact_runs_without_a_workdir(stack, tmp_path, code_server, archive):
    job_id = unique("artifact")
    try:
        out = nomadtf("run", str(write_job(tmp_path, _source_job(job_id, f"{code_server}/{archive}"))), "--timeout", "4m")
        assert out.returncode == 0, out.stderr
    finally:
        purge(job_id)


def test_a_missing_script_ends_the_run_within_seconds_with_its_error(stack, tmp_path, code_server):
    """A script that is not there is a mistake no restart fixes: the task says so before
    it starts anything, and the run fails at once naming the file."""
    job_id = unique("artifact-bad")
    started = time.monotonic()
    try:
        out = nomadtf("run", str(write_job(tmp_path, _source_job(job_id, f"{code_server}/empty.zip"))), "--timeout", "4m")
        elapsed = time.monotonic() - started
        assert out.returncode == 1, out.stderr
        assert "chief[0] exited 1, its code: entrypoint.script probe.py not found" in out.stderr, out.stderr
        assert elapsed < 90, f"{elapsed:.0f}s"
        print(f"\n[measure] a missing script ends the run in {elapsed:.0f}s")
    finally:
        purge(job_id)
