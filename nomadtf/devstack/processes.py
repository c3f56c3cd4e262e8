"""The processes of the local stack, through psutil.

A process we started is named by its PID and its start together: once it exits, the
kernel may hand the same PID to an unrelated process, and only the start tells them apart.
The start is counted on the boot clock (`start_mark`: this boot's id and the clock ticks
from boot to the process's start), which no step of the wall clock moves: psutil's
create_time is a wall-clock time, and a process that reads it after NTP stepped the clock
gets another number for the same process (a stack that runs then looks stopped, and `up`
would take it for a dead one).

Usage:
    started = start_mark(pid)             # record it next to the PID at spawn
    proc = find(pid, start=started)       # None once that process is gone
    survivors = stop(tree(proc), grace=15)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

# After SIGKILL a process dies at once; this only bounds the wait for its parent (or
# init, for an orphan) to reap it.
REAP_WAIT = 10.0


def pid_alive(pid: int) -> bool:
    """Some process runs as `pid` (a zombie has finished: it does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def started_at(pid: int) -> float:
    """The start time psutil reports for `pid` (wall clock: records of older versions hold it)."""
    return psutil.Process(pid).create_time()


def boot_id() -> str:
    """This boot's id: a count of ticks from boot means nothing across a reboot."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def start_ticks(pid: int) -> int:
    """When `pid` started, in clock ticks from boot (/proc/<pid>/stat, field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    # The command name (field 2) may hold spaces and parentheses: count from its last ")".
    return int(stat.rsplit(")", 1)[1].split()[19])


def start_mark(pid: int) -> str:
    """`<boot id>/<start ticks>` of `pid`: the same for the same process on every clock,
    different for a later process that reuses its PID."""
    return f"{boot_id()}/{start_ticks(pid)}"


def age(pid: int) -> float:
    """Seconds since `pid` started, on the kernel's boot clock.

    psutil's create_time adds the process's start (counted from boot) to a boot time it
    derives from the wall clock once and keeps; after the wall clock is stepped or slewed
    (NTP on a VM) that sum can be seconds off. An age measured on the boot clock alone is not.
    """
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks(pid) / os.sysconf("SC_CLK_TCK")


def find(pid: int, create_time: float | None = None, start: str | None = None) -> psutil.Process | None:
    """The running process `pid`, if it is the one that started at `start` (start_mark),
    or, in a record of an older version without one, at `create_time` (psutil's)."""
    try:
        proc = psutil.Process(pid)
        same = start_mark(pid) == start if start is not None else create_time is not None and proc.create_time() == create_time
        if not same or proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.NoSuchProcess:
        return None
    return proc


def tree(root: psutil.Process) -> list[psutil.Process]:
    """`root` and every descendant it has now (parents before children).

    Collect it before stopping anything: once a parent exits, its children are re-parented
    to init and nothing links them to `root` any more.
    """
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop(procs: list[psutil.Process], grace: float) -> list[psutil.Process]:
    """SIGTERM every process, SIGKILL the ones still running after `grace` seconds, and
    wait until each is gone (psutil reaps the ones that are our own children).

    Signals go through psutil, which refuses a PID that now belongs to another process.
    Returns the processes still running at the end (e.g. owned by another user).
    """
    _signal_all(procs, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    _signal_all(alive, signal.SIGKILL)
    _, alive = psutil.wait_procs(alive, timeout=REAP_WAIT)
    return [p for p in alive if running(p)]


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass  # gone already, or not ours to signal: stop() reports it if it stays


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
