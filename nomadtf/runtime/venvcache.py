"""The cache of job environments on one client (job.json `environment`; the pure part:
nomadtf/venvs.py): `VenvCache.reuse_or_build` reuses or builds one environment with uv,
`gc` removes unused ones, `entries` lists them (`nomadtf env`).

The cache, one per client (`environment.cache_dir`, else $NOMADTF_ENV_DIR, else
$XDG_CACHE_HOME/nomadtf/envs, i.e. ~/.cache/nomadtf/envs of the user Nomad runs tasks as):

    <root>/<key>/                   a complete virtual environment (uv venv --relocatable)
    <root>/<key>/nomadtf-env.json   its marker, written before the rename that publishes the
                                    directory (so it means "complete"); its mtime is the last use
    <root>/locks/<key>.lock         flock: shared while a task uses the environment,
                                    exclusive while one builds it or `gc` removes it
    <root>/.build-<key>-<random>/   a build in progress: never used, removed if it fails
    <root>/.trash-<key>-<random>/   an environment `gc` is removing

A task takes the shared lock; a complete environment is used at once. Otherwise it drops
it and tries for the exclusive one, looks again (another task of this client may have built
it meanwhile), builds into a temporary directory, renames it into place, and holds the
shared lock until it exits. Nobody blocks while holding a lock (the attempts never wait;
between them the task polls), so a task that waits can never wait on every user of an
environment. `gc` takes the exclusive lock without waiting, so an
environment that any task holds is never removed. Lock files are never deleted: a deleted
lock file lets two processes hold "the" lock on different inodes.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nomadtf.venvs import (
    ANSI,
    BUILD_LOG,
    MARKER,
    POLL_S,
    STATUS_EVERY_S,
    EnvBuildError,
    EnvBuildStopped,
    VenvInfo,
    blame,
    build_env,
    index_settings,
    installer_reason,
    unused_since,
    venv_key,
)

# uv's own process group (Python 3.10 has no Popen(process_group): a session is one too).
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


@dataclass
class Prepared:
    """An environment ready for the child, held (shared lock) until `release`."""

    info: VenvInfo
    reused: bool
    seconds: float
    lock_fd: int

    def release(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # closing drops the flock
            self.lock_fd = -1


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError as exc:  # pragma: no cover - uv is a dependency
        raise EnvBuildError("uv is not installed beside nomadtf (pip install uv)") from exc
    return find_uv_bin()


class VenvCache:
    """Usage:
    cache = VenvCache(Path("~/.cache/nomadtf/envs").expanduser())
    ready = cache.reuse_or_build(["tensorflow-cpu==2.20.0"], "3.11", timeout_s=900, on_status=print)
    ready.info.python        # .../<key>/bin/python
    cache.gc(older_than_s=7 * 86400)
    """

    def __init__(self, root: Path):
        self.root = root

    def venv_path(self, key: str) -> Path:
        return self.root / key

    def lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    def info(self, key: str) -> VenvInfo | None:
        """The complete environment of `key`, or None."""
        marker = self.venv_path(key) / MARKER
        try:
            data = json.loads(marker.read_text())
            return VenvInfo(key, self.venv_path(key), marker.stat().st_mtime, data)
        except (OSError, ValueError):
            return None

    def entries(self) -> list[VenvInfo]:
        if not self.root.is_dir():
            return []
        found = [self.info(p.name) for p in sorted(self.root.iterdir()) if p.is_dir() and not p.name.startswith((".", "locks"))]
        return [e for e in found if e is not None]

    def in_use(self, key: str) -> bool:
        fd = self._open_lock(key)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def _open_lock(self, key: str) -> int:
        path = self.lock_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    # ---- using and building ------------------------------------------------------------------

    def reuse_or_build(
        self,
        requirements: list[str],
        python: str,
        timeout_s: float,
        on_status: Callable[[dict[str, Any]], None] = lambda _s: None,
        should_stop: Callable[[], bool] = lambda: False,
        environ: dict[str, str] | None = None,
        log: Callable[[str], None] = lambda _line: None,
    ) -> Prepared:
        """The environment for these requirements, reused or built; held with a shared lock.
        EnvBuildError (naming the requirement) when it cannot be built within `timeout_s`
        (waiting for another task's build included); EnvBuildStopped when `should_stop`."""
        environ = dict(os.environ if environ is None else environ)
        key = venv_key(requirements, python, index=index_settings(environ))
        try:
            return self._reuse_or_build(key, requirements, python, timeout_s, on_status, should_stop, environ, log)
        except OSError as exc:  # the cache directory: permissions, a full disk
            raise EnvBuildError(f"environment {key} in {self.root}: {exc.strerror or exc}") from exc
        except subprocess.SubprocessError as exc:
            raise EnvBuildError(f"environment {key}: checking the new environment failed: {exc}") from exc

    def _reuse_or_build(self, key, requirements, python, timeout_s, on_status, should_stop, environ, log) -> Prepared:
        started = time.monotonic()
        deadline = started + timeout_s
        fd = self._open_lock(key)
        waiting = False
        try:
            while True:
                # Never block while holding a lock: a task that waited for the exclusive lock
                # while holding the shared one would wait for every user of the environment.
                if _try_lock(fd, fcntl.LOCK_SH):
                    if self.info(key) is not None:
                        reused = True
                        break
                    fcntl.flock(fd, fcntl.LOCK_UN)
                if _try_lock(fd, fcntl.LOCK_EX):
                    reused = self.info(key) is not None  # built between our two attempts
                    if not reused:
                        self._build(key, requirements, python, deadline, timeout_s, on_status, should_stop, environ, log)
                    os.utime(self.venv_path(key) / MARKER)  # the last use, before others may take the lock
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    break
                if not waiting:
                    waiting = True
                    on_status({"state": "waiting", "key": key})
                if should_stop():
                    raise EnvBuildStopped("asked to stop while waiting for the environment")
                if time.monotonic() > deadline:
                    raise EnvBuildError(
                        f"environment {key}: another task on this client was still building it after "
                        f"environment.timeout ({timeout_s:.0f}s)"
                    )
                time.sleep(POLL_S * (0.5 + random.random()))  # jitter: two tasks never poll in step
            os.utime(self.venv_path(key) / MARKER)
            info = self.info(key)
            assert info is not None
        except BaseException:
            os.close(fd)
            raise
        return Prepared(info, reused, time.monotonic() - started, fd)

    def _build(self, key, requirements, python, deadline, timeout_s, on_status, should_stop, environ, log) -> VenvInfo:
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(f".build-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a build that died; we hold the exclusive lock
        tmp = self.root / f".build-{key}-{secrets.token_hex(4)}"
        started = time.monotonic()
        on_status({"state": "building", "key": key, "elapsed_s": 0})
        try:
            uv = _uv()
            env = build_env(environ)
            run = _Runner(tmp, env, deadline, timeout_s, should_stop, lambda: on_status(
                {"state": "building", "key": key, "elapsed_s": round(time.monotonic() - started)}), log)
            tmp.mkdir()
            run([uv, "venv", "--allow-existing", "--relocatable", "--no-project", "--python", python, str(tmp)], requirements)
            reqs = tmp / "nomadtf-requirements.txt"
            reqs.write_text("".join(f"{r}\n" for r in requirements))
            run([uv, "pip", "install", "--python", str(tmp / "bin" / "python"), "-r", str(reqs)], requirements)
            version = subprocess.run(
                [str(tmp / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
                capture_output=True, text=True, timeout=60, env=env, check=True,
            ).stdout.strip()
            frozen = subprocess.run(
                [uv, "pip", "freeze", "--python", str(tmp / "bin" / "python")],
                capture_output=True, text=True, timeout=60, env=env, cwd=tmp, check=True,
            ).stdout.split()
            marker = {
                "key": key, "requirements": list(requirements), "python": python, "python_version": version,
                "installed": frozen, "built_at": time.time(), "build_s": round(time.monotonic() - started, 1),
            }
            (tmp / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True))
            os.rename(tmp, self.venv_path(key))  # atomic: the environment is complete or absent
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        info = self.info(key)
        assert info is not None
        return info

    # ---- garbage collection -------------------------------------------------------------------

    def gc(self, older_than_s: float, now: float | None = None, dry_run: bool = False) -> tuple[list[VenvInfo], list[VenvInfo]]:
        """Remove the environments unused for longer than `older_than_s` that no task holds,
        and builds that died. Returns (removed, skipped because in use)."""
        now = time.time() if now is None else now
        removed, busy = [], []
        for entry in unused_since(self.entries(), now, older_than_s):
            fd = self._open_lock(entry.key)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    busy.append(entry)
                    continue
                current = self.info(entry.key)  # used again since we listed it?
                if current is None or now - current.last_used <= older_than_s:
                    continue
                if not dry_run:
                    trash = self.root / f".trash-{entry.key}-{secrets.token_hex(4)}"
                    os.rename(entry.path, trash)
                    shutil.rmtree(trash, ignore_errors=True)
                removed.append(entry)
            finally:
                os.close(fd)
        if not dry_run:
            self._remove_leftovers()
        return removed, busy

    def _remove_leftovers(self) -> None:
        """Builds and removals that died half-way (their key's lock is free)."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            match = re.fullmatch(r"\.(?:build|trash)-([0-9a-f]+)-[0-9a-f]+", path.name)
            if not match:
                continue
            fd = self._open_lock(match[1])
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(path, ignore_errors=True)
            except BlockingIOError:
                pass
            finally:
                os.close(fd)


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class _Runner:
    """Runs one installer command within the deadline, stoppable, reporting every
    STATUS_EVERY_S; its output goes to the task's log and, on failure, into the error."""

    def __init__(self, workdir, env, deadline, timeout_s, should_stop, tick, log):
        self.workdir, self.env, self.deadline, self.timeout_s = workdir, env, deadline, timeout_s
        self.should_stop, self.tick, self.log = should_stop, tick, log

    def __call__(self, argv: list[str], requirements: list[str]) -> None:
        # Kept in the environment: how it was built.
        with open(self.workdir / BUILD_LOG, "a+") as out:
            start = out.tell()
            # Its own process group: a stop or the timeout ends uv and whatever it started.
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=self.workdir.parent, stdin=subprocess.DEVNULL, **OWN_GROUP)
            last_tick = time.monotonic()
            try:
                while proc.poll() is None:
                    if self.should_stop():
                        raise EnvBuildStopped("asked to stop while building the environment")
                    if time.monotonic() > self.deadline:
                        raise EnvBuildError(
                            f"building the environment ({', '.join(requirements)}) took longer than "
                            f"environment.timeout ({self.timeout_s:.0f}s)"
                        )
                    if time.monotonic() - last_tick >= STATUS_EVERY_S:
                        last_tick = time.monotonic()
                        self.tick()
                    time.sleep(POLL_S)
            finally:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
            out.seek(start)
            output = out.read()
        for line in output.splitlines():
            if line.strip():
                self.log(f"uv: {ANSI.sub('', line.rstrip())}")
        if proc.returncode != 0:
            named = blame(requirements, output)
            which = f"requirement {', '.join(repr(r) for r in named)}" if named else f"requirements {', '.join(repr(r) for r in requirements)}"
            raise EnvBuildError(f"cannot build the environment: {which}: {installer_reason(output)}")
