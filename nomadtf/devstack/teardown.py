"""Taking a stack down: stop what it started, in order, and remove its state directory.

Only what the record names is touched: the recorded processes (same PID and start time)
and the processes they started, collected before anything stops (Nomad's executors and
their tasks outlive the agent by design, re-parented to init, where nothing links them to
it any more). Nomad first, so its tasks stop while Consul and OpenBao still answer them. A
directory without the marker is refused and left as it is.

Usage:
    refuse_unmarked(state_dir, "`nomadtf dev up` did not create it")
    stop_in_order([("nomad (pid 12) and 3 processes it started", procs), ...], grace, progress, "nomadtf dev down")
    remove_state(state_dir)
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import psutil

from nomadtf.devstack import processes
from nomadtf.devstack.protocol import Progress
from nomadtf.devstack.record import MARKER
from nomadtf.errors import DevStackError

MNT_DETACH = 2  # umount2's flag: detach now, clean up once nothing uses it


def refuse_unmarked(state_dir: Path, why: str) -> None:
    """Raise unless `state_dir` carries the marker `up` writes; `why` ends the sentence
    "it has no .nomadtf-devstack, so ..." with what the user should check."""
    if not (state_dir / MARKER).is_file():
        raise DevStackError(f"refusing to stop or delete anything in {state_dir}: it has no {MARKER}, so {why}")


def stop_in_order(groups: Sequence[tuple[str, Sequence[psutil.Process]]], grace: float, progress: Progress, again: str) -> None:
    """Stop each group of processes in turn (SIGTERM, SIGKILL after `grace`), saying
    "stopping <label>" first; an empty group is skipped. Raise, naming the PIDs and the
    command to run `again`, when any survives (e.g. owned by another user)."""
    survivors: list[psutil.Process] = []
    for label, procs in groups:
        if procs:
            progress(f"stopping {label}")
            survivors += processes.stop(list(procs), grace)
    if survivors:
        pids = ", ".join(str(p.pid) for p in survivors)
        raise DevStackError(f"could not stop pid {pids}; stop them (as their owner) and run `{again}` again")


def remove_state(state_dir: Path) -> None:
    """Unmount what Nomad mounted below `state_dir`, then delete the directory.

    A Nomad client running as root mounts a tmpfs on every task's secrets/ and private/,
    raw_exec tasks included, and unmounts them only when it garbage-collects the
    allocation, which a stopped dev agent never does: those of the single-node stack are
    detached here. The several-client stack's clients run in mount namespaces of their own
    (`ip netns exec` makes one), so the host sees none of theirs; they go with the last
    process of their namespace. What can still be in the way are files without write
    permission (for a caller that is not root): the delete makes them writable."""
    unmount_under(state_dir)

    def writable(func, path, _exc):  # noqa: ANN001 - shutil's onerror signature
        os.chmod(path, 0o700)
        func(path)

    shutil.rmtree(state_dir, onerror=writable)


def unmount_under(root: Path) -> None:
    """Detach every mount below `root`, deepest first (umount2 with MNT_DETACH, via libc)."""
    root_s = str(root.resolve())
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[1].replace("\\040", " ") for line in lines if len(line.split()) > 1]
    inside = sorted((p for p in points if p == root_s or p.startswith(root_s + "/")), key=len, reverse=True)
    if not inside:
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for point in inside:
        if libc.umount2(point.encode(), MNT_DETACH) != 0:
            raise DevStackError(f"cannot unmount {point} (errno {ctypes.get_errno()}); unmount it and retry")
