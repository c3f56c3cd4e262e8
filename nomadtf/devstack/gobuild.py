"""The machine's Go, as every build of the local stack uses it: where builds are cached,
the environment of a go command, go.mod as the go command reads it, and the licence check
every module passes before it is built.

Nothing here downloads: `binaries.py` fetches Nomad and Consul from the module proxy,
`plugin_builder.py` builds the project's own Go plugins; both stand on these.

Usage:
    go_mod = read_go_mod(source / "go.mod")
    required_versions(go_mod)["github.com/hashicorp/nomad"]   # "v1.6.1"
    check_license(module_dir, "github.com/hashicorp/nomad@v1.6.1")   # "MPL-2.0", or BinaryError
    subprocess.run(["go", "build", "."], env=go_environment())
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from nomadtf.errors import BinaryError

_MPL_MARKERS = ("Mozilla Public License, version 2.0", "Mozilla Public License Version 2.0")


def cache_dir() -> Path:
    """Where built binaries and build trees live ($NOMADTF_CACHE_DIR, else
    $XDG_CACHE_HOME/nomadtf); outside any repository."""
    explicit = os.environ.get("NOMADTF_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nomadtf"


def go_setting(name: str) -> str:
    """`go env NAME` ("" when there is no Go on PATH)."""
    if shutil.which("go") is None:
        return ""
    return subprocess.run(["go", "env", name], capture_output=True, text=True).stdout.strip()


# GOTOOLCHAIN of every go command here: "local" (the machine's Go, never another one
# downloaded) unless `dev binaries --go` named a Go (use_toolchain).
_toolchain = ["local"]


def use_toolchain(go_version: str) -> None:
    """Build with Go `go_version` from now on: the go command fetches it from the module
    proxy and checks it against the checksum database itself (GOTOOLCHAIN=go_version)."""
    _toolchain[0] = go_version


def go_environment(*, mod_readonly: bool = True) -> dict[str, str]:
    """The environment of every go command here: GOTOOLCHAIN (use_toolchain; "local" by
    default), and -mod=readonly (the plugins, whose go.mod and go.sum may lie in an
    installed package): go.mod and go.sum are never rewritten."""
    flags = "-buildvcs=false -mod=readonly" if mod_readonly else "-buildvcs=false"
    return {**os.environ, "GOTOOLCHAIN": _toolchain[0], "GOFLAGS": flags}


def read_go_mod(path: Path) -> dict:
    """A go.mod as the go command itself parses it (`go mod edit -json`)."""
    if shutil.which("go") is None:
        raise BinaryError("go is not on PATH; install Go to build Nomad, Consul and the plugins")
    # go_environment's GOTOOLCHAIN=local: reading a file must never download a toolchain.
    result = subprocess.run(
        ["go", "mod", "edit", "-json", str(path)], capture_output=True, text=True, env=go_environment()
    )
    if result.returncode != 0:
        raise BinaryError(f"cannot read {path}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def local_replacements(go_mod: dict) -> dict[str, str]:
    """module -> ./dir for each `replace` that points into the module's own tree. Pure."""
    return {
        r["Old"]["Path"]: r["New"]["Path"]
        for r in go_mod.get("Replace") or []
        if r["New"]["Path"].startswith("./") and "Version" not in r["New"]
    }


def required_versions(go_mod: dict) -> dict[str, str]:
    """module -> version from the go.mod `require` directives. Pure."""
    return {r["Path"]: r["Version"] for r in go_mod.get("Require") or []}


def is_mpl2(license_text: str) -> bool:
    """The text is the Mozilla Public License 2.0 and no Business Source License. Pure."""
    return any(m in license_text for m in _MPL_MARKERS) and "Business Source" not in license_text


def check_license(module_dir: Path, what: str) -> str:
    """Raise unless the module's LICENSE is MPL-2.0. Returns the licence name."""
    for name in ("LICENSE", "LICENSE.md", "LICENSE.txt"):
        path = module_dir / name
        if path.is_file():
            if is_mpl2(path.read_text(errors="replace")):
                return "MPL-2.0"
            raise BinaryError(f"{what}: {path.name} is not MPL-2.0; refusing to build it")
    raise BinaryError(f"{what}: no LICENSE file in the module; refusing to build it")
