"""The README stays true: its example command works, and its job.json reference names every
field of the schema."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from nomadtf.spec import schema
from tests.helpers import REPO

README = (REPO / "README.md").read_text()


SPANS = set(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", README, flags=re.S)))


def _documented(section: str, key: str) -> bool:
    """`section.key`, or the README's short forms in the same row: `.key`, `_suffix`."""
    full = f"{section}.{key}" if section else key
    suffix = "_" + key.split("_", 1)[1] if "_" in key else None
    if not section and any(span.startswith(f"{key}.") for span in SPANS):
        return True  # an object documented through its fields
    return full in SPANS or f"{full}[]" in SPANS or f".{key}" in SPANS or (suffix in SPANS if suffix else False)


def test_reference_documents_every_field():
    top = schema()["properties"]
    missing = [key for key in top if not _documented("", key)]
    for section in ("source", "entrypoint", "driver", "vault", "recovery", "discovery"):
        missing += [f"{section}.{key}" for key in top[section].get("properties", {}) if not _documented(section, key)]
    missing += [f"roles.<role>.{key}" for key in schema()["$defs"]["role"]["properties"] if not _documented("roles.<role>", key)]
    assert not missing, f"README's job.json reference lacks: {missing}"


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
