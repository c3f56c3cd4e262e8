"""The child started while the rendezvous still runs, so that the interpreter's start and
`import tensorflow` (seconds on a small machine) overlap the wait for the cluster.

The task starts one (starter.py) as soon as it holds its slot, and again when it recovers through
a new rendezvous; none is kept in reserve while training runs (it would take memory and
CPU from the training). The waiting process (`nomadtf.usercode.warmstart`) has everything the child
needs before TensorFlow initialises (the job's interpreter and paths, CUDA_VISIBLE_DEVICES,
its working directory, the child mark) and nothing that depends on the cluster or is
secret: TF_CONFIG, the generation and the secrets come in the handoff, one JSON message on a
pipe, when the cluster is complete (the newest cluster: the handoff is written only then).

A waiting process that dies before its handoff is replaced, not counted as a failure; after
`WARM_ATTEMPTS` such deaths in a row the task starts its children cold, as it did before.
A start that finds no waiting process (a restart for a peer's change, TensorBoard) is cold.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from nomadtf import wire
from nomadtf.runtime.child import Child
from nomadtf.runtime.codeuser import CodeUser

log = logging.getLogger("nomadtf.task")

WARM_ATTEMPTS = 3
BOOTSTRAP = "nomadtf.usercode.warmstart"
PREIMPORT = "tensorflow"


# ---- pure -------------------------------------------------------------------------------------


def waiting_argv(argv: list[str], fd: int, modules: list[str]) -> list[str] | None:
    """The command that starts `argv` ([python, (-u), script | -m module, args...], as
    launch.child_argv builds it) through the bootstrap, handoff on `fd`; None for any
    other shape."""
    python, rest = argv[0], argv[1:]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if not rest or (rest[0] == "-m" and len(rest) < 2) or (rest[0].startswith("-") and rest[0] != "-m"):
        return None
    return [python, "-u", "-m", BOOTSTRAP, str(fd), ",".join(modules) or "-", *rest]


def handoff_message(env: dict[str, str], mark: str) -> bytes:
    """The final environment, with the child's mark kept (grandchildren carry it)."""
    return json.dumps({"env": {**env, wire.ENV_CHILD_MARK: mark}}).encode()


_TF_IMPORT = re.compile(rb"^[ \t]*(?:import|from)[ \t]+tensorflow\b", re.M)
# Children of nomadtf's own that always load TensorFlow.
_TF_MODULES = ("nomadtf.usercode.tfserver", "nomadtf.usercode.gpulimit", "nomadtf.usercode.dataservice")


def preimports(role: str, argv: list[str] | None = None, cwd: str = ".", pythonpath: str = "") -> list[str] | None:
    """What the waiting process imports; None: no waiting process for this role
    (TensorBoard needs neither TensorFlow's runtime nor the cluster). TensorFlow only for
    code that imports it at its top level, or code we cannot read (its import costs seconds
    and hundreds of MB, a waste for a script that never uses it)."""
    if role == "tensorboard":
        return None
    return [PREIMPORT] if argv is None or uses_tensorflow(argv, cwd, pythonpath) else []


def uses_tensorflow(argv: list[str], cwd: str, pythonpath: str = "") -> bool:
    """Whether the code `argv` runs ([python, (-u), script | -m module, ...]) imports
    tensorflow at the start of a line; True when its source cannot be found."""
    rest = argv[1:]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    if not rest:
        return True
    if rest[0] == "-m":
        module = rest[1] if len(rest) > 1 else ""
        if module in _TF_MODULES:
            return True
        relative = module.replace(".", "/")
        bases = [cwd, *[p for p in pythonpath.split(os.pathsep) if p]]
        candidates = [Path(b, relative + ".py") for b in bases] + [Path(b, relative, "__main__.py") for b in bases]
    else:
        candidates = [Path(cwd, rest[0])]
    for path in candidates:
        try:
            return bool(_TF_IMPORT.search(path.read_bytes()[:1_000_000]))
        except OSError:
            continue
    return True


# ---- the waiting process ---------------------------------------------------------------------


class Waiting:
    """One waiting child: its Child (process group, mark, waiter) and the pipe's write end."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, modules: list[str], on_exit: Callable[[int, int], None], user: CodeUser | None = None,
                 capture: Callable | None = None):
        read_fd, self.write_fd = os.pipe()
        try:
            command = waiting_argv(argv, read_fd, modules)
            assert command is not None
            self.child = Child(command, env, cwd, on_exit, pass_fds=(read_fd,), user=user, capture=capture)
        except BaseException:
            os.close(self.write_fd)
            raise
        finally:
            os.close(read_fd)
        self.key = (tuple(argv), cwd)
        self.started = time.monotonic()

    def hand_over(self, env: dict[str, str]) -> bool:
        """False when the process is gone (the write finds no reader)."""
        try:
            os.write(self.write_fd, handoff_message(env, self.child.mark))  # far below a pipe's buffer
            return True
        except OSError:
            return False
        finally:
            os.close(self.write_fd)
            self.write_fd = -1

    def discard(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1
        self.child.stop()


class WarmStart:
    """Usage (supervisor, one thread):
    warm = WarmStart()
    warm.start_ahead(role, argv, env_without_cluster, cwd, on_exit)   # when the rendezvous begins
    child = warm.take(argv, final_env, cwd) or Child(...)   # when the cluster is complete
    warm.died(pid)   # on a child's exit: True when it was the waiting one (replaced)
    warm.close()
    """

    def __init__(self, user: CodeUser | None = None, capture: Callable | None = None) -> None:
        self.user = user  # who the waiting child runs as (codeuser.py)
        self.capture = capture  # its output's tee (runtime/archive.py; Child)
        self.waiting: Waiting | None = None
        self.deaths = 0  # in a row, before a handoff
        self._last: tuple | None = None  # (argv, env, cwd, modules, on_exit) to replace one

    def start_ahead(self, role: str, argv: list[str], env: dict[str, str], cwd: str, on_exit: Callable[[int, int], None]) -> None:
        """Start a process that waits for its handoff, unless one for the same command waits
        already, the role wants none, or too many died before their handoff."""
        modules = preimports(role, argv, cwd, env.get("PYTHONPATH", ""))
        if modules is None or waiting_argv(argv, 0, modules) is None or self.deaths >= WARM_ATTEMPTS:
            return
        if self.waiting is not None:
            if self.waiting.key == (tuple(argv), cwd):
                return
            self.close()
        self._last = (argv, env, cwd, modules, on_exit)
        self._start()

    def _start(self) -> None:
        assert self._last is not None
        argv, env, cwd, modules, on_exit = self._last
        try:
            self.waiting = Waiting(argv, env, cwd, modules, on_exit, self.user, self.capture)
        except OSError as exc:
            log.warning("could not start the child ahead of the cluster (%s); it starts cold", exc)
            self.waiting = None
            return
        loading = f"interpreter and {', '.join(modules)}" if modules else "interpreter"
        log.info("child started ahead of the cluster (pid %d): %s load while we wait", self.waiting.child.pid, loading)

    def take(self, argv: list[str], env: dict[str, str], cwd: str) -> Child | None:
        """The waiting child, handed `env` and now running the code; None: start cold."""
        waiting, self.waiting = self.waiting, None
        if waiting is None:
            return None
        if waiting.key != (tuple(argv), cwd):
            waiting.discard()
            return None
        if not waiting.hand_over(env):
            log.info("the child started ahead of the cluster is gone; starting cold")
            waiting.discard()
            return None
        self.deaths = 0
        log.info("handed the cluster to the child started %.1fs ago (pid %d)", time.monotonic() - waiting.started, waiting.child.pid)
        return waiting.child

    def died(self, pid: int, code: int) -> bool:
        if self.waiting is None or self.waiting.child.pid != pid:
            return False
        self.waiting.discard()  # reaps what it may have started
        self.waiting = None
        self.deaths += 1
        if self.deaths < WARM_ATTEMPTS:
            log.warning("the child started ahead of the cluster exited %d before its handoff; starting another", code)
            self._start()
        else:
            log.warning("the child started ahead of the cluster exited %d before its handoff (%d times); starting cold from now on", code, self.deaths)
        return True

    def close(self) -> None:
        if self.waiting is not None:
            self.waiting.discard()
            self.waiting = None
