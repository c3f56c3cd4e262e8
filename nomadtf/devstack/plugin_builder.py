"""One builder for the project's Go plugins: the fake-GPU Nomad device plugin
(`gpu_plugin.py`) and OpenBao's Consul secrets engine (`consul_engine.py`).

A plugin is a Go module in this package (`gpu_plugin/`, `consul_engine/`). It is built
with the machine's Go, once, into the cache (`gobuild.cache_dir()`), with the sha256 of
the sources it was built from beside it (`<binary>.sha256`): a change to the sources
rebuilds it, nothing else does. Each plugin checks the licences of what it links before
it is built (its `check_licences`).

Usage:
    PLUGIN = GoPlugin("nomadtf-fake-gpu", SOURCE_DIR, "plugins", "the fake-GPU device plugin", check)
    binary = find_or_build(PLUGIN, progress)       # PLUGIN.path(), current
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nomadtf.devstack.gobuild import cache_dir, go_environment
from nomadtf.devstack.protocol import Progress
from nomadtf.errors import BinaryError


@dataclass(frozen=True)
class GoPlugin:
    """A Go plugin of the project: its binary's `name`, its Go module (`source`), the
    folder of the cache it is installed in (`folder`: a directory of its own, since Nomad
    refuses to start when an executable in its plugin_dir is not a Nomad plugin), what it
    is in words, and the licence check that must pass before it is built (it raises
    BinaryError)."""

    name: str
    source: Path
    folder: str
    what: str
    check_licences: Callable[[Progress], object]

    def directory(self) -> Path:
        """The directory a Nomad client (plugin_dir) or OpenBao (plugin_directory) loads it from."""
        return cache_dir() / self.folder

    def path(self) -> Path:
        return self.directory() / self.name


def source_files(source: Path) -> list[Path]:
    """The files a plugin is built from: go.mod, go.sum and every .go file (not its README)."""
    files = [p for p in source.iterdir() if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))]
    return sorted(files, key=lambda p: p.name)


def source_hash(source: Path) -> str:
    """sha256 over the names and contents of `source_files`, each file framed by its name
    and length (two trees never hash alike by moving bytes across a file boundary)."""
    files = source_files(source)
    if not any(p.name == "go.mod" for p in files):
        raise BinaryError(f"no go.mod in {source}")
    digest = hashlib.sha256()
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def stamp_path(binary: Path) -> Path:
    """Where the sha256 of the sources `binary` was built from is kept (not executable, so
    Nomad's plugin loader skips it)."""
    return binary.with_name(binary.name + ".sha256")


def is_current(binary: Path, digest: str) -> bool:
    """True when `binary` exists, is executable and was built from sources hashing to `digest`."""
    stamp = stamp_path(binary)
    if not (binary.is_file() and os.access(binary, os.X_OK) and stamp.is_file()):
        return False
    return stamp.read_text().strip() == digest


def find_or_build(plugin: GoPlugin, progress: Progress) -> Path:
    """The path of `plugin`'s binary, built first when missing or its sources changed."""
    digest = source_hash(plugin.source)
    if is_current(plugin.path(), digest):
        return plugin.path()
    return build(plugin, progress, digest)


def build(plugin: GoPlugin, progress: Progress, digest: str | None = None) -> Path:
    """Check `plugin`'s licences, then `go build -trimpath` it into its directory, whatever
    is there already, stamped with `digest` (its sources' hash)."""
    if shutil.which("go") is None:
        raise BinaryError(f"go is not on PATH; install Go to build {plugin.what} ({plugin.name})")
    digest = digest or source_hash(plugin.source)
    plugin.check_licences(progress)
    started = time.monotonic()
    out = plugin.path()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built outside the plugin directory and moved in: Nomad refuses to start when an
    # executable in plugin_dir is not a plugin, and a half-written one is not.
    staging = cache_dir() / "build" / f"{plugin.name}.{os.getpid()}.tmp"
    staging.parent.mkdir(parents=True, exist_ok=True)
    log_path = cache_dir() / "build" / f"{plugin.name}.build.log"
    progress(f"{plugin.name}: building {plugin.what} from {plugin.source}")
    cmd = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging), "."]
    result = subprocess.run(cmd, cwd=plugin.source, capture_output=True, text=True, env=go_environment())
    log_path.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        staging.unlink(missing_ok=True)
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise BinaryError(f"{plugin.name}: go build failed (exit {result.returncode}); see {log_path}\n{tail}")
    # A stale stamp must never vouch for a new binary, nor a new stamp for an old one.
    stamp = stamp_path(out)
    stamp.unlink(missing_ok=True)
    if out.parent.resolve() != staging.parent.resolve():
        shutil.move(str(staging), str(out))
    else:
        staging.replace(out)
    stamp.write_text(digest + "\n")
    progress(f"{plugin.name}: built in {time.monotonic() - started:.0f}s -> {out}")
    return out
