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
