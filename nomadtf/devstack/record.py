"""A stack's state directory and its record, `stack.json`: what `up` started and made, so
that `status` and `down` touch exactly that and nothing else.

    <state>/.nomadtf-devstack   the marker: `down` deletes no directory without it
    <state>/stack.json          every process `up` started (PID + start time, binary, log),
                                and what else the stack recorded (its shape, namespaces, links)

Files here that may hold a secret are written 0600, through a rename (`write_private`), so
a concurrent reader (another `up`, `status`) never sees half a file.

Usage:
    claim_state_dir(state_dir, "NOMADTF_DEV_DIR")      # create it, or refuse a foreign one
    record = Record(state_dir / "stack.json", defaults={"components": []})
    record.put(component)                              # add or replace by name
    record.component("nomad").process()                # psutil.Process, or None once it is gone
    adopt_legacy(record, state_dir / MARKER)           # a stack an older nomadtf started, with start times
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from nomadtf.devstack import processes
from nomadtf.errors import DevStackError

MARKER = ".nomadtf-devstack"
MARKER_TEXT = "created by `nomadtf dev up`; `nomadtf dev down` deletes this directory\n"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, mode 0600, through a rename: a reader sees the old file or
    the new one, never half of one."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(partial, path)


def claim_state_dir(state_dir: Path, env_var: str) -> None:
    """Create `state_dir` (0700) with its marker; refuse a foreign one, which `down` would
    later delete. `env_var` is the variable that chooses the directory (named in the error)."""
    marker = state_dir / MARKER
    if state_dir.exists() and not marker.is_file():
        if not state_dir.is_dir() or any(state_dir.iterdir()):
            raise DevStackError(
                f"{state_dir} exists and was not created by `nomadtf dev up` (no {MARKER} in it); "
                f"point {env_var} at a new directory"
            )
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)
    write_private(marker, MARKER_TEXT)


@dataclass
class Component:
    """A process `up` started: a server or an agent of the stack."""

    name: str
    pid: int
    binary: str
    log: str
    # psutil's create_time of `pid` at spawn; None in records of older versions, whose
    # processes can no longer be told apart from a PID reused by someone else.
    create_time: float | None = None
    # processes.start_mark of `pid` at spawn (boot id and ticks from boot): what decides,
    # whatever the wall clock did since; None in records of versions before it.
    start: str | None = None

    def process(self) -> psutil.Process | None:
        """The process `up` started, if it still runs (PIDs get reused: the start decides)."""
        return processes.find(self.pid, self.create_time, self.start)


class Record:
    """stack.json: a JSON object whose "components" are `Component`s, beside whatever else
    the stack keeps. `defaults` fill the keys a record does not have yet."""

    def __init__(self, path: Path, defaults: dict[str, Any] | None = None):
        self.path = path
        self.defaults = {"components": [], **(defaults or {})}

    def exists(self) -> bool:
        return self.path.is_file()

    def load(self) -> dict[str, Any]:
        """The record as written, without defaults; {} when there is none."""
        if not self.path.is_file():
            return {}
        return json.loads(self.path.read_text())

    def get(self, key: str) -> Any:
        return self.load().get(key, self.defaults.get(key))

    def save(self, **changes: Any) -> None:
        """Write the record with `changes` applied over what it holds (and the defaults)."""
        write_private(self.path, json.dumps({**self.defaults, **self.load(), **changes}, indent=2))

    def remember(self, key: str, item: str) -> None:
        """Add `item` to the list under `key`. Called before the thing is created, so a
        failed `up` still removes it."""
        items = list(self.get(key) or [])
        if item not in items:
            self.save(**{key: [*items, item]})

    def components(self) -> list[Component]:
        return [Component(**c) for c in self.load().get("components", [])]

    def component(self, name: str) -> Component:
        for comp in self.components():
            if comp.name == name:
                return comp
        raise DevStackError(f"{self.path.parent} records no {name}")

    def put(self, comp: Component) -> None:
        """Record `comp`: in the place of the component of its name, else after the others."""
        comps = self.components()
        names = [c.name for c in comps]
        if comp.name in names:
            comps[names.index(comp.name)] = comp
        else:
            comps.append(comp)
        self.save(components=[asdict(c) for c in comps])


def adopt_legacy(record: Record, marker_path: Path) -> list[Component] | None:
    """Take over a running stack that an older nomadtf started: its stack.json has no start
    times and its directory no marker. The components with their start times (the marker
    written), or None to change nothing.

    Each recorded process must still run the recorded binary and have started before the
    record was written (so its PID was not reused since).
    """
    comps = record.components()
    if not comps or marker_path.is_file() or any(c.create_time is not None for c in comps):
        return None
    # The record's age against each process's age: both are short intervals measured now,
    # so neither a stepped wall clock nor psutil's cached boot time moves them. A PID reused
    # since the record was written is younger than the record; 1 s covers the kernel's clock
    # ticks and the file system's timestamp.
    record_age = time.time() - record.path.stat().st_mtime
    adopted = []
    for comp in comps:
        try:
            proc = psutil.Process(comp.pid)
            started = proc.create_time()
            younger = processes.age(comp.pid) + 1.0 < record_age
            if Path(comp.binary).name not in " ".join(proc.cmdline()) or younger:
                return None
        except psutil.Error:
            return None
        adopted.append(replace(comp, create_time=started, start=processes.start_mark(comp.pid)))
    write_private(marker_path, MARKER_TEXT)
    return adopted
