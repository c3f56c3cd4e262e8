"""What our child runs (nomadtf.runtime.versions): read from the child's own interpreter, which
need not have nomadtf (a job's environment holds only the job's requirements)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv

from nomadtf.runtime import versions


def test_an_interpreter_without_nomadtf_still_says_its_python_and_tensorflow(tmp_path):
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)  # what a job environment is, before its requirements
    python = str(bare / "bin" / "python")
    assert subprocess.run([python, "-c", "import nomadtf"], capture_output=True, cwd=tmp_path).returncode != 0
    line = versions.describe(python, {"PATH": os.environ["PATH"]})
    assert line == f"Python {sys.version.split()[0]} ({python}), no TensorFlow installed"
    # A distribution on the child's PYTHONPATH counts: it is what the child would import.
    site = tmp_path / "site"
    (site / "tensorflow_cpu-9.9.9.dist-info").mkdir(parents=True)
    (site / "tensorflow_cpu-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: 9.9.9\n")
    assert versions.describe(python, {"PATH": os.environ["PATH"], "PYTHONPATH": str(site)}).endswith(", tensorflow-cpu 9.9.9")


def test_an_interpreter_that_cannot_run_is_named_not_raised(tmp_path):
    assert versions.describe(str(tmp_path / "missing")).startswith(f"{tmp_path / 'missing'}: versions unknown (")


def test_the_probe_runs_at_the_lowest_priority():
    # It runs while every task of the job loads TensorFlow on the same cores.
    done = subprocess.run([sys.executable, "-c", versions.SNIPPET + "\nprint(os.nice(0))"], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "19", done.stdout
