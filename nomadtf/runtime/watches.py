"""The watches that turn changes into loop events, each on a thread of its own: one Consul
blocking query per role we may depend on and one on the run's cluster keys (`Watch`), or,
while the cluster forms, one on its generation key alone, whose every answer is a look
(`every_answer`); and the cluster file Nomad's template renders (`FileWatch`,
reconfigure=template).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from nomadtf.errors import NomadtfError
from nomadtf.runtime.loop import Event

WATCH_WAIT_S = 30.0  # a blocking query's wait; answered at once on a change
WATCH_RETRY_S = 1.0  # after a failed query (Consul restarting)
WRITES = frozenset({"created", "modified", "moved", "closed", "deleted"})  # watchdog's event types


class Watch:
    """One Consul blocking query turned into loop events, on its own thread, for ever.
    An index that goes backwards means Consul restarted: start over from 0."""

    def __init__(
        self, kind: str, query: Callable[[int, float], int], post: Callable[[Event], None], every_answer: bool = False, index: int = 0
    ):
        self.kind = kind
        self.query = query
        self.post = post
        self.every_answer = every_answer  # also when the wait passed with no change: a look now and then
        self.index = index  # what the caller has seen already: the first query blocks
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def start(self) -> Watch:
        self.thread.start()
        return self

    def _run(self) -> None:
        index = self.index
        while not self.stop.is_set():
            try:
                new_index = self.query(index, WATCH_WAIT_S)
            except NomadtfError:
                index = 0
                self.stop.wait(WATCH_RETRY_S)
                continue
            if self.stop.is_set():
                break  # stopped while it waited: its answer is nobody's news
            if new_index != index or self.every_answer:
                self.post(Event(self.kind, new_index))
            index = new_index if new_index >= index else 0


class FileWatch:
    """A loop event whenever `path` is (re)written (reconfigure=template): Nomad's
    consul-template renders the cluster file a few milliseconds after the catalog changes,
    often after our own catalog watch fired, and nothing else would tell us. watchdog uses
    inotify on Linux (a blocking read on its own thread: no polling). The directory is
    watched, not the file: consul-template replaces the file by a rename."""

    def __init__(self, path: Path, kind: str, post: Callable[[Event], None]):
        from watchdog.events import FileSystemEventHandler  # only in template mode
        from watchdog.observers import Observer

        target = str(path)

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                # Written, replaced or removed; never our own reads (opened, closed_no_write).
                if event.event_type in WRITES and target in (event.src_path, event.dest_path):
                    post(Event(kind))

        path.parent.mkdir(parents=True, exist_ok=True)
        self.observer = Observer()
        self.observer.daemon = True
        self.observer.schedule(_Handler(), str(path.parent), recursive=False)

    def start(self) -> FileWatch:
        self.observer.start()
        return self

    def close(self) -> None:
        self.observer.stop()
