"""A job's own Python environment, a virtual environment (job.json `environment`), built
once per client with uv: the pure part. (The process environment a task or the child gets is
an `env` elsewhere: `activation_env` here is the part of it that runs the child in a venv.)

Normalising requirements and checking them (`requirement_problems`), the cache key
(`venv_key`), which requirement an installer error is about (`blame`), which environments
garbage collection removes (`unused_since`), the child's `PYTHONPATH` without nomadtf's
dependencies (`child_pythonpath`) and what activates the venv for it (`activation_env`).
The cache on one client, its locks and builds: runtime/venvcache.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomadtf import wire
from nomadtf.errors import TaskError

FORMAT = 1  # part of every key: a change of layout or build recipe never reuses old environments
MARKER = "nomadtf-env.json"
BUILD_LOG = "nomadtf-build.log"
ENV_DIR_VAR = "NOMADTF_ENV_DIR"
# Installer settings of the task's environment that change what a requirement resolves to.
INDEX_VARS = ("UV_INDEX", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "PIP_INDEX_URL")
STATUS_EVERY_S = 10.0  # how often a build in progress reports its elapsed time
POLL_S = 0.2
# What the child gets so that `import nomadtf.progress` works from the job's environment, and
# the bare TensorFlow server and the GPU cap run there: stdlib-only modules of nomadtf.
CHILD_MODULES = ("__init__.py", "progress.py", "usercode/__init__.py", "usercode/tfserver.py", "usercode/gpulimit.py", "usercode/warmstart.py", "wire.py")
# Not passed to uv: another interpreter's settings, and the task's credentials (a source
# build's setup.py runs with this environment).
BUILD_ENV_DROPPED = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX", *wire.CREDENTIAL_ENV)


class EnvBuildError(TaskError):
    """The job's environment could not be built; the message names the requirement."""


class EnvBuildStopped(TaskError):
    """The task was asked to stop while it waited for or built the environment."""


# ---- pure -------------------------------------------------------------------------------------


def requirement_problems(requirements: list[Any], where: str = "environment.requirements") -> list[str]:
    """One line per requirement that is not a PEP 508 requirement (options such as
    `--index-url` are not requirements: the installer's settings come from the client's
    or the job's env)."""
    from packaging.requirements import InvalidRequirement, Requirement  # only with `environment`

    problems = []
    for i, text in enumerate(requirements):
        if not isinstance(text, str):
            continue  # the schema says it
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            reason = str(exc).splitlines()[0]
            problems.append(f"{where}[{i}]: {text!r} is not a requirement ({reason}); write e.g. 'tensorflow-cpu==2.20.0'")
    return problems


def normalize_requirements(requirements: Iterable[str]) -> tuple[str, ...]:
    """Canonical spelling (PEP 503 names, sorted extras and specifiers), sorted, once each:
    the same set written differently gives the same environment."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    out = set()
    for text in requirements:
        req = Requirement(text)
        req.name = canonicalize_name(req.name)
        req.extras = {canonicalize_name(e) for e in req.extras}  # PEP 685
        out.add(str(req))
    return tuple(sorted(out))


def venv_key(requirements: Iterable[str], python: str, machine: str | None = None, index: dict[str, str] | None = None) -> str:
    """The cache key: a digest of the normalised requirements, the Python asked for, the
    machine type and the package index settings."""
    material = {
        "format": FORMAT,
        "requirements": list(normalize_requirements(requirements)),
        "python": python,
        "machine": machine or platform.machine(),
        "index": dict(sorted((index or {}).items())),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def index_settings(environ: dict[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in INDEX_VARS if environ.get(name)}


def default_python() -> str:
    """The Python asked for when the job names none: the minor version that runs nomadtf."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def blame(requirements: Iterable[str], output: str) -> list[str]:
    """The requirements whose package the installer's error output names."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    text = output.lower()
    named = []
    for req_text in requirements:
        name = canonicalize_name(Requirement(req_text).name)
        variants = {name, name.replace("-", "_"), name.replace("-", ".")}
        if any(re.search(rf"(?<![\w.-]){re.escape(v)}(?![\w-])", text) for v in variants):
            named.append(req_text)
    return named


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def installer_reason(output: str, limit: int = 6) -> str:
    """The lines of uv's output that explain a failure (its `×`/`╰─▶` block, `error:` lines)."""
    lines = [ANSI.sub("", line).strip() for line in output.splitlines()]
    picked = [
        re.sub(r"^(error|cause|Caused by|hint):\s*", "", line.lstrip("×╰─▶│ ")).strip() for line in lines
        if line.startswith(("×", "╰─▶", "│", "error:", "cause:", "Caused by:", "hint:")) or "No solution found" in line
    ]
    picked = [line for line in picked if line] or [line for line in lines if line][-limit:]
    return "; ".join(picked[:limit])


def unused_since(entries: Iterable[VenvInfo], now: float, older_than_s: float) -> list[VenvInfo]:
    """The environments last used more than `older_than_s` ago (whether one is in use right
    now only its lock can say: `gc` asks it just before removing)."""
    return [e for e in entries if now - e.last_used > older_than_s]


def child_pythonpath(inherited: str, leaky: Iterable[str], last: list[str]) -> str:
    """The inherited PYTHONPATH (the code's workdir and entrypoint.pythonpath first) without
    the directories that hold nomadtf's installation and dependencies (`leaky`), then `last`."""
    drop = {os.path.realpath(p) for p in leaky if p}
    kept = [p for p in inherited.split(os.pathsep) if p and os.path.realpath(p) not in drop]
    return os.pathsep.join(dict.fromkeys([*kept, *last]))


def supervisor_paths() -> list[str]:
    """Where nomadtf and its dependencies are installed: never on the child's path."""
    import sysconfig

    paths = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    paths.add(str(Path(__file__).resolve().parent.parent))  # nomadtf's own source tree
    paths.update(p for p in sys.path if p and "site-packages" in p)
    return sorted(paths)


def activation_env(python: str, venv_dir: Path, lib_dir: Path, environ: dict[str, str], leaky: Iterable[str]) -> dict[str, str]:
    """The variables that make the child run in the job's venv (what `bin/activate` sets):
    its bin first on PATH (so `python` in the code's subprocesses is the job's), VIRTUAL_ENV,
    and a PYTHONPATH with nomadtf's stdlib-only modules (`lib_dir`) but none of nomadtf's
    dependencies. Pure."""
    bin_dir = str(Path(python).parent)
    path = [p for p in environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    return {
        "PATH": os.pathsep.join([bin_dir, *path]),
        "VIRTUAL_ENV": str(venv_dir),
        "PYTHONPATH": child_pythonpath(environ.get("PYTHONPATH", ""), leaky, [str(lib_dir)]),
    }


def build_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment uv and the build's own commands run with: the task's, without
    BUILD_ENV_DROPPED. Pure."""
    env = {k: v for k, v in environ.items() if k not in BUILD_ENV_DROPPED}
    env.update(NO_COLOR="1", UV_NO_PROGRESS="1")
    return env


def default_root(environ: dict[str, str]) -> Path:
    if environ.get(ENV_DIR_VAR):
        return Path(environ[ENV_DIR_VAR])
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "nomadtf" / "envs"


@dataclass(frozen=True)
class VenvInfo:
    key: str
    path: Path
    last_used: float  # unix time (the marker's mtime)
    marker: dict[str, Any] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"
