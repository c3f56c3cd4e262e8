"""Build the fake-GPU Nomad device plugin and write the client config that loads it.

The plugin (Go sources in `gpu_plugin/`) advertises NVIDIA GPUs that do not exist, exactly
as the real NVIDIA device plugin reports real ones: device group `nvidia/gpu/<model>`,
instances `GPU-<uuid>`, and `NVIDIA_VISIBLE_DEVICES` in the environment of a task that was
granted some. It links Nomad v1.6.1's MPL-2.0 `plugins/device` and `plugins/base` packages,
so like the servers in `binaries.py` it is built with the machine's Go from the module proxy,
once, and cached: `$NOMADTF_CACHE_DIR/plugins/nomadtf-fake-gpu`, with the sha256 of the
sources it was built from beside it. A change to the sources rebuilds it; nothing else does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nomadtf.devstack.binaries import Progress, cache_dir, check_license, read_go_mod, required_versions
from nomadtf.errors import BinaryError

PLUGIN_NAME = "nomadtf-fake-gpu"
SOURCE_DIR = Path(__file__).with_name("gpu_plugin")
NOMAD_MODULE = "github.com/hashicorp/nomad"

# The plugin's own defaults (plugin.go); client_plugin_hcl always writes them out.
DEFAULT_MODEL = "Tesla-V100-SXM2-16GB"
DEFAULT_MEMORY_MIB = 16160


@dataclass(frozen=True)
class GpuGroup:
    """One `models { ... }` entry: `count` GPUs of one model (one Nomad device group)."""

    model: str
    count: int
    memory_mib: int = DEFAULT_MEMORY_MIB


@dataclass(frozen=True)
class GpuInventory:
    """Real GPUs to advertise as they are (`nvidia-smi` of this machine): their instance
    IDs (`GPU-<uuid>`), model name and memory, instead of made-up ones."""

    ids: tuple[str, ...]
    model: str
    memory_mib: int

    def plugin_hcl(self, plugin_dir: Path) -> str:
        return client_plugin_hcl(plugin_dir, len(self.ids), self.model, self.memory_mib, ids=self.ids)


def plugin_dir() -> Path:
    """The directory to give a Nomad client as `plugin_dir`."""
    return cache_dir() / "plugins"


def plugin_path() -> Path:
    return plugin_dir() / PLUGIN_NAME


def stamp_path(binary: Path) -> Path:
    """Where the sha256 of the sources `binary` was built from is kept (not executable, so
    Nomad's plugin loader skips it)."""
    return binary.with_name(binary.name + ".sha256")


def source_files(source: Path = SOURCE_DIR) -> list[Path]:
    """The files the binary is built from: go.mod, go.sum and every .go file."""
    files = [
        p for p in source.iterdir() if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))
    ]
    return sorted(files, key=lambda p: p.name)


def source_hash(source: Path = SOURCE_DIR) -> str:
    """sha256 over the names and contents of `source_files`; the README does not count."""
    files = source_files(source)
    if not any(p.name == "go.mod" for p in files):
        raise BinaryError(f"{PLUGIN_NAME}: no go.mod in {source}")
    digest = hashlib.sha256()
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def is_current(binary: Path, digest: str) -> bool:
    """True when `binary` exists and was built from sources hashing to `digest`."""
    stamp = stamp_path(binary)
    if not (binary.is_file() and os.access(binary, os.X_OK) and stamp.is_file()):
        return False
    return stamp.read_text().strip() == digest


def find_or_build(progress: Progress) -> Path:
    """The path of the plugin binary, built first when missing or its sources changed."""
    digest = source_hash(SOURCE_DIR)
    out = plugin_path()
    if is_current(out, digest):
        return out
    return build(progress, digest)


def _go_env() -> dict[str, str]:
    # GOTOOLCHAIN=local: never download another Go. -mod=readonly: go.mod and go.sum in
    # the (possibly installed) package are never rewritten.
    return {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false -mod=readonly"}


def check_nomad_license(progress: Progress, source: Path = SOURCE_DIR) -> str:
    """Download the Nomad module the plugin links into the module cache and refuse
    anything but MPL-2.0. Returns "module@version"."""
    version = required_versions(read_go_mod(source / "go.mod")).get(NOMAD_MODULE)
    if not version:
        raise BinaryError(f"{PLUGIN_NAME}: {source / 'go.mod'} does not require {NOMAD_MODULE}")
    wanted = f"{NOMAD_MODULE}@{version}"
    result = subprocess.run(
        ["go", "mod", "download", "-json", wanted],
        cwd=source,
        capture_output=True,
        text=True,
        env=_go_env(),
    )
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or not info.get("Dir"):
        reason = info.get("Error") or result.stderr.strip() or f"exit {result.returncode}"
        raise BinaryError(f"{PLUGIN_NAME}: cannot download {wanted} to check its licence: {reason}")
    licence = check_license(Path(info["Dir"]), wanted)
    progress(f"{PLUGIN_NAME}: {wanted} is {licence}")
    return wanted


def build(progress: Progress, digest: str | None = None) -> Path:
    """`go build -trimpath` the plugin into plugin_dir(), whatever is there already."""
    if shutil.which("go") is None:
        raise BinaryError(f"go is not on PATH; install Go to build the {PLUGIN_NAME} device plugin")
    digest = digest or source_hash(SOURCE_DIR)
    check_nomad_license(progress)
    return go_build_plugin(PLUGIN_NAME, SOURCE_DIR, plugin_path(), digest, progress, "the fake-GPU device plugin")


def go_build_plugin(name: str, source: Path, out: Path, digest: str, progress: Progress, what: str) -> Path:
    """`go build -trimpath` the Go module in `source` into `out`, stamped with `digest` (the
    sources' hash, `is_current`). Shared by the project's plugins (this one, consul_engine)."""
    if shutil.which("go") is None:
        raise BinaryError(f"go is not on PATH; install Go to build {what} ({name})")
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Built outside the plugin directory and moved in: Nomad refuses to start when an
    # executable in plugin_dir is not a plugin, and a half-written one is not.
    staging = cache_dir() / "build" / f"{name}.{os.getpid()}.tmp"
    staging.parent.mkdir(parents=True, exist_ok=True)
    log_path = cache_dir() / "build" / f"{name}.build.log"
    progress(f"{name}: building {what} from {source}")
    cmd = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging), "."]
    result = subprocess.run(cmd, cwd=source, capture_output=True, text=True, env=_go_env())
    log_path.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        staging.unlink(missing_ok=True)
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise BinaryError(f"{name}: go build failed (exit {result.returncode}); see {log_path}\n{tail}")
    # A stale stamp must never vouch for a new binary, nor a new stamp for an old one.
    stamp = stamp_path(out)
    stamp.unlink(missing_ok=True)
    if out.parent.resolve() != staging.parent.resolve():
        shutil.move(str(staging), str(out))
    else:
        staging.replace(out)
    stamp.write_text(digest + "\n")
    progress(f"{name}: built in {time.monotonic() - started:.0f}s -> {out}")
    return out


def _hcl_string(value: str) -> str:
    # JSON string syntax is valid HCL (v1, which parses agent configs, and v2).
    if any(ord(c) < 0x20 for c in value):
        raise ValueError(f"control character in {value!r}")
    return json.dumps(value, ensure_ascii=False)


def _check_count(count: int, what: str) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"{what} must be an int >= 0, not {count!r}")
    return count


def _check_memory(memory_mib: int, what: str) -> int:
    if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or memory_mib <= 0:
        raise ValueError(f"{what} must be an int > 0, not {memory_mib!r}")
    return memory_mib


def _check_model(model: str, what: str) -> str:
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"{what} must be a non-empty string, not {model!r}")
    if "/" in model:
        # Nomad addresses a group as vendor/type/name; a slash would make it ambiguous.
        raise ValueError(f"{what} must not contain '/': {model!r}")
    return model


def client_plugin_hcl(
    plugin_dir: Path,
    count: int,
    model: str = DEFAULT_MODEL,
    memory_mib: int = DEFAULT_MEMORY_MIB,
    seed: str = "",
    *,
    driver_version: str | None = None,
    models: Sequence[GpuGroup] | None = None,
    ids: Sequence[str] | None = None,
) -> str:
    """The lines of a Nomad client config that load the plugin from `plugin_dir` and make
    it advertise `count` GPUs of `model` (or, with `models`, one group per entry instead).
    `ids` names the instances exactly (a real machine's GPU UUIDs): they replace `count`
    and the IDs the seed would give.

    `seed` fixes the GPU IDs: the same seed gives the same IDs on every start, different
    seeds give different ones, so give each client of one host its own (its node name).
    An empty seed lets the plugin use the host name.
    """
    _check_count(count, "count")
    _check_model(model, "model")
    _check_memory(memory_mib, "memory_mib")
    if not isinstance(seed, str):
        raise ValueError(f"seed must be a string, not {seed!r}")
    if ids is not None:
        ids = list(ids)
        if not ids or any(not isinstance(i, str) or not i.strip() for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"ids must be distinct non-empty strings, not {ids!r}")
        if models:
            raise ValueError("ids and models cannot both be given")
        count = len(ids)
    lines = [
        f"plugin_dir = {_hcl_string(str(plugin_dir))}",
        "",
        f'plugin "{PLUGIN_NAME}" {{',
        "  config {",
        f"    count      = {count}",
        f"    model      = {_hcl_string(model)}",
        f"    memory_mib = {memory_mib}",
    ]
    if seed:
        lines.append(f"    seed       = {_hcl_string(seed)}")
    if driver_version is not None:
        lines.append(f"    driver_version = {_hcl_string(driver_version)}")
    if ids is not None:
        lines.append(f"    ids        = [{', '.join(_hcl_string(i) for i in ids)}]")
    for i, group in enumerate(models or ()):
        lines += [
            "",
            "    models {",
            f"      model      = {_hcl_string(_check_model(group.model, f'models[{i}].model'))}",
            f"      count      = {_check_count(group.count, f'models[{i}].count')}",
            f"      memory_mib = {_check_memory(group.memory_mib, f'models[{i}].memory_mib')}",
            "    }",
        ]
    lines += ["  }", "}", ""]
    return "\n".join(lines)
