"""The TensorFlow process: start it, stop it and everything it started, never leave an
orphan or a zombie.

- The child gets its own process group, so one killpg reaches it and its children.
- Parent death: the child is exec'd through a tiny wrapper (a fresh `python -S`) that arms
  PR_SET_PDEATHSIG and then execs the real command. Nothing runs between fork and exec in
  our (multi-threaded) process: no preexec_fn, no ctypes there.
- The supervisor is a child subreaper (PR_SET_CHILD_SUBREAPER), so grandchildren that
  daemonise or leave the group are re-parented to us. `stop` kills the child's own tree and
  every re-parented process that carries this child's mark in its environment (collected
  before anything is signalled), and reaps them. Processes of ours that are not the child's
  (another child, whatever started the supervisor in-process) are never touched.
- Re-parented processes that exit while the child runs are reaped as they appear
  (`reap_orphans`, on the supervisor's loop ticks). A `Child`'s own process is never
  collected there: its Popen waits for it, and its exit status is the one that matters.
- The supervisor is not dumpable (`make_undumpable`): the child, under the same uid,
  cannot read its environment (tokens) or memory through /proc/<supervisor>/.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil

from nomadtf import wire
from nomadtf.runtime.codeuser import CodeUser

log = logging.getLogger("nomadtf.task")

# The child's own process group (setpgid); Python 3.10's Popen has no process_group, so there
# it gets a session of its own (setsid), which is a process group of its own too.
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
STOP_GRACE_S = 8.0  # SIGTERM -> SIGKILL (below Nomad's kill_timeout of 20 s)
DRAIN_S = 3.0  # the most a child's exit waits for the tees to copy its last output
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36

# argv: [python, -S, -c, WRAPPER, <expected parent pid>, command...]. If our parent died
# before the signal was armed, getppid() already differs: exit instead of running alone.
# SIGHUP goes back to its default: the supervisor was started with it ignored (nohup).
PDEATH_WRAPPER = (
    "import ctypes,os,signal,sys\n"
    "signal.signal(signal.SIGHUP,signal.SIG_DFL)\n"
    "ctypes.CDLL(None,use_errno=True).prctl(1,9)\n"
    "if os.getppid()!=int(sys.argv[1]):os._exit(137)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


def become_subreaper() -> bool:
    """Orphaned descendants of our child are re-parented to us instead of to init."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
    except (OSError, AttributeError):
        return False


def make_undumpable() -> bool:
    """PR_SET_DUMPABLE 0: /proc/<our pid>/environ, mem and maps become root's, so a process
    of the same uid (our child) cannot read them; no core dumps. A program the child execs
    is dumpable again (the kernel resets it at exec). Linux only; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):
        return False


# The pids of our `Child` processes while their Popen may still wait for them: never reaped
# by `reap_orphans`. The lock spans a Child's start, so no reaper sees its pid unregistered.
_children_lock = threading.Lock()
_children: set[int] = set()


def with_parent_death(argv: list[str]) -> list[str]:
    return [sys.executable, "-S", "-c", PDEATH_WRAPPER, str(os.getpid()), *argv]


class Child:
    """One run of the child. `on_exit(pid, code)` is called from a waiter thread when it
    ends by itself (the event loop turns that into an event); not after `stop`.
    `capture(stdout, stderr)`: the child writes to pipes handed to it (the archive's tee,
    runtime/archive.py); without it the child writes to our own streams."""

    def __init__(
        self, argv: list[str], env: dict[str, str], cwd: str, on_exit: Callable[[int, int], None], pass_fds: tuple[int, ...] = (), user: CodeUser | None = None,
        capture: Callable[[IO[bytes], IO[bytes]], list[threading.Thread]] | None = None,
    ):
        self.argv = argv
        self.mark = secrets.token_hex(8)
        env = {**env, wire.ENV_CHILD_MARK: self.mark}
        with _children_lock:
            as_user = user.popen_kwargs() if user else {}  # the code's own uid (codeuser.py)
            pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if capture else {}
            self.proc = subprocess.Popen(with_parent_death(argv), env=env, cwd=cwd, close_fds=True, pass_fds=pass_fds, **OWN_GROUP, **as_user, **pipes)
            self.pid = self.proc.pid
            _children.add(self.pid)
        self.tees = capture(self.proc.stdout, self.proc.stderr) if capture else None  # threads that copy its output
        self._stopping = False
        self._waiter = threading.Thread(target=self._wait, args=(on_exit,), name=f"child-{self.pid}", daemon=True)
        self._waiter.start()

    def _wait(self, on_exit: Callable[[int, int], None]) -> None:
        code = self.proc.wait()
        with _children_lock:
            _children.discard(self.pid)
        self.drain()  # before anyone acts on the exit: the task may end right after it
        if not self._stopping:
            on_exit(self.pid, code)

    def drain(self, timeout: float = DRAIN_S) -> None:
        """Wait (bounded) until the tees copied what the child wrote last. Its output would
        otherwise be lost from Nomad's log too when the task ends right after the child:
        the tees are daemon threads. Bounded: a grandchild may still hold the pipes open."""
        deadline = time.monotonic() + timeout
        for tee in self.tees or []:
            tee.join(max(0.0, deadline - time.monotonic()))

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def descendants(self) -> list[psutil.Process]:
        """The child's children and grandchildren, and orphans of its tree re-parented to
        us (subreaper), known by the mark in their environment. Not the child itself: it
        is Popen's to wait for."""
        try:
            ours = psutil.Process().children(recursive=True)
        except psutil.Error:
            return []
        try:
            own = {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        except psutil.Error:
            own = set()
        return [p for p in ours if p.pid != self.pid and (p.pid in own or self._marked(p))]

    def _marked(self, proc: psutil.Process) -> bool:
        try:
            return proc.environ().get(wire.ENV_CHILD_MARK) == self.mark
        except psutil.Error:
            return False

    def catches(self, sig: int) -> bool:
        """Whether the child has a handler for `sig` (its SigCgt in /proc): a signal it does
        not catch would kill it (SIGUSR1's default action is to terminate)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
        except (OSError, ValueError, IndexError):
            pass
        return False

    def send(self, sig: int) -> None:
        """`sig` to the child alone (not its group)."""
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the group and every descendant, SIGKILL what is left after `grace`,
        reap them all. Returns the child's exit code."""
        self._stopping = True
        tree = self.descendants()  # before anything is signalled: orphans cannot hide
        _signal_group(self.pid, signal.SIGTERM)
        for proc in tree:
            _signal(proc, signal.SIGTERM)
        # A stopped (SIGSTOP, hung in a debugger) process acts on SIGTERM only once it runs.
        _signal_group(self.pid, signal.SIGCONT)
        for proc in tree:
            _signal(proc, signal.SIGCONT)
        code = self._wait_for(grace)
        _, alive = psutil.wait_procs(tree, timeout=0.5 if code is not None else 0)
        if code is None or alive:
            # MWMS workers ignore SIGTERM (TensorFlow's preemption handler), hence the hard stop.
            _signal_group(self.pid, signal.SIGKILL)
            for proc in alive:
                _signal(proc, signal.SIGKILL)
            code = self._wait_for(grace) if code is None else code
            psutil.wait_procs(alive, timeout=grace)
        _reap(tree)
        self.drain()
        return code

    def _wait_for(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def pause(self) -> None:
        """SIGSTOP the group (the chaos soak's "hung child")."""
        _signal_group(self.pid, signal.SIGSTOP)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def _reap(procs: list[psutil.Process]) -> None:
    """Collect those of `procs` that were re-parented to us and have exited."""
    for proc in procs:
        try:
            os.waitpid(proc.pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            continue


def reap_orphans() -> int:
    """Collect exited processes re-parented to us (subreaper), never a `Child`'s own process
    (its Popen owns that exit status). Call it from the thread that starts any other
    subprocess (the supervisor's loop: the environment build runs there, before the loop),
    so that no Popen of ours loses its status. Returns how many were reaped.

    waitid(WNOWAIT) peeks without collecting: the common case (nothing exited) is one
    system call; only behind a Child's own exit are the zombies looked up one by one."""
    reaped = 0
    with _children_lock:
        while True:
            try:
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return reaped  # no children at all
            if found is None:
                return reaped  # none has exited
            if found.si_pid in _children:
                break  # a Child's own exit comes first: look past it
            if _collect(found.si_pid):
                reaped += 1
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return reaped
        for proc in children:
            if proc.pid not in _children and _is_zombie(proc) and _collect(proc.pid):
                reaped += 1
    return reaped


def _is_zombie(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _collect(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False
