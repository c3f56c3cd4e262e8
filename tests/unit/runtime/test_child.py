"""The child module and the event loop with real processes and real signals: no orphan,
no zombie, grandchildren included; the child dies with its supervisor; signals reach the
loop without a lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from nomadtf.runtime.child import Child, become_subreaper, reap_orphans
from nomadtf.runtime.loop import CHILD_EXIT, SIGNAL, TIMER, Event, EventLoop


def _spawn_tree_script(pidfile: Path) -> list[str]:
    # The child starts a grandchild in its group and a daemonised great-grandchild that
    # leaves the group (setsid), then waits for ever; every pid goes into pidfile.
    code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        d = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"], start_new_session=True)
        open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{g.pid}} {{d.pid}}")
        time.sleep(600)
    """)
    return [sys.executable, "-c", code]


def _wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE and False
    except psutil.NoSuchProcess:
        return True


def test_stop_kills_children_grandchildren_and_daemons_and_leaves_no_zombie(tmp_path):
    assert become_subreaper()
    pidfile = tmp_path / "pids"
    exits: list[tuple[int, int]] = []
    child = Child(_spawn_tree_script(pidfile), dict(os.environ), str(tmp_path), lambda pid, code: exits.append((pid, code)))
    pids = [int(p) for p in _wait_for(pidfile).split()]
    assert pids[0] == child.pid  # the wrapper exec'd the command: same pid
    code = child.stop(grace=3.0)
    assert code == -signal.SIGTERM
    for pid in pids:
        assert _gone(pid), f"pid {pid} survived stop()"
    # None of the tree is left as a zombie of ours (other children of the test session,
    # the stack's agents among them, are not this test's business).
    zombies = [p for p in psutil.Process().children() if p.pid in pids and p.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []
    assert exits == []  # a stop we asked for is not reported as an exit


def test_stop_spares_processes_that_are_not_the_childs(tmp_path):
    """Whoever runs the supervisor may have other children (the test session's own stack
    did, and a stop killed it): only the child's tree and its marked orphans are stopped."""
    assert become_subreaper()
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        pidfile = tmp_path / "pids"
        child = Child(_spawn_tree_script(pidfile), dict(os.environ), str(tmp_path), lambda *_: None)
        pids = [int(p) for p in _wait_for(pidfile).split()]
        child.stop(grace=3.0)
        assert all(_gone(pid) for pid in pids)
        assert sibling.poll() is None, "stop() killed a process that was not the child's"
    finally:
        sibling.kill()
        sibling.wait()


def test_a_child_that_ignores_sigterm_is_killed(tmp_path):
    ready = tmp_path / "ready"
    code = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open({str(ready)!r}, 'w').write('1'); time.sleep(600)"
    child = Child([sys.executable, "-c", code], dict(os.environ), str(tmp_path), lambda *_: None)
    _wait_for(ready)
    started = time.monotonic()
    assert child.stop(grace=1.0) == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_an_exit_is_reported_with_pid_and_code(tmp_path):
    loop = EventLoop()
    child = Child([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), str(tmp_path),
                  lambda pid, code: loop.post(Event(CHILD_EXIT, (pid, code))))
    event = loop.next(timeout=10)
    assert event == Event(CHILD_EXIT, (child.pid, 3))


def test_the_child_dies_with_its_supervisor(tmp_path):
    """kill -9 of the supervisor: PR_SET_PDEATHSIG (armed after exec, in the wrapper) kills
    the child at once, so it cannot keep the TensorFlow port."""
    pidfile = tmp_path / "child"
    supervisor = textwrap.dedent(f"""
        import os, sys, time
        from nomadtf.runtime.child import Child
        c = Child([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), {str(tmp_path)!r}, lambda *_: None)
        open({str(pidfile)!r}, "w").write(str(c.pid))
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", supervisor])
    child_pid = int(_wait_for(pidfile))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and psutil.pid_exists(child_pid):
        try:
            if psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE


def test_no_python_runs_between_fork_and_exec():
    """The child is started without preexec_fn (unsafe with threads); parent death is armed
    by the wrapper after exec."""
    import inspect

    from nomadtf.runtime import child as child_module

    source = inspect.getsource(child_module.Child.__init__)
    assert "preexec_fn" not in source and "**OWN_GROUP" in source
    expected = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    assert child_module.OWN_GROUP == expected  # its own process group, set by CPython's C code


def test_reap_orphans_collects_reparented_zombies(tmp_path):
    assert become_subreaper()
    # A process that double-forks: the grandchild is re-parented to us and exits.
    script = "import os, sys\nif os.fork() == 0:\n    os._exit(0)\n"
    subprocess.run([sys.executable, "-c", script + "import time; time.sleep(0.2)"], check=True)
    time.sleep(0.3)
    reap_orphans()
    assert [p for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE] == []


def test_signals_reach_the_loop_as_events():
    loop = EventLoop()
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        loop.install_signals()
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
        assert loop.next(timeout=2) == Event(SIGNAL, signal.SIGHUP)
        assert loop.next(timeout=2) == Event(SIGNAL, signal.SIGTERM)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_timers_fire_in_order_and_the_earlier_of_two_wins():
    loop = EventLoop()
    now = time.monotonic()
    loop.call_at(now + 0.2, "b")
    loop.call_at(now + 0.1, "a")
    loop.call_at(now + 0.05, "b")  # the same name earlier: replaces
    loop.call_at(now + 5, "a")  # later than the pending one: ignored
    assert loop.next(timeout=1) == Event(TIMER, "b")
    assert loop.next(timeout=1) == Event(TIMER, "a")
    assert loop.next(timeout=0.3) is None
    loop.call_at(time.monotonic() + 0.05, "c")
    loop.cancel("c")
    assert loop.next(timeout=0.2) is None


def test_sighup_from_the_first_instant_does_not_kill_a_task():
    """The rendered command starts the interpreter with SIGHUP ignored (nohup), so even a
    SIGHUP before Python runs a line cannot end the task with exit 129."""
    from nomadtf.job.render import render_job
    from nomadtf.job.spec import load_spec
    from tests.helpers import EXAMPLES

    job = render_job(load_spec(EXAMPLES / "digits" / "job.json"))
    config = job["Job"]["TaskGroups"][0]["Tasks"][0]["Config"]
    argv = [config["command"], *config["args"]]
    assert argv[argv.index("task"):] == ["task", "--role", job["Job"]["TaskGroups"][0]["Name"]]
    argv = [a if a != "python3" else sys.executable for a in argv[: argv.index("task")]] + ["--help"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.02)  # nohup's own first instructions; Python's start-up takes far longer
    for _ in range(30):
        try:
            os.kill(proc.pid, signal.SIGHUP)
        except ProcessLookupError:
            break
        time.sleep(0.005)
    assert proc.wait(timeout=30) == 0


def test_the_child_gets_sighup_back_to_its_default(tmp_path):
    """User code is not left with the supervisor's ignored SIGHUP."""
    out = tmp_path / "disposition"
    code = f"import signal; open({str(out)!r}, 'w').write(str(int(signal.getsignal(signal.SIGHUP))))"
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        loop = EventLoop()
        Child([sys.executable, "-c", code], dict(os.environ), str(tmp_path), lambda pid, c: loop.post(Event(CHILD_EXIT, (pid, c))))
        assert loop.next(timeout=10).data[1] == 0
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert int(out.read_text()) == signal.SIG_DFL


def test_a_stopped_child_is_ended_by_sigterm_without_waiting_for_sigkill(tmp_path):
    """A hung child may be SIGSTOPped: stop() continues it, so SIGTERM works at once."""
    ready = tmp_path / "ready"
    code = f"import time; open({str(ready)!r}, 'w').write('1'); time.sleep(600)"
    child = Child([sys.executable, "-c", code], dict(os.environ), str(tmp_path), lambda *_: None)
    _wait_for(ready)
    child.pause()
    started = time.monotonic()
    assert child.stop(grace=5.0) == -signal.SIGTERM
    assert time.monotonic() - started < 3


def test_a_child_s_exit_is_reported_only_after_its_last_output_was_copied():
    # The task may end right after its child: output still in the pipe would be lost from
    # Nomad's log too (the archive's tees are daemon threads). The tee here starts late.
    import threading

    copied: list[bytes] = []
    seen_at_exit: list[bytes] = []

    def slow_tee(stdout, stderr):
        def pump(pipe):
            time.sleep(0.5)
            copied.append(pipe.read())
        threads = [threading.Thread(target=pump, args=(pipe,), daemon=True) for pipe in (stdout, stderr)]
        for thread in threads:
            thread.start()
        return threads

    exited = threading.Event()

    def on_exit(pid, code):
        seen_at_exit.extend(copied)
        exited.set()

    Child([sys.executable, "-c", "print('env NVIDIA_VISIBLE_DEVICES=GPU-1')"], dict(os.environ), ".", on_exit, capture=slow_tee)
    assert exited.wait(10)
    assert b"env NVIDIA_VISIBLE_DEVICES=GPU-1\n" in seen_at_exit, seen_at_exit
