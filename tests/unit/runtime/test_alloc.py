"""What Nomad tells a task about itself (nomadtf.runtime.alloc, pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nomadtf.errors import TaskError
from nomadtf.runtime.alloc import AllocInfo, spec_path


def test_alloc_info_needs_nomads_environment():
    with pytest.raises(TaskError, match="NOMAD_JOB_ID is not set"):
        AllocInfo.from_environ({})
    info = AllocInfo.from_environ(
        {"NOMAD_JOB_ID": "j", "NOMAD_ALLOC_ID": "a", "NOMAD_ALLOC_INDEX": "2", "NOMAD_PORT_tf": "1", "NOMAD_PORT_health": "2"}
    )
    assert info.alloc_index == 2 and info.tf_port == 1 and info.health_port == 2
    assert info.task_dir == Path(".") and info.secrets_dir == Path(".")


def test_the_spec_file_is_the_task_directorys_unless_named():
    assert spec_path({"NOMAD_TASK_DIR": "/alloc/t/local"}) == Path("/alloc/t/local/nomadtf-spec.json")
    assert spec_path({"NOMAD_TASK_DIR": "/alloc/t/local", "NOMADTF_SPEC_FILE": "/tmp/s.json"}) == Path("/tmp/s.json")
    assert spec_path({}) == Path("nomadtf-spec.json")
