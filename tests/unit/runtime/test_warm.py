"""The child started ahead of the rendezvous (runtime/warm.py, nomadtf/usercode/warmstart.py): the
command it runs, the handoff, and that code run through it cannot tell it from `python -u`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from nomadtf import wire
from nomadtf.runtime import warm
from nomadtf.usercode.warmstart import decode, parse

PROBE = """
import json, os, sys
print(json.dumps({"name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "package": __package__, "spec": getattr(__spec__, "name", None),
                  "tf_config": os.environ.get("TF_CONFIG"), "secret": os.environ.get("SECRET"),
                  "relative": __import__("helper").VALUE}))
"""


def _code(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "probe.py").write_text(textwrap.dedent(PROBE))
    (tmp_path / "code" / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "code" / "pkg").mkdir()
    (tmp_path / "code" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "code" / "pkg" / "main.py").write_text(textwrap.dedent(PROBE).replace('__import__("helper")', '__import__("pkg.sub", fromlist=["x"])'))
    (tmp_path / "code" / "pkg" / "sub.py").write_text("VALUE = 7\n")
    return tmp_path / "code"


def _through_bootstrap(command: list[str], cwd, env: dict[str, str], modules: str = "-") -> dict:
    read_fd, write_fd = os.pipe()
    argv = warm.waiting_argv([sys.executable, "-u", *command], read_fd, [] if modules == "-" else modules.split(","))
    assert argv is not None
    waiting_env = {k: v for k, v in env.items() if k not in ("TF_CONFIG", "SECRET")}
    proc = subprocess.Popen(argv, cwd=cwd, env=waiting_env, pass_fds=(read_fd,), stdout=subprocess.PIPE, text=True)
    os.close(read_fd)
    time.sleep(0.2)  # it waits for the handoff
    assert proc.poll() is None
    os.write(write_fd, warm.handoff_message(env, "mark"))
    os.close(write_fd)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return json.loads(out)


def _plain(command: list[str], cwd, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-u", *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def _env(tmp_path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "TF_CONFIG": '{"cluster": {}}', "SECRET": "s3cret"}


def test_a_script_sees_the_same_as_under_python_u(tmp_path):
    code, env = _code(tmp_path), _env(tmp_path)
    for command in (["probe.py", "a", "--b"], [str(tmp_path / "code" / "probe.py"), "x"]):
        assert _through_bootstrap(command, code, env) == _plain(command, code, env)
    # from another directory, by a relative path: sys.path[0] is the script's directory
    assert _through_bootstrap(["code/probe.py"], tmp_path, env) == _plain(["code/probe.py"], tmp_path, env)


def test_a_module_sees_the_same_as_under_python_u_m(tmp_path):
    code, env = _code(tmp_path), _env(tmp_path)
    command = ["-m", "pkg.main", "--steps", "3"]
    seen = _through_bootstrap(command, code, env)
    assert seen == _plain(command, code, env)
    assert seen["name"] == "__main__" and seen["tf_config"] and seen["secret"] == "s3cret"


def test_a_failed_preimport_leaves_the_error_to_the_code(tmp_path):
    code, env = _code(tmp_path), _env(tmp_path)
    assert _through_bootstrap(["probe.py"], code, env, modules="no_such_module_x") == _plain(["probe.py"], code, env)


def test_the_waiting_command():
    assert warm.waiting_argv(["py", "-u", "train.py", "--a"], 7, ["tensorflow"]) == [
        "py", "-u", "-m", "nomadtf.usercode.warmstart", "7", "tensorflow", "train.py", "--a"]
    assert warm.waiting_argv(["py", "-m", "nomadtf.usercode.tfserver", "server"], 3, ["tensorflow"]) == [
        "py", "-u", "-m", "nomadtf.usercode.warmstart", "3", "tensorflow", "-m", "nomadtf.usercode.tfserver", "server"]
    assert warm.waiting_argv(["py", "-u", "-m", "nomadtf.usercode.gpulimit", "t.py"], 3, []) == [
        "py", "-u", "-m", "nomadtf.usercode.warmstart", "3", "-", "-m", "nomadtf.usercode.gpulimit", "t.py"]
    assert warm.waiting_argv(["py", "-c", "print(1)"], 3, []) is None
    assert warm.waiting_argv(["py", "-m"], 3, []) is None
    assert parse(["3", "tensorflow,numpy", "-m", "m", "x"]) == (3, ["tensorflow", "numpy"], ["-m", "m", "x"])
    assert warm.preimports("tensorboard") is None and warm.preimports("ps") == ["tensorflow"]


def test_the_handoff_keeps_the_mark_and_only_strings_pass():
    message = warm.handoff_message({"TF_CONFIG": "{}", "A": "1"}, "m1")
    assert decode(message) == {"TF_CONFIG": "{}", "A": "1", wire.ENV_CHILD_MARK: "m1"}
    try:
        decode(json.dumps({"env": {"A": 1}}).encode())
    except ValueError:
        pass
    else:
        raise AssertionError("a non-string value passed")


def _posted():
    exits: list[tuple[int, int]] = []
    done = threading.Event()

    def on_exit(pid, code):
        exits.append((pid, code))
        done.set()
    return exits, done, on_exit


def test_the_waiting_child_runs_the_code_with_the_newest_env_and_no_secret_before(tmp_path):
    code = _code(tmp_path)
    exits, done, on_exit = _posted()
    starter = warm.WarmStart()
    argv = [sys.executable, "-u", "probe.py"]
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    starter.start_ahead("worker", argv, base, str(code), on_exit)
    assert starter.waiting is not None
    pid = starter.waiting.child.pid
    environ = open(f"/proc/{pid}/environ", "rb").read()
    assert b"s3cret" not in environ and b"s3cret" not in open(f"/proc/{pid}/cmdline", "rb").read()
    assert wire.ENV_CHILD_MARK.encode() in environ
    child = starter.take(argv, {**base, "SECRET": "s3cret", "TF_CONFIG": "newest"}, str(code))
    assert child is not None and child.pid == pid
    assert done.wait(60) and exits == [(pid, 0)]


def test_a_waiting_child_that_dies_is_replaced_then_cold(tmp_path):
    exits, _done, on_exit = _posted()
    starter = warm.WarmStart()
    argv = [sys.executable, "-u", "probe.py"]
    starter.start_ahead("worker", argv, {"PATH": os.environ["PATH"]}, str(tmp_path), on_exit)
    for death in range(1, warm.WARM_ATTEMPTS + 1):
        assert starter.waiting is not None
        pid = starter.waiting.child.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exits and exits[-1][0] == pid
        assert starter.died(*exits.pop())
        assert starter.deaths == death
    assert starter.waiting is None
    assert starter.take(argv, {}, str(tmp_path)) is None  # cold from now on
    assert not starter.died(12345, 1)


def test_a_waiting_child_for_another_command_is_not_used(tmp_path):
    _exits, _done, on_exit = _posted()
    starter = warm.WarmStart()
    starter.start_ahead("worker", [sys.executable, "-u", "a.py"], {"PATH": os.environ["PATH"]}, str(tmp_path), on_exit)
    waiting = starter.waiting
    assert waiting is not None
    assert starter.take([sys.executable, "-u", "b.py"], {}, str(tmp_path)) is None
    assert waiting.child.returncode is not None  # stopped
    starter.start_ahead("tensorboard", [sys.executable, "-m", "tensorboard.main"], {}, str(tmp_path), on_exit)
    assert starter.waiting is None
    starter.close()


def test_tensorflow_is_imported_ahead_only_for_code_that_imports_it(tmp_path):
    from nomadtf.runtime import warm

    (tmp_path / "train.py").write_text("import os\nimport tensorflow as tf\n")
    (tmp_path / "probe.py").write_text("import json\n# tensorflow is not used here\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "main.py").write_text("from tensorflow import keras\n")
    assert warm.preimports("chief", ["py", "-u", "train.py"], str(tmp_path)) == ["tensorflow"]
    assert warm.preimports("chief", ["py", "-u", "probe.py"], str(tmp_path)) == []
    assert warm.preimports("chief", ["py", "-u", "-m", "pkg.main"], "/nowhere", str(tmp_path)) == ["tensorflow"]
    assert warm.preimports("ps", ["py", "-m", "nomadtf.usercode.tfserver", "server"], str(tmp_path)) == ["tensorflow"]
    assert warm.preimports("chief", ["py", "-u", "missing.py"], str(tmp_path)) == ["tensorflow"]  # unknown: as before
    assert warm.preimports("tensorboard", ["py", "-m", "tensorboard.main"], str(tmp_path)) is None
