"""Was our child killed for its memory? The kernel's OOM killer counts each kill in the
memory cgroup that hit its limit; a task of the docker driver (or any driver that limits
memory) reads its own cgroup's counter before the child starts and after it dies by
SIGKILL. A rise means the role's `memory` is too small, not that the code is broken:
restarting it with the same limit would only be killed again.

    cgroup v2   <cgroup>/memory.events         "oom_kill N"
    cgroup v1   <memory cgroup>/memory.oom_control   "oom_kill N" (Linux 4.13+)

Inside a container the cgroup's own directory is mounted at /sys/fs/cgroup (v2, and v1's
/sys/fs/cgroup/memory), where /proc/self/cgroup still names the host's path: both are tried.

Usage:
    before = kills()
    ... the child dies by SIGKILL ...
    if killed_for_memory(before): ...
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
EXIT_CODE = 137  # what a shell shows for a process killed by SIGKILL (128 + 9)


def _own_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(the v2 path, the v1 memory path) of a /proc/<pid>/cgroup text."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        _id, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def candidates(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The files that may hold our cgroup's OOM kill counter, the most specific first."""
    v2, v1 = _own_paths(proc_cgroup)
    found = []
    if v1 is not None:
        found += [root / "memory" / v1.lstrip("/") / "memory.oom_control", root / "memory" / "memory.oom_control"]
    if v2 is not None:
        found += [root / v2.lstrip("/") / "memory.events", root / "memory.events"]
    return found


def parse_count(text: str) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def kills(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """Our memory cgroup's OOM kills so far; None where no counter can be read."""
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return None
    for path in candidates(text, root):
        try:
            count = parse_count(path.read_text())
        except OSError:
            continue
        if count is not None:
            return count
    return None


def killed_for_memory(before: int | None, code: int | None, root: Path = CGROUP_ROOT) -> bool:
    """A child that ended by SIGKILL (`code` -9) while our cgroup's OOM kills rose."""
    if code != -9 or before is None:
        return False
    after = kills(root)
    return after is not None and after > before


def why(role: str, limit_mb: int, field: str = "memory") -> str:
    """The failure's words: what happened and the field that fixes it (`memory`, or
    `memory_max` where the role oversubscribes)."""
    return f"killed for exceeding its {limit_mb} MiB: raise roles.{role}.{field}"
