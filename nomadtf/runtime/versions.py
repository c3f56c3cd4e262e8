"""Which Python and TensorFlow our child runs: said once in the task's log (and published for
`run` and `status`), so two jobs on two TensorFlow versions (two images, two environments)
can be told apart afterwards.

Read from the child's interpreter without importing TensorFlow (its package metadata: what
`import tensorflow` loads there), with one short `python -c` of that interpreter in the
child's environment. The snippet needs nothing but the standard library: a job's
environment holds the job's requirements, not nomadtf.

Usage:
    describe(sys.executable, child_env)   # 'Python 3.11.2 (/opt/nomadtf/venv/bin/python3), tensorflow-cpu 2.21.0'
"""

from __future__ import annotations

import subprocess

TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-gpu", "tf-nightly")

TIMEOUT_S = 20.0
# Run by the child's interpreter (any Python 3.8+), at the lowest priority: it runs as the
# child starts, when every task of the job loads TensorFlow at once on the same cores, and
# its 0.1 CPU seconds (a scan of site-packages) must not delay the first step.
SNIPPET = f"""
import os
os.nice(19)
import importlib.metadata, platform, sys
found = []
for name in {TF_DISTRIBUTIONS!r}:
    try:
        found.append(name + " " + importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        pass
print("Python " + platform.python_version() + " (" + sys.executable + "), " + (", ".join(found) or "no TensorFlow installed"))
"""


def describe(python: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S) -> str:
    """The line of the interpreter `python` in the child's environment `env` (its PYTHONPATH
    decides what it imports)."""
    try:
        done = subprocess.run([python, "-c", SNIPPET], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: versions unknown ({exc})"
    return done.stdout.strip() or f"{python}: versions unknown (exit {done.returncode}: {done.stderr.strip()[-200:]})"
