"""Names on the wire stay put: a job's Meta keys are read by running tasks, by the admission
controller and by older nomadtf clients, so a rename is a protocol change, never a side
effect of a refactor (docs/design/names.md lists them)."""

from __future__ import annotations

import re

from nomadtf import wire
from tests.helpers import REPO


def test_the_job_meta_keys_are_the_documented_ones():
    keys = (wire.META_VERSION, wire.META_SPEC_SHA256, wire.META_STRATEGY, wire.META_RUN, wire.META_MODEL_RUN)
    assert keys == ("nomadtf.version", "nomadtf.spec_sha256", "nomadtf.strategy", "nomadtf.run", "nomadtf.model_run")
    names = (REPO / "docs" / "design" / "names.md").read_text()
    row = next(line for line in names.splitlines() if line.startswith("| Job Meta |"))
    assert set(re.findall(r"`(nomadtf\.[a-z0-9_]+)`", row)) >= set(keys)
