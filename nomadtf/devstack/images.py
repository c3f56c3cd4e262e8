"""`nomadtf dev image build`: the repository's Dockerfile, built on this machine for the
local stack's Docker daemon, with no registry to pull from (Docker Hub cannot be reached
here, and need not be).

1. A base image made here: `debootstrap --variant=minbase` of Debian bookworm with Python
   (`BASE_PACKAGES`), imported with `docker import` (the official TensorFlow image's place).
2. A wheelhouse made on this machine by its pip, which reaches PyPI through the machine's
   own CA: nomadtf's wheel, its dependencies and TensorFlow. The build itself installs from
   it without an index, so no CA bundle and no network are needed inside a container.
3. `docker build` of the Dockerfile with BASE = that image, TENSORFLOW = the requirement.

Both images are cached in the daemon (whose data root outlives `dev down`, docker.py) and
found again by their tags: the base by its package list, the image by the sha256 of what
goes into it (the Dockerfile, nomadtf's sources, the TensorFlow requirement, the base).

Usage:
    ref = build(daemon.client(), progress, tf_version="2.21.0")   # e.g. nomadtf:tf2.21.0-cpu-3f2a9c1e0b
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nomadtf.devstack.protocol import Progress
from nomadtf.errors import DevStackError

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps")
BASE_REPOSITORY = "nomadtf-base"
REPOSITORY = "nomadtf"
# What the examples import besides TensorFlow, and TensorBoard for the tensorboard role (the
# Dockerfile's EXTRA_REQUIREMENTS default).
EXTRA_REQUIREMENTS = ("scikit-learn", "tensorboard")
# What the image's tasks run under; the container's Python must be the one the wheels are for.
CONTAINER_PYTHON = "3.11"
# Parts of the root filesystem no task needs (apt's caches, documentation).
_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale")
# What of the checkout goes into the image (and so into its cache key).
_SOURCES = ("pyproject.toml", "README.md", "nomadtf", "templates", "examples", "Dockerfile")


def repo_root() -> Path:
    """The checkout nomadtf runs from: the Dockerfile and the sources live there."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "Dockerfile").is_file() or not (root / "pyproject.toml").is_file():
        raise DevStackError(f"`dev image build` needs nomadtf's checkout (its Dockerfile); none at {root}: install nomadtf with `pip install -e` from a clone")
    return root


def installed_tensorflow() -> str | None:
    """The TensorFlow version of this installation (the one nomadtf is tested with), if any."""
    for name in ("tensorflow-cpu", "tensorflow"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True)
class ImageSpec:
    """What one image holds: TensorFlow `tf_version`, the GPU build (`gpu`: tensorflow with
    its CUDA wheels, `tensorflow[and-cuda]`) or the CPU one (`tensorflow-cpu`)."""

    tf_version: str
    gpu: bool = False

    @property
    def requirement(self) -> str:
        return f"tensorflow[and-cuda]=={self.tf_version}" if self.gpu else f"tensorflow-cpu=={self.tf_version}"

    @property
    def flavour(self) -> str:
        return "gpu" if self.gpu else "cpu"


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


def sources_digest(root: Path) -> str:
    """sha256 over the checkout's files that go into the image (names and contents)."""
    parts: list[bytes] = []
    for name in _SOURCES:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) if path.is_dir() else [path]
        for file in files:
            parts += [str(file.relative_to(root)).encode(), file.read_bytes()]
    return _digest(parts)


def base_tag() -> str:
    return f"{BASE_REPOSITORY}:{SUITE}-{_digest([SUITE.encode(), *(p.encode() for p in BASE_PACKAGES)])[:10]}"


def image_tag(spec: ImageSpec, base: str, sources: str) -> str:
    key = _digest([spec.requirement.encode(), *(r.encode() for r in EXTRA_REQUIREMENTS), base.encode(), sources.encode()])[:10]
    return f"{REPOSITORY}:tf{spec.tf_version}-{spec.flavour}-{key}"


def older_builds(ref: str, tags: list[str]) -> list[str]:
    """The tags in `tags` of earlier builds of `ref`'s version and flavour (the same
    `nomadtf:tf<version>-<flavour>-` with another key): superseded by `ref`, each about 2 GB.
    Other versions, other flavours and the key-less alias are never among them. Pure."""
    head = ref.rsplit("-", 1)[0] + "-"
    return sorted(t for t in tags if t.startswith(head) and t != ref and len(t) == len(ref))


def prune_older(client, ref: str, progress: Progress) -> None:
    """Remove the earlier builds `older_builds` names from the daemon (one a container still
    uses stays, and is named). Without it every change to the checkout leaves 2 GB behind."""
    import docker

    tags = [t for image in client.images.list(name=REPOSITORY) for t in image.tags]
    for old in older_builds(ref, tags):
        try:
            client.images.remove(old)
            progress(f"removed {old}, an earlier build of {ref.rsplit('-', 1)[0]}")
        except docker.errors.APIError as exc:
            progress(f"kept {old}: {exc.explanation or exc}")


def present(client, ref: str) -> bool:
    """Whether the daemon `client` has the image `ref`."""
    import docker

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


# What a build beside other work runs at (`build(..., yield_cpu=True)`): its commands at the
# lowest priority, its `docker build` containers at the fewest CPU shares the daemon takes.
NICE = ["nice", "-n", "19"]
LEAST_CPU_SHARES = 2


def _run(argv: list[str], what: str, yield_cpu: bool = False) -> None:
    done = subprocess.run([*NICE, *argv] if yield_cpu else argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise DevStackError(f"{what} failed (exit {done.returncode}):\n{tail}")


def build_base(client, progress: Progress, yield_cpu: bool = False) -> str:
    """The Debian base image, made once: debootstrap → a tarball → `docker import`."""
    tag = base_tag()
    if present(client, tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise DevStackError("`dev image build` makes its base with debootstrap: install Debian's debootstrap (scripts/setup does)")
    with tempfile.TemporaryDirectory(prefix="nomadtf-base-") as work:
        rootfs = Path(work) / "rootfs"
        progress(f"debootstrap {SUITE} (minbase, {', '.join(BASE_PACKAGES)}): about a minute")
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), MIRROR], "debootstrap", yield_cpu)
        for part in _PRUNE:
            shutil.rmtree(rootfs / part, ignore_errors=True)
        tarball = Path(work) / "rootfs.tar"
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], "tar of the root filesystem", yield_cpu)
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(str(tarball), repository=repository, tag=version)
    progress(f"base image {tag} imported")
    return tag


def _wheelhouse(dest: Path, root: Path, spec: ImageSpec, progress: Progress, yield_cpu: bool = False) -> None:
    """nomadtf's wheel, its dependencies and TensorFlow, from this machine's pip."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    progress("wheelhouse: nomadtf's wheel")
    _run([*pip, "wheel", "--no-deps", "--wheel-dir", str(dest), str(root)], "pip wheel of nomadtf", yield_cpu)
    wheel = next(dest.glob("nomadtf-*.whl"))
    progress(f"wheelhouse: nomadtf's dependencies and {spec.requirement} (pip's cache makes a second build fast)")
    _run([*pip, "download", "--only-binary=:all:", "--dest", str(dest), str(wheel), spec.requirement, *EXTRA_REQUIREMENTS], "pip download", yield_cpu)


def _spec(tf_version: str | None, gpu: bool) -> ImageSpec:
    if f"{sys.version_info.major}.{sys.version_info.minor}" != CONTAINER_PYTHON:
        raise DevStackError(f"the image's Python is {CONTAINER_PYTHON} (Debian {SUITE}) and its wheels come from this pip: run nomadtf under Python {CONTAINER_PYTHON}")
    version = tf_version or installed_tensorflow()
    if version is None:
        raise DevStackError("no TensorFlow in this installation to match: pass --tf VERSION (e.g. --tf 2.21.0)")
    return ImageSpec(version, gpu)


def reference(tf_version: str | None = None, gpu: bool = False) -> str:
    """The reference `build` gives this checkout's image, without building anything: what
    to look for in a daemon that may have it already."""
    return image_tag(_spec(tf_version, gpu), base_tag(), sources_digest(repo_root()))


def build(client, progress: Progress, tf_version: str | None = None, gpu: bool = False, yield_cpu: bool = False) -> str:
    """Find or build the image for TensorFlow `tf_version` (None: this installation's) and
    return its reference. `yield_cpu`: build at the lowest CPU priority, for a build beside
    work that must not wait for it (the test suite builds its images so, in the background)."""
    spec = _spec(tf_version, gpu)
    root = repo_root()
    base = build_base(client, progress, yield_cpu)
    ref = image_tag(spec, base, sources_digest(root))
    alias_tag = f"tf{spec.tf_version}-{spec.flavour}"
    alias = f"{REPOSITORY}:{alias_tag}"
    if present(client, ref):
        client.images.get(ref).tag(REPOSITORY, alias_tag)  # the alias may name an older build of this version
        progress(f"{ref} is built already (also tagged {alias})")
        return ref
    with tempfile.TemporaryDirectory(prefix="nomadtf-image-") as work:
        context = Path(work)
        shutil.copy2(root / "Dockerfile", context / "Dockerfile")
        shutil.copytree(root / "examples", context / "examples", ignore=shutil.ignore_patterns("__pycache__"))
        _wheelhouse(context / "wheels", root, spec, progress, yield_cpu)
        progress(f"docker build {ref} (BASE={base})")
        args = {"BASE": base, "TENSORFLOW": spec.requirement, "PIP_NO_INDEX": "1"}
        limits = {"cpushares": LEAST_CPU_SHARES} if yield_cpu else None
        for chunk in client.api.build(path=str(context), tag=ref, buildargs=args, rm=True, forcerm=True, decode=True, container_limits=limits):
            if "error" in chunk:
                raise DevStackError(f"docker build of {ref} failed: {chunk['error'].strip()}")
            line = (chunk.get("stream") or "").strip()
            if line.startswith("Step "):
                progress(f"    {line}")
    # The build stage (the wheelhouse and pip's work) is left untagged: it is never used again.
    client.images.prune(filters={"dangling": True})
    # A second name without the key: what a job.json on this machine can name for the version.
    client.images.get(ref).tag(REPOSITORY, alias_tag)
    progress(f"{ref} built (also tagged {alias})")
    prune_older(client, ref, progress)
    return ref


def copy(source, target, ref: str, progress: Progress, to: str = "another daemon") -> None:
    """Give the daemon `target` the image `ref` of the daemon `source` (each a Docker SDK
    client), unless it has it: the several-client stack has a daemon per client and no
    registry between them. The image streams from one to the other (`docker save | docker
    load`, in chunks: a TensorFlow image is about 2 GB); its key-less alias comes along."""
    if present(target, ref):
        return
    progress(f"copying {ref} to {to}")
    started = time.monotonic()
    for chunk in target.api.load_image(source.api.get_image(ref, chunk_size=4 * 2**20)) or ():
        if isinstance(chunk, dict) and "error" in chunk:
            raise DevStackError(f"docker load of {ref} into {to} failed: {chunk['error'].strip()}")
    for alias in source.images.get(ref).tags:
        repository, _, tag = alias.rpartition(":")
        target.images.get(ref).tag(repository, tag)
    progress(f"{ref} copied to {to} in {time.monotonic() - started:.0f}s")
    prune_older(target, ref, progress)
