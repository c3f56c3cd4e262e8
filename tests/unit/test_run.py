"""The pure pieces of runs: which allocations belong to the current run, which attempts
`logs` shows, what a resumed run's model_dir is, the checkpoint step a resume names."""

from __future__ import annotations

from pathlib import Path

from nomadtf.follow import of_run, pick_allocs, run_elapsed, versions_of_run
from nomadtf.run import checkpoint_step, client_model_dir
from nomadtf.spec import JobSpec, RunInfo, for_task, load_spec, spec_file_text
from tests.helpers import EXAMPLES


def _alloc(name: str, version: int, create: int, status: str = "complete") -> dict:
    return {"ID": f"{name}-{create}", "Name": f"job.{name}", "JobVersion": version, "CreateIndex": create, "ClientStatus": status}


def test_a_run_owns_exactly_the_versions_that_carry_its_id():
    versions = [
        {"Version": 3, "Meta": {"nomadtf.run": "b"}},  # `scale` made a new version of run b
        {"Version": 2, "Meta": {"nomadtf.run": "b"}},
        {"Version": 1, "Meta": {"nomadtf.run": "a"}},
        {"Version": 0, "Meta": {}},
    ]
    assert versions_of_run(versions, "b") == {2, 3}
    assert versions_of_run(versions, "a") == {1}
    assert versions_of_run(versions, "unknown") == set()


def test_allocations_of_other_runs_are_left_out():
    """Neither an earlier run's nor a later one's (a colleague's --replace) allocations count."""
    allocs = [_alloc("chief[0]", 1, 10), _alloc("chief[0]", 2, 20, "running"), _alloc("worker[0]", 3, 30)]
    assert [a["CreateIndex"] for a in of_run(allocs, {2})] == [20]
    assert [a["CreateIndex"] for a in of_run(allocs, {2, 3})] == [20, 30]
    assert len(of_run(allocs, None)) == 3


def test_logs_show_every_attempt_of_a_slot_oldest_first_and_follow_the_newest():
    allocs = [_alloc("chief[0]", 1, 30), _alloc("worker[0]", 1, 5), _alloc("chief[0]", 1, 10, "failed")]
    assert [a["CreateIndex"] for a in pick_allocs(allocs, "chief", None)] == [10, 30]
    assert [a["CreateIndex"] for a in pick_allocs(allocs, "chief", None, newest_only=True)] == [30]
    assert [a["CreateIndex"] for a in pick_allocs(allocs, None, 0)] == [10, 30, 5]


def test_elapsed_runs_to_now_while_running_and_to_the_last_change_after():
    allocs = [{"CreateTime": 1_000_000_000, "ModifyTime": 9_000_000_000}, {"CreateTime": 2_000_000_000, "ModifyTime": 5_000_000_000}]
    assert run_elapsed(allocs, running=False, now_ns=20_000_000_000) == 8.0
    assert run_elapsed(allocs, running=True, now_ns=20_000_000_000) == 19.0
    assert run_elapsed([], running=True, now_ns=1) == 0.0


def _task_spec(run: RunInfo) -> JobSpec:
    import json

    submitted = load_spec(EXAMPLES / "digits" / "job.json")
    spec = JobSpec.from_normalized(json.loads(spec_file_text(submitted, run)))
    return for_task(spec, {"NOMAD_NAMESPACE": "default", "NOMAD_JOB_ID": "digits"})


def test_a_fresh_run_trains_in_its_own_directory_and_a_resumed_one_in_the_run_it_continues():
    fresh = _task_spec(RunInfo("r2", 1.0))
    resumed = _task_spec(RunInfo("r3", 1.0, model_run="r1"))
    assert fresh.model_dir.endswith("/default/digits/r2")
    assert resumed.model_dir.endswith("/default/digits/r1")
    assert resumed.run_id == "r3"  # the code still sees its own run id


def test_the_checkpoint_step_is_read_from_tensorflows_index_file(tmp_path):
    assert checkpoint_step(tmp_path) is None
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1200"\nall_model_checkpoint_paths: "model.ckpt-600"\n')
    assert checkpoint_step(tmp_path) == 1200
    assert checkpoint_step(tmp_path / "absent") is None


def test_the_submitters_view_of_model_dir():
    spec = load_spec(EXAMPLES / "digits" / "job.json", ["model_dir=/tmp/nomadtf/${NOMAD_NAMESPACE}/${NOMAD_JOB_ID}/${NOMADTF_RUN_ID}"])
    assert client_model_dir(spec, "team-a", "r1") == Path("/tmp/nomadtf/team-a/digits/r1")
    alloc_only = load_spec(EXAMPLES / "digits" / "job.json", ["model_dir=${NOMAD_ALLOC_DIR}/m"])
    assert client_model_dir(alloc_only, "default", "r1") is None
