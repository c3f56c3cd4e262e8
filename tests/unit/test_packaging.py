"""The wheel carries what an installed nomadtf needs: templates, the schema, the licence."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.helpers import REPO


def test_wheel_ships_templates_and_schema(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("nomadtf-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in ("job.json.j2", "group.json.j2", "cluster.ctmpl.j2"):
        assert f"nomadtf/templates/{template}" in names
    assert "nomadtf/schema/job.schema.json" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
