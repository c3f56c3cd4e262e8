"""How our child starts (nomadtf.runtime.starter): a script that is not there is named before
anything runs, and a child started ahead of the cluster gets the cluster, the generation and
the secrets in its handoff, as a real process."""

from __future__ import annotations

import json
import os
import sys
import threading

from nomadtf.job.spec import JobSpec
from nomadtf.job.validate import normalize
from nomadtf.runtime.alloc import AllocInfo
from nomadtf.runtime.starter import ChildStarter
from nomadtf.tfconfig import Member

CHILD = """
import json, os, sys
names = ("TF_CONFIG", "NOMADTF_GENERATION", "NOMADTF_INDEX", "SECRET")
json.dump({"env": {n: os.environ.get(n) for n in names}, "argv": sys.argv, "cwd": os.getcwd()}, open("seen.json", "w"))
"""


def _spec(workdir, **entry) -> JobSpec:
    return JobSpec.from_normalized(normalize({
        "name": "j", "strategy": "multi_worker_mirrored", "roles": {"worker": {"count": 1}, "tensorboard": {"count": 1}},
        "entrypoint": {"script": "child.py", "args": ["--epochs", "1"], "workdir": str(workdir), **entry},
        "model_dir": str(workdir / "model"),
    }))


def _starter(tmp_path, role="worker"):
    done = threading.Event()
    exits: list[tuple[int, int]] = []

    def on_exit(pid, code):
        exits.append((pid, code))
        done.set()

    alloc = AllocInfo("j", "alloc-1", 0, tf_port=2222, health_port=2223, task_dir=tmp_path, secrets_dir=tmp_path)
    return ChildStarter(role, alloc, tmp_path / "nomadtf-progress.json", on_exit), exits, done


def test_a_missing_script_is_named_with_where_it_was_looked_for(tmp_path):
    starter, _, _ = _starter(tmp_path)
    why = starter.missing_script(_spec(tmp_path))
    assert why == f"its code: entrypoint.script child.py not found in {tmp_path} (entrypoint.workdir)"
    (tmp_path / "child.py").write_text(CHILD)
    assert starter.missing_script(_spec(tmp_path)) is None
    tensorboard, _, _ = _starter(tmp_path / "elsewhere", role="tensorboard")  # runs no script of the job's
    assert tensorboard.missing_script(_spec(tmp_path / "elsewhere")) is None


def test_the_child_started_ahead_gets_the_cluster_generation_and_secrets_in_its_handoff(tmp_path, monkeypatch):
    (tmp_path / "child.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    starter, exits, done = _starter(tmp_path)
    spec = _spec(tmp_path)
    try:
        starter.start_ahead(spec, 0)
        assert starter.warm.waiting is not None
        waiting = starter.warm.waiting.child.pid
        child = starter.start(spec, 0, [Member("worker", 0, "10.0.0.1:2222", "alloc-1/i")], 4, {"SECRET": "s3cret"})
        assert child.pid == waiting  # the one that waited, not a cold start
        assert done.wait(60) and exits == [(waiting, 0)]
    finally:
        starter.close()
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert json.loads(seen["env"]["TF_CONFIG"]) == {"cluster": {"worker": ["10.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}}
    assert seen["env"]["NOMADTF_GENERATION"] == "4" and seen["env"]["NOMADTF_INDEX"] == "0" and seen["env"]["SECRET"] == "s3cret"
    assert seen["argv"][1:] == ["--epochs", "1"] and seen["cwd"] == str(tmp_path)
    assert (tmp_path / "model").is_dir()  # model_dir exists before the code runs


def test_what_the_child_runs_is_handed_on_once_at_its_first_start(tmp_path, monkeypatch):
    (tmp_path / "child.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    said: list[str] = []
    starter, exits, done = _starter(tmp_path)
    starter.on_versions = said.append
    spec = _spec(tmp_path)
    members = [Member("worker", 0, "127.0.0.1:2222", "alloc-1/i")]
    try:
        for generation in (1, 2):  # a restart says nothing new
            done.clear()
            starter.start(spec, 0, members, generation, {})
            assert done.wait(60)
    finally:
        starter.close()
    assert len(exits) == 2 and len(said) == 1
    assert said[0].startswith(f"Python {sys.version.split()[0]} ({sys.executable})")
