"""The run's archive: each task keeps its code's stdout and stderr, per attempt, and the
task that records the run's outcome keeps that record, in the run's own folder beside its
checkpoints, so that `nomadtf logs` and `nomadtf status` can show them after Nomad has
collected the job (client/archive.py reads them back).

    <root>/<job>/<run>/.nomadtf-archive/outcome.json
    <root>/<job>/<run>/.nomadtf-archive/<role>-<index>/<attempt>.stdout | .stderr

<root> is job.json `archive.folder`, or model_dir's namespace folder (spec.namespace_folder:
/tmp/nomadtf/<namespace> by default, the folder a docker task mounts); an attempt is one
start of the child, named so that names sort by time (`attempt_name`).

How the output is kept: a tee. The child's stdout and stderr are pipes; one thread per
stream reads what the child writes and writes it both to the task's own stream (Nomad's
log, as before) and to the attempt's file. The child never waits for the archive: a pipe
holds 64 KiB and the thread only copies. (Copying Nomad's alloc/logs files at each
attempt's end was the other way: it mixes the supervisor's lines into the code's, loses
what logmon had not yet flushed and what its rotation dropped, and the attempt of a task
killed outright is never copied.) An archive that cannot be written (disk full) is given
up with one warning; Nomad's log goes on.

A size cap per task (`archive.max_mib_per_task`): the oldest attempts are dropped first;
an attempt alone over the cap keeps its last part (`to_drop`, `tail_start`, pure).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nomadtf import wire
from nomadtf.job.spec import JobSpec
from nomadtf.job.taskfile import expand_task_vars
from nomadtf.job.validate import namespace_folder
from nomadtf.runtime.codeuser import CodeUser

log = logging.getLogger("nomadtf.task")

DEFAULT_MAX_MIB = 20.0
STREAMS = ("stdout", "stderr")
CHUNK = 65_536
CUT_NOTE = b"[nomadtf archive: earlier output of this attempt dropped, over archive.max_mib_per_task]\n"


# ---- pure -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveSettings:
    root: str
    cap_bytes: int


def settings(spec: JobSpec) -> ArchiveSettings | None:
    """job.json `archive` with its defaults; None: no archive (switched off, or no folder:
    a model_dir outside every namespace's folder and no `archive.folder`). `spec` is the
    task's (model_dir expanded)."""
    section = spec.document.get("archive") or {}
    if not section.get("enabled", True):
        return None
    folder = section.get("folder")
    root = expand_task_vars(folder, {wire.ENV_NOMAD_NAMESPACE: spec.namespace}) if folder else namespace_folder(spec.model_dir, spec.namespace)
    if not root:
        return None
    return ArchiveSettings(root, int(float(section.get("max_mib_per_task", DEFAULT_MAX_MIB)) * 2**20))


def run_folder(root: str, job: str, run_id: str) -> Path:
    return Path(root) / job / (run_id or "0") / wire.ARCHIVE_DIR


def task_folder(run: Path, role: str, index: int) -> Path:
    return run / f"{role}-{index}"


def attempt_name(started: float, alloc_id: str, number: int) -> str:
    """Sorts by time across the task's allocations and restarts: 20261206T175810.123-<alloc8>-<n>."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + f".{int(started * 1000) % 1000:03d}"
    return f"{stamp}-{alloc_id[:8]}-{number}"


def attempt_of(file_name: str) -> str:
    """"<attempt>.stdout" -> "<attempt>"."""
    return file_name.rsplit(".", 1)[0]


def to_drop(sizes: dict[str, int], cap: int, current: str) -> list[str]:
    """The attempts to remove, oldest first, so that what is left fits `cap`. `sizes`:
    attempt -> its bytes (both streams). The current attempt is never dropped (its own
    excess is cut from its head instead, `tail_start`)."""
    total = sum(sizes.values())
    drop = []
    for attempt in sorted(sizes):
        if total <= cap:
            break
        if attempt == current:
            continue
        drop.append(attempt)
        total -= sizes[attempt]
    return drop


def tail_start(size: int, cap: int) -> int:
    """Where the kept part of a stream over its share of the cap (half: two streams) starts:
    it keeps the last quarter of the cap, so cutting is rare (once per quarter written)."""
    return max(0, size - cap // 4)


# ---- the archive of one task ------------------------------------------------------------------


class TaskArchive:
    """Usage (the supervisor; one per task):
    archive = TaskArchive.of(spec, role, index, alloc_id, user)   # None: no archive
    child = Child(..., capture=archive.capture)                  # each start: a new attempt
    archive.write_outcome(record)                                # by the task that records it
    """

    def __init__(self, run: Path, role: str, index: int, alloc_id: str, cap: int, user: CodeUser | None = None):
        self.run = run
        self.folder = task_folder(run, role, index)
        self.alloc_id = alloc_id
        self.cap = cap
        self.user = user
        self.count = 0
        self.broken = False  # the archive could not be written: only Nomad's log goes on
        self.total = 0  # bytes in our folder, as far as we know (scanned only when over the cap)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, spec: JobSpec, role: str, index: int, alloc_id: str, user: CodeUser | None = None) -> TaskArchive | None:
        chosen = settings(spec)
        if chosen is None:
            log.info("no archive of the run's output: model_dir %s is outside every namespace's folder and job.json has no archive.folder", spec.model_dir)
            return None
        return cls(run_folder(chosen.root, spec.name, spec.run_id), role, index, alloc_id, chosen.cap_bytes, user)

    def capture(self, stdout: IO[bytes], stderr: IO[bytes]) -> list[threading.Thread]:
        """Tee a new attempt's pipes to our own streams and its files; the threads end at EOF."""
        self.count += 1
        name = attempt_name(time.time(), self.alloc_id, self.count)
        files = {stream: self._open(name, stream) for stream in STREAMS}
        with self._lock:
            self.total = self._sizes_total()
        threads = []
        for stream, pipe, out_fd in (("stdout", stdout, 1), ("stderr", stderr, 2)):
            thread = threading.Thread(target=self._pump, args=(pipe, out_fd, files[stream], name), name=f"tee-{stream}", daemon=True)
            thread.start()
            threads.append(thread)
        return threads

    def write_outcome(self, record: dict[str, Any]) -> None:
        """outcome.json of the run, written whole (a reader never sees half of it)."""
        try:
            self._make_dirs(self.run)
            tmp = self.run / f".{wire.ARCHIVE_OUTCOME_FILE}.{os.getpid()}"
            tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
            os.replace(tmp, self.run / wire.ARCHIVE_OUTCOME_FILE)
        except OSError as exc:
            log.warning("archive: could not write the run's outcome in %s: %s", self.run, exc)

    def last_stderr(self, limit: int = 16_384) -> str:
        """The end of the newest attempt's stderr that holds anything ("" when none does): a
        failure's report (a child started ahead since has written nothing yet)."""
        try:
            newest = max((path for path in self.folder.glob("*.stderr") if path.stat().st_size), default=None)
            if newest is None:
                return ""
            with open(newest, "rb") as file:
                file.seek(max(0, newest.stat().st_size - limit))
                return file.read().decode(errors="replace")
        except OSError:
            return ""

    def _open(self, name: str, stream: str) -> IO[bytes] | None:
        if self.broken:
            return None
        try:
            self._make_dirs(self.folder)
            return open(self.folder / f"{name}.{stream}", "ab", buffering=0)  # noqa: SIM115 - the pump closes it
        except OSError as exc:
            self._give_up(exc)
            return None

    def _make_dirs(self, folder: Path) -> None:
        if self.user is not None:
            self.user.make_dirs(folder)  # the run's folder is the code user's (its checkpoints)
        else:
            folder.mkdir(parents=True, exist_ok=True)

    def _pump(self, pipe: IO[bytes], out_fd: int, file: IO[bytes] | None, name: str) -> None:
        fd = pipe.fileno()
        try:
            while chunk := os.read(fd, CHUNK):
                _write_all(out_fd, chunk)
                if file is not None:
                    file = self._keep(file, chunk, name)
        except OSError:
            pass  # our own stream is gone (the task is ending): nothing left to copy to
        finally:
            pipe.close()
            if file is not None:
                file.close()
                with contextlib.suppress(OSError):
                    if os.path.getsize(file.name) == 0:
                        os.unlink(file.name)  # a stream the attempt never wrote to

    def _keep(self, file: IO[bytes], chunk: bytes, name: str) -> IO[bytes] | None:
        try:
            file.write(chunk)
            if file.tell() > self.cap // 2:
                file = self._cut(file)
            with self._lock:
                self.total += len(chunk)
                if self.total > self.cap:
                    self._enforce_cap(name)
            return file
        except OSError as exc:
            self._give_up(exc)
            file.close()
            return None

    def _cut(self, file: IO[bytes]) -> IO[bytes]:
        """Keep the stream's last part (`tail_start`), with a note that its head was dropped."""
        path = Path(file.name)
        size = file.tell()
        file.close()
        with open(path, "rb") as old:
            old.seek(tail_start(size, self.cap))
            kept = old.read()
        path.write_bytes(CUT_NOTE + kept)
        return open(path, "ab", buffering=0)  # noqa: SIM115 - the pump closes it

    def _sizes(self) -> dict[str, int]:
        """attempt -> its bytes on disk (both streams)."""
        sizes: dict[str, int] = {}
        try:
            for path in self.folder.iterdir():
                sizes[attempt_of(path.name)] = sizes.get(attempt_of(path.name), 0) + path.stat().st_size
        except OSError:
            pass
        return sizes

    def _sizes_total(self) -> int:
        return sum(self._sizes().values())

    def _enforce_cap(self, current: str) -> None:
        sizes = self._sizes()
        for attempt in to_drop(sizes, self.cap, current):
            for stream in STREAMS:
                (self.folder / f"{attempt}.{stream}").unlink(missing_ok=True)
            sizes.pop(attempt)
        self.total = sum(sizes.values())

    def _give_up(self, exc: OSError) -> None:
        if not self.broken:
            self.broken = True
            log.warning("archive: cannot write the code's output to %s (%s); it goes to Nomad's log only", self.folder, exc)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
