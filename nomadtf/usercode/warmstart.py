"""The child started ahead of the rendezvous (run as `python -u -m nomadtf.usercode.warmstart`).

`nomadtf task` starts this as soon as it holds its slot, while it still waits for the
cluster: the interpreter starts and TensorFlow is imported meanwhile. Then it blocks on a
pipe until the supervisor hands over the final environment (TF_CONFIG, NOMADTF_*, the
secrets) as one JSON message, applies it, and runs the command exactly as
`python -u script.py args` or `python -u -m module args` would: `__name__ == "__main__"`,
the same `sys.argv`, `__file__` and `sys.path[0]`, the same working directory.

    python -u -m nomadtf.usercode.warmstart <fd> <modules to import, comma-separated, or "-"> <command...>

The message is read by a thread while TensorFlow imports, so the supervisor's write never
waits for the import. Stdlib only: it runs in the job's own environment too.
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import runpy
import sys
import threading
import types
from importlib.machinery import SourceFileLoader

NO_IMPORT = "-"


def parse(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """(fd, modules to import ahead, the command: [script, args...] or ["-m", module, args...])."""
    if len(argv) < 3 or (argv[2] == "-m" and len(argv) < 4):
        raise SystemExit("usage: python -u -m nomadtf.usercode.warmstart FD MODULES|- (SCRIPT | -m MODULE) [ARGS...]")
    modules = [] if argv[1] == NO_IMPORT else [m for m in argv[1].split(",") if m]
    return int(argv[0]), modules, argv[2:]


def main_path(command: list[str]) -> str:
    """sys.path[0] as `python` sets it: the script's directory (symlinks resolved), or the
    working directory for -m."""
    if command[0] == "-m":
        return os.getcwd()
    return os.path.dirname(os.path.realpath(command[0]))


def decode(message: bytes) -> dict[str, str]:
    """The handoff message: {"env": {...}}; an empty one means the supervisor went away."""
    if not message:
        raise SystemExit(0)
    env = json.loads(message)["env"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the handoff's env must map strings to strings")
    return env


def apply_env(env: dict[str, str]) -> None:
    """The final environment replaces ours (putenv too: the code's subprocesses get it)."""
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    os.environ.update(env)


def run(command: list[str]) -> None:
    """What `python -u <command>` would run, in this process."""
    if command[0] == "-m":
        sys.argv = [command[1], *command[2:]]
        runpy._run_module_as_main(command[1], alter_argv=True)  # what `python -m` itself calls
    else:
        sys.argv = list(command)
        _run_script(os.path.abspath(command[0]))


def _run_script(path: str) -> None:
    """As the interpreter runs `python script.py`: a fresh `__main__` with an absolute
    `__file__`, no `__package__` or `__spec__` (runpy.run_path would set argv[0] to the
    absolute path and `__package__` to "", which code can see)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path), __builtins__=builtins)
    sys.modules["__main__"] = main
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)


def _read_all(fd: int, into: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        into.append(pipe.read())


def main(argv: list[str]) -> None:
    fd, modules, command = parse(argv)
    sys.path[0] = main_path(command)  # before the imports, as for the code itself
    received: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(fd, received), name="handoff", daemon=True)
    reader.start()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001  the code's own import reports it, as it would cold
            pass
    reader.join()
    apply_env(decode(received[0] if received else b""))
    run(command)


if __name__ == "__main__":
    main(sys.argv[1:])
