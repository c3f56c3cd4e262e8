"""The job's own Python environment inside one task (job.json `environment`).

`nomadtf task` keeps running from nomadtf's installation; only the child runs with the
environment's interpreter. Before the rendezvous the task reuses or builds the environment
(nomadtf.runtime.venvcache.VenvCache), telling `nomadtf run` how it goes through the run's
`environment/<role>/<index>` key in Consul, and holds it (a shared lock) until it exits,
so `nomadtf env gc` never removes it from under the code.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nomadtf import venvs
from nomadtf.errors import ServerError
from nomadtf.job.spec import JobSpec
from nomadtf.runtime import venvcache
from nomadtf.servers.consul import ConsulDiscovery

log = logging.getLogger("nomadtf.task")

LIB_DIR = "nomadtf-lib"  # in the task directory: nomadtf's stdlib-only modules for the child


@dataclass
class Ready:
    prepared: venvcache.Prepared
    lib_dir: Path
    status: dict[str, Any] = field(default_factory=dict)  # the "ready" record `run` was shown (the task adds what its child runs)

    @property
    def python(self) -> str:
        return str(self.prepared.info.python)

    def child_environ(self, env: dict[str, str]) -> dict[str, str]:
        """What to change in the child's environment (`env`, built by launch.child_env)."""
        return venvs.activation_env(self.python, self.prepared.info.path, self.lib_dir, env, venvs.supervisor_paths())


def cache_root(spec: JobSpec, environ: dict[str, str]) -> Path:
    assert spec.environment is not None
    if spec.environment.cache_dir:
        return Path(spec.environment.cache_dir)
    return venvs.default_root(environ)


def install_child_modules(task_dir: Path) -> Path:
    """nomadtf's stdlib-only modules (progress, tfserver, gpulimit, warmstart, wire) in a directory of
    their own for the child's PYTHONPATH: `import nomadtf.progress` works from the job's
    environment without nomadtf's dependencies."""
    source = Path(venvs.__file__).resolve().parent
    lib = task_dir / LIB_DIR
    package = lib / "nomadtf"
    package.mkdir(parents=True, exist_ok=True)
    for name in venvs.CHILD_MODULES:
        (package / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(source / name, package / name)
    return lib


def reuse_or_build(spec: JobSpec, role: str, index: int, task_dir: Path, discovery: ConsulDiscovery, should_stop) -> Ready:
    """Reuse or build the job's environment; EnvBuildError / EnvBuildStopped otherwise.

    PUT /v1/kv/nomadtf/<ns>/<job>/<run>/environment/<role>/<index> (best effort)
    """
    assert spec.environment is not None
    job_env = spec.environment
    python = job_env.python or venvs.default_python()
    root = cache_root(spec, dict(os.environ))
    summary = ", ".join(job_env.requirements)
    started = time.monotonic()

    def publish(status: dict[str, Any]) -> dict[str, Any]:
        status = {**status, "requirements": summary, "python": python}
        if status["state"] == "building":
            log.info("building environment %s (%s; Python %s) in %s (%ds)", status["key"], summary, python, root, status.get("elapsed_s", 0))
        elif status["state"] == "waiting":
            log.info("waiting for environment %s: another task on this client is building it", status["key"])
        try:
            discovery.publish_environment(role, index, status)
        except ServerError:
            pass  # what `run` shows is best effort; the build goes on
        return status

    try:
        prepared = venvcache.VenvCache(root).reuse_or_build(
            list(job_env.requirements), python, job_env.timeout_s, on_status=publish, should_stop=should_stop, log=log.info
        )
    except venvs.EnvBuildError as exc:
        publish({"state": "failed", "error": str(exc), "elapsed_s": round(time.monotonic() - started, 1)})
        raise
    info = prepared.info
    how = "reusing" if prepared.reused else "built"
    log.info(
        "%s environment %s (Python %s, %d packages) after %.1fs: %s",
        how, info.key, info.marker.get("python_version", "?"), len(info.marker.get("installed", [])), prepared.seconds, info.path,
    )
    ready = publish({"state": "ready", "key": info.key, "reused": prepared.reused, "elapsed_s": round(prepared.seconds, 1)})
    return Ready(prepared, install_child_modules(task_dir), ready)
