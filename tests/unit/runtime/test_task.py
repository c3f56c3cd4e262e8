"""The runtime's entry (nomadtf.runtime.task.run_task): what ends a task becomes one line on
stderr and its exit code, the same through `python -m nomadtf task` (what allocations run)
and through the command line's `task` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nomadtf.errors import CannotRecord
from nomadtf.job.validate import normalize
from nomadtf.runtime import task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SPEC = normalize({"name": "j", "strategy": "multi_worker_mirrored", "entrypoint": {"script": "t.py"}, "roles": {"worker": {"count": 1}}})
ENTRIES = {
    "python -m nomadtf": [sys.executable, "-m", "nomadtf", "task", "--role", "worker"],
    "the command line": [sys.executable, "-c", "from nomadtf.cli import main; main()", "task", "--role", "worker"],
}


def _task(argv: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NOMAD_", "NOMADTF_"))}
    environ.update(PYTHONPATH=ROOT, **env)
    return subprocess.run(argv, env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_task_outside_an_allocation_says_so_in_one_line_and_exits_1(entry, tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    done = _task(ENTRIES[entry], tmp_path, NOMADTF_SPEC_FILE=str(tmp_path / "spec.json"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: NOMAD_JOB_ID is not set: `nomadtf task` runs inside a Nomad allocation of a rendered job")


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_task_without_its_spec_file_is_a_spec_error(entry, tmp_path):
    done = _task(ENTRIES[entry], tmp_path, NOMADTF_SPEC_FILE=str(tmp_path / "absent.json"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: job.json is invalid:") and "cannot read the job's spec" in done.stderr


def test_each_error_is_its_exit_code_and_anything_unexpected_70(monkeypatch, capsys):
    def fail(exc):
        def supervise(role):
            raise exc
        return supervise

    monkeypatch.setattr(task, "_supervise", fail(CannotRecord("Consul at http://10.0.0.9:8500 never answered")))
    assert task.run_task("worker") == 78
    assert capsys.readouterr().err.splitlines()[-1] == "error: Consul at http://10.0.0.9:8500 never answered"
    monkeypatch.setattr(task, "_supervise", fail(KeyError("entrypoint")))
    assert task.run_task("worker") == 70
    assert capsys.readouterr().err.splitlines()[-1] == "unexpected error: KeyError: 'entrypoint'"
    with pytest.raises(KeyError):  # `nomadtf --debug task`: the traceback is the caller's to show
        task.run_task("worker", debug=True)
