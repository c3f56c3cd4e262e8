"""The pure pieces of run.py: the checkpoint step a resume names, and the submitter's view
of a run's model_dir."""

from __future__ import annotations

from pathlib import Path

from nomadtf.client.run import checkpoint_step, client_model_dir
from nomadtf.job.spec import load_spec
from tests.helpers import EXAMPLES


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
