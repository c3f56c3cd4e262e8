"""OpenBao's missing Consul secrets engine, as a plugin: what it is built from, its licence
check, and the line of OpenBao's config that lets it run (`bootstrap.py` registers and
mounts it).

OpenBao 2.x no longer ships the Consul secrets engine (`consul/creds/<role>`: a Consul ACL
token per read, leased, renewable, deleted from Consul when the lease ends), and OpenBao's
own plugin fork is not served by the Go module proxy. HashiCorp Vault v1.14.8 (the last
v1.14 release under MPL-2.0; v1.14.9+ and v1.15+ are BUSL) has the engine in its tree, and
OpenBao still speaks Vault's plugin protocol, so the few lines in `consul_engine/` serve
`github.com/hashicorp/vault/builtin/logical/consul` as an external plugin. Like the fake-GPU
plugin (`gpu_plugin.py`) it is built with the machine's Go from the module proxy by the
project's one plugin builder (`plugin_builder.py`), once, and cached:
`$NOMADTF_CACHE_DIR/openbao-plugins/nomadtf-consul-engine`, with the sha256 of the sources
it was built from beside it. It has a directory of its own because Nomad refuses to
start when an executable in its `plugin_dir` is not a Nomad plugin.

Before building, every module the binary links is checked: the Vault modules must be
MPL-2.0, every linked Vault source file must carry an MPL-2.0 SPDX header (v1.14.8 has a
few BUSL-1.1 files; none is linked), and no module may be BUSL.

Usage (OpenBao needs `plugin_directory` in its config before it starts):
    directory, sha256 = consul_engine.plugin(progress)
    config += consul_engine.openbao_config(directory)
    ... start, init and unseal OpenBao ...
    bootstrap.register_consul_engine(vault, directory / consul_engine.PLUGIN_NAME)
    bootstrap.configure_consul_engine(vault, consul_address, secure_state)   # config/access
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

from nomadtf.devstack import plugin_builder
from nomadtf.devstack.gobuild import check_license, go_environment, read_go_mod, required_versions
from nomadtf.devstack.protocol import Progress
from nomadtf.errors import BinaryError

PLUGIN_NAME = "nomadtf-consul-engine"
SOURCE_DIR = Path(__file__).with_name("consul_engine")
# The name in OpenBao's plugin catalog and so the mount type: the one Vault's engine had,
# which OpenBao's catalog no longer uses for anything built in.
CATALOG_NAME = "consul"
MOUNT_PATH = "consul"
VAULT_MODULE = "github.com/hashicorp/vault"
# Modules whose every linked file must be MPL-2.0 (their trees mix in BUSL files).
VAULT_MODULES = (VAULT_MODULE, f"{VAULT_MODULE}/sdk", f"{VAULT_MODULE}/api")
_SPDX = re.compile(r"SPDX-License-Identifier:\s*(\S+)")
_LICENCE_FILES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "LICENCE", "COPYING", "License")


def binary_sha256(binary: Path) -> str:
    """The sha256 OpenBao's plugin catalog wants for `binary`."""
    digest = hashlib.sha256()
    with open(binary, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def plugin(progress: Progress) -> tuple[Path, str]:
    """(plugin directory for OpenBao's config, sha256 of the binary for its catalog)."""
    binary = find_or_build(progress)
    return binary.parent, binary_sha256(binary)


def openbao_config(directory: Path | None = None) -> str:
    """The line of an OpenBao server config that lets it run the plugin."""
    return f"plugin_directory = {json.dumps(str(directory or PLUGIN.directory()))}\n"


def _licence_text(module_dir: Path) -> str | None:
    for name in _LICENCE_FILES:
        path = module_dir / name
        if path.is_file():
            return path.read_text(errors="replace")
    return None


def check_licences(progress: Progress, source: Path = SOURCE_DIR) -> dict[str, str]:
    """Download what the plugin links and refuse to build it unless the Vault modules are
    MPL-2.0 (with every linked file of theirs MPL-2.0 too) and no module is BUSL.
    Returns {"module@version": licence} for the Vault modules."""
    version = required_versions(read_go_mod(source / "go.mod")).get(VAULT_MODULE)
    if not version:
        raise BinaryError(f"{PLUGIN_NAME}: {source / 'go.mod'} does not require {VAULT_MODULE}")
    template = '{{with .Module}}{{.Path}}\t{{.Version}}\t{{.Dir}}\t{{end}}{{.Dir}}\t{{join .GoFiles ","}}'
    result = subprocess.run(
        ["go", "list", "-deps", "-f", template, "."],
        cwd=source,
        capture_output=True,
        text=True,
        env=go_environment(),
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-10:])
        raise BinaryError(
            f"{PLUGIN_NAME}: cannot list the modules it links (go list exit {result.returncode}):\n{tail}"
        )
    modules: dict[str, Path] = {}
    vault_packages: list[tuple[str, Path, list[str]]] = []
    for line in result.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) != 5:
            continue  # the standard library: no module
        path, ver, module_dir, package_dir, files = fields
        if not ver:
            continue  # this module itself
        key = f"{path}@{ver}"
        modules[key] = Path(module_dir)
        if path in VAULT_MODULES:
            vault_packages.append((key, Path(package_dir), [f for f in files.split(",") if f]))
    if f"{VAULT_MODULE}@{version}" not in modules:
        raise BinaryError(f"{PLUGIN_NAME}: the build does not link {VAULT_MODULE}@{version}")
    licences: dict[str, str] = {}
    for key, module_dir in sorted(modules.items()):
        if key.rsplit("@", 1)[0] in VAULT_MODULES:
            licences[key] = check_license(module_dir, key)  # raises unless MPL-2.0
            continue
        text = _licence_text(module_dir)
        if text is None:
            raise BinaryError(f"{PLUGIN_NAME}: {key} has no LICENSE file; refusing to build it")
        if "Business Source" in text or "BUSL" in text:
            raise BinaryError(f"{PLUGIN_NAME}: {key} is BUSL; refusing to build it")
    for key, package_dir, files in vault_packages:
        for name in files:
            head = (package_dir / name).read_text(errors="replace")[:2048]
            match = _SPDX.search(head)
            if match and match[1] != "MPL-2.0":
                raise BinaryError(
                    f"{PLUGIN_NAME}: {key}: {package_dir.name}/{name} is {match[1]}; refusing to build it"
                )
    for key, licence in licences.items():
        progress(f"{PLUGIN_NAME}: {key} is {licence}")
    progress(f"{PLUGIN_NAME}: {len(modules)} linked modules checked, none BUSL")
    return licences


PLUGIN = plugin_builder.GoPlugin(
    PLUGIN_NAME, SOURCE_DIR, "openbao-plugins", "OpenBao's Consul secrets engine", check_licences
)


def find_or_build(progress: Progress) -> Path:
    """The plugin's binary, built first when missing or its sources changed."""
    return plugin_builder.find_or_build(PLUGIN, progress)
