"""The strict-decoding check of renderings for Nomad 1.7+ (tools/nomadapi-check), built with
the machine's Go by the project's one Go builder (devstack.plugin_builder) into the cache's
bin/ beside the stack's binaries, and rebuilt only when its sources change.

Usage:
    checker = nomadapi_check()                       # Path of the built binary
    out = run_check(checker, "2.0.5", [path, ...])   # CompletedProcess; rc 0: all clean
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from nomadtf.devstack import plugin_builder
from nomadtf.devstack.gobuild import check_license, go_environment, read_go_mod, required_versions
from nomadtf.devstack.protocol import Progress

SOURCE = Path(__file__).resolve().parent.parent / "tools" / "nomadapi-check"
API_MODULE = "github.com/hashicorp/nomad/api"


def check_api_licence(progress: Progress) -> str:
    """Download the pinned API module into the module cache and refuse anything but MPL-2.0
    (Nomad's own licence changed in 1.7; its api module kept MPL-2.0). "module@version"."""
    wanted = f"{API_MODULE}@{required_versions(read_go_mod(SOURCE / 'go.mod'))[API_MODULE]}"
    result = subprocess.run(["go", "mod", "download", "-json", wanted], cwd=SOURCE, capture_output=True, text=True, env=go_environment())
    licence = check_license(Path(json.loads(result.stdout)["Dir"]), wanted)
    progress(f"nomadapi-check: {wanted} is {licence}")
    return wanted


CHECKER = plugin_builder.GoPlugin("nomadapi-check", SOURCE, "bin", "the Nomad API strict-decoding check", check_api_licence)


def nomadapi_check() -> Path:
    """The checker binary, built first when missing or stale."""
    return plugin_builder.find_or_build(CHECKER, lambda _message: None)


def run_check(checker: Path, target: str, paths: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run([str(checker), "-target", target, *map(str, paths)], capture_output=True, text=True, timeout=120)
