"""Which Python and TensorFlow our child runs: said once in the task's log, so two jobs on
two TensorFlow versions (two images, two environments) can be told apart afterwards.

Read from the child's interpreter without importing TensorFlow (its package metadata: what
`import tensorflow` loads there): in this process when the child uses our interpreter,
else with one short `python -m nomadtf.runtime.versions` of the job's own interpreter
(which has nomadtf: jobenv installs it there).

Usage:
    describe(sys.executable)   # 'Python 3.11.2 (/opt/nomadtf/venv/bin/python3), tensorflow-cpu 2.21.0'
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys

TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-gpu", "tf-nightly")


def here() -> str:
    """This interpreter's line."""
    found = []
    for name in TF_DISTRIBUTIONS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"Python {platform.python_version()} ({sys.executable}), " + (", ".join(found) or "no TensorFlow installed")


def describe(python: str, timeout: float = 20.0) -> str:
    """The line of the interpreter `python`."""
    if python == sys.executable:
        return here()
    try:
        done = subprocess.run([python, "-m", "nomadtf.runtime.versions"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: versions unknown ({exc})"
    return done.stdout.strip() or f"{python}: versions unknown (exit {done.returncode})"


if __name__ == "__main__":
    print(here())
