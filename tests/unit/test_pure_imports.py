"""The pure modules load without any client library installed (issue #35): a command that
only validates or renders, and the task runtime's pure decisions, never pull in py-consul,
python-nomad, hvac, psutil or requests. Each import runs in a fresh interpreter with those
libraries blocked."""

from __future__ import annotations

import subprocess
import sys

import pytest

CLIENT_LIBRARIES = ("consul", "nomad", "hvac", "psutil", "requests")
PURE = (
    "nomadtf.job.spec", "nomadtf.job.render", "nomadtf.tfconfig", "nomadtf.roles", "nomadtf.wire", "nomadtf.job.plan",
    "nomadtf.job.capacity", "nomadtf.job.outcome", "nomadtf.job.report", "nomadtf.job.acl", "nomadtf.job.dcos", "nomadtf.job.target",
    "nomadtf.job.profile", "nomadtf.durations", "nomadtf.errors", "nomadtf.runtime.policy", "nomadtf.runtime.deadline",
    "nomadtf.runtime.launch", "nomadtf.admission.order", "nomadtf.admission.fit", "nomadtf.admission.elastic",
    "nomadtf.admission.preemption", "nomadtf.progress", "nomadtf.usercode.tfserver", "nomadtf.usercode.gpulimit", "nomadtf.usercode.health",
)


@pytest.mark.parametrize("module", PURE)
def test_a_pure_module_loads_without_any_client_library(module):
    blocked = "; ".join(f"sys.modules[{lib!r}] = None" for lib in CLIENT_LIBRARIES)
    out = subprocess.run([sys.executable, "-c", f"import sys; {blocked}; import {module}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr.strip().splitlines()[-1:]
