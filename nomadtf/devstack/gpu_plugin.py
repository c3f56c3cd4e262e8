"""The fake-GPU Nomad device plugin: what it is built from and the client config that loads it.

The plugin (Go sources in `gpu_plugin/`) advertises NVIDIA GPUs that do not exist, exactly
as the real NVIDIA device plugin reports real ones: device group `nvidia/gpu/<model>`,
instances `GPU-<uuid>`, and `NVIDIA_VISIBLE_DEVICES` in the environment of a task that was
granted some. It links Nomad v1.6.1's MPL-2.0 `plugins/device` and `plugins/base` packages,
so it is built with the machine's Go from the module proxy by the project's one plugin
builder (`plugin_builder.py`), once, and cached: `$NOMADTF_CACHE_DIR/plugins/nomadtf-fake-gpu`,
with the sha256 of the sources it was built from beside it. A change to the sources
rebuilds it; nothing else does.

Usage:
    binary = find_or_build(progress)                       # built when missing or stale
    hcl = client_plugin_hcl(binary.parent, 4, seed="client-1")   # the client config's lines
    hcl = client_plugin_hcl(binary.parent, 6, seed="dev", models=stack_groups(6, 2))   # and 2 MIG slices
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nomadtf.devstack import plugin_builder
from nomadtf.devstack.gobuild import check_license, go_environment, read_go_mod, required_versions
from nomadtf.devstack.protocol import Progress
from nomadtf.errors import BinaryError

PLUGIN_NAME = "nomadtf-fake-gpu"
SOURCE_DIR = Path(__file__).with_name("gpu_plugin")
NOMAD_MODULE = "github.com/hashicorp/nomad"

# The plugin's own defaults (plugin.go); client_plugin_hcl always writes them out.
DEFAULT_MODEL = "Tesla-V100-SXM2-16GB"
DEFAULT_MEMORY_MIB = 16160

# A MIG slice as nomad-device-nvidia 1.1.0 lists one: a GPU of its own, named after its
# parent with " MIG <profile>" appended, with the slice's memory. 1g.5gb is the smallest
# profile of an A100 40GB; nvidia-smi shows 4864 MiB for it.
MIG_PROFILE = "1g.5gb"
MIG_MEMORY_MIB = 4864


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


def mig_model(model: str = DEFAULT_MODEL, profile: str = MIG_PROFILE) -> str:
    """The name nomad-device-nvidia gives a MIG slice of `model`: "<model> MIG <profile>"."""
    return f"{model} MIG {profile}"


def stack_groups(gpus: int, mig: int) -> list[GpuGroup]:
    """A local stack's client: `gpus` whole GPUs of the default model, and `mig` MIG slices of
    it (a group of their own, as the NVIDIA plugin lists slices: another name, less memory)."""
    return [GpuGroup(DEFAULT_MODEL, gpus), GpuGroup(mig_model(), mig, MIG_MEMORY_MIB)]


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
        env=go_environment(),
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


PLUGIN = plugin_builder.GoPlugin(PLUGIN_NAME, SOURCE_DIR, "plugins", "the fake-GPU device plugin", check_nomad_license)


def plugin_dir() -> Path:
    """The directory to give a Nomad client as `plugin_dir`."""
    return PLUGIN.directory()


def find_or_build(progress: Progress) -> Path:
    """The plugin's binary, built first when missing or its sources changed."""
    return plugin_builder.find_or_build(PLUGIN, progress)


def hcl_string(value: str) -> str:
    """`value` as an HCL string literal (JSON's syntax, which HCL v1 and v2 both read)."""
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
        f"plugin_dir = {hcl_string(str(plugin_dir))}",
        "",
        f'plugin "{PLUGIN_NAME}" {{',
        "  config {",
        f"    count      = {count}",
        f"    model      = {hcl_string(model)}",
        f"    memory_mib = {memory_mib}",
    ]
    if seed:
        lines.append(f"    seed       = {hcl_string(seed)}")
    if driver_version is not None:
        lines.append(f"    driver_version = {hcl_string(driver_version)}")
    if ids is not None:
        lines.append(f"    ids        = [{', '.join(hcl_string(i) for i in ids)}]")
    for i, group in enumerate(models or ()):
        lines += [
            "",
            "    models {",
            f"      model      = {hcl_string(_check_model(group.model, f'models[{i}].model'))}",
            f"      count      = {_check_count(group.count, f'models[{i}].count')}",
            f"      memory_mib = {_check_memory(group.memory_mib, f'models[{i}].memory_mib')}",
            "    }",
        ]
    lines += ["  }", "}", ""]
    return "\n".join(lines)
