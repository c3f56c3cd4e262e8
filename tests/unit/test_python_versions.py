"""nomadtf runs on every Python TensorFlow supports (3.10 to 3.14; pyproject's
requires-python): vermin reads every module and says which language and standard-library
features need a newer Python than 3.10. Only 3.11 is installed on these machines, so this is
the check for the others."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_runs_on_the_oldest_python_pyproject_promises():
    requires = re.search(r'^requires-python = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert requires and requires[1] == ">=3.10", requires
    # str.decode: vermin mistakes bytes.decode for Python 2's str.decode.
    out = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "-q", "--no-tips", "--violations", "-t=3.10-", "--eval-annotations",
         "--exclude", "str.decode", "nomadtf", "tests", "bench", "examples"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
