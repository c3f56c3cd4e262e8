"""The docs stay true on the real stack: the README's example command trains the example,
and every shown `nomadtf` command that needs the local stack (and changes nothing on it)
runs, in process (tests/docs_commands.py says which; the offline ones run in
tests/unit/test_docs.py)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.docs_commands import ON_STACK, classify, run_shown, shown_commands
from tests.helpers import REPO

README = (REPO / "README.md").read_text()

ON_STACK_SHOWN = [s for s in shown_commands() if [kind for kind, _ in classify(s)] == ["on_stack"]]


@pytest.mark.stack
@pytest.mark.parametrize("shown", ON_STACK_SHOWN, ids=lambda s: f"{s.where} {s.text}")
def test_the_commands_shown_for_the_local_stack_run(stack, shown, tmp_path, monkeypatch):
    # These are the single-node stack's commands: a several-client stack that happens to run
    # (or to start) beside it on this machine is not theirs to report.
    monkeypatch.setenv("NOMADTF_DEV_CLUSTER_DIR", str(tmp_path / "no-cluster"))
    code, out, err = run_shown(shown, tmp_path, monkeypatch)
    (_, pattern), = classify(shown)
    assert code in ON_STACK[pattern], f"{shown.where}: {shown.text} exited {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert out.strip() or err.strip()
    if shown.argv[1:] == ("dev", "env"):
        assert f"export NOMAD_ADDR={os.environ['NOMAD_ADDR']}" in out
    if shown.argv[1] == "plan":
        assert "job diff" in out or "cannot be placed" in out, out


def test_there_are_commands_for_the_local_stack():
    assert {s.text for s in ON_STACK_SHOWN} >= {"nomadtf status", "nomadtf dev status", "nomadtf dev env"}


@pytest.mark.stack
@pytest.mark.tf
def test_the_readme_example_command_trains_the_example(stack):
    assert "bash scripts/example" in README
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    out = subprocess.run(["bash", "scripts/example", "--timeout", "8m"], cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert re.search(r"chief: final_accuracy=0\.(8[5-9]|9\d)", out.stdout), out.stdout[-2000:]
    job_id = re.search(r"submitted (digits-\d+)", out.stderr)[1]
    subprocess.run([str(REPO / ".venv" / "bin" / "nomadtf"), "stop", job_id, "--purge"], capture_output=True)
