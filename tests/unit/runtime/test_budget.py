"""The allocation's restart budget on disk (nomadtf.runtime.budget): one budget for every
supervisor Nomad starts in the same task directory."""

from __future__ import annotations

import json

from nomadtf.job.spec import JobSpec
from nomadtf.job.validate import normalize
from nomadtf.runtime.budget import AllocationBudget

SPEC = JobSpec.from_normalized(normalize({
    "name": "j", "entrypoint": {"script": "t.py"}, "roles": {"worker": {"count": 1}}, "strategy": "multi_worker_mirrored",
    "recovery": {"restart_attempts": 2, "restart_interval": "10m"},
}))


def test_a_supervisor_restarted_by_nomad_spends_from_what_its_predecessors_spent(tmp_path):
    first = AllocationBudget(SPEC, tmp_path)
    assert not first.restarted_by_nomad and first.window_s == 600.0
    first.save()  # the first supervisor marks the directory
    assert first.spend()  # one recovery in place
    second = AllocationBudget(SPEC, tmp_path)  # Nomad restarted the task
    assert second.restarted_by_nomad
    assert second.spend()  # its own start is the second recovery: within 2
    assert len(json.loads(first.path.read_text())["spent"]) == 2
    assert second.spend() is False  # a third within the interval is over the budget
    assert AllocationBudget(SPEC, tmp_path).spend() is False  # and stays spent for the next one


def test_a_damaged_record_is_a_fresh_budget_and_an_unwritable_one_only_a_warning(tmp_path, caplog):
    (tmp_path / "nomadtf-recoveries.json").write_text("{not json")
    budget = AllocationBudget(SPEC, tmp_path)
    assert budget.restarted_by_nomad and budget.spend() and budget.spend()
    gone = AllocationBudget(SPEC, tmp_path / "missing")
    assert gone.spend()  # the recovery counts in memory
    assert "could not record the restart budget" in caplog.text
