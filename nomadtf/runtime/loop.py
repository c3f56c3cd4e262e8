"""One event queue for the whole runtime.

Watcher threads (Consul blocking queries), signal handlers, the child's waiter thread and
timers all become `Event`s on one `queue.SimpleQueue`; the supervisor handles them one at
a time, so no state is shared between threads. SimpleQueue.put is reentrant, which makes
it safe in a signal handler (a queue.Queue takes a lock there and can deadlock).
"""

from __future__ import annotations

import heapq
import itertools
import queue
import signal
import time
from dataclasses import dataclass, field
from typing import Any

# Event kinds
CATALOG = "catalog"  # a registration or check of the job's services changed
CLUSTER_KV = "cluster-kv"  # slots, generation or job state changed
CLUSTER_FILE = "cluster-file"  # Nomad's template re-rendered the cluster file (reconfigure=template)
SIGNAL = "signal"
CHILD_EXIT = "child-exit"
TIMER = "timer"


@dataclass(frozen=True)
class Event:
    kind: str
    data: Any = None


@dataclass(order=True)
class _Timer:
    due: float
    seq: int
    name: str = field(compare=False)


class EventLoop:
    """Usage:
    loop = EventLoop(); loop.install_signals()
    loop.post(Event(CATALOG)); loop.call_at(time.monotonic() + 2, "debounce")
    event = loop.next(timeout=30)   # an Event, a TIMER event, or None after `timeout`
    """

    STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        # Set by the handler itself (a plain attribute write is signal-safe), so that a step
        # blocked in a bounded retry can give up before its event is read.
        self.stop_requested = False

    def post(self, event: Event) -> None:
        self._queue.put(event)

    def install_signals(self) -> None:
        """SIGTERM/SIGINT ask to stop; SIGHUP asks to re-read the cluster file; SIGUSR1 asks
        the code to checkpoint now (the admission controller preempts the run). Set up as the
        first thing `nomadtf task` does (SIGHUP is ignored before that, from the top of
        nomadtf.__main__) and left in place until the process exits."""
        for sig in (*self.STOP_SIGNALS, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum in self.STOP_SIGNALS:
            self.stop_requested = True
        self._queue.put(Event(SIGNAL, signum))

    def call_at(self, due: float, name: str) -> None:
        """A TIMER event named `name` at monotonic time `due` (once; the same name twice
        keeps the earlier one)."""
        for timer in self._timers:
            if timer.name == name:
                if timer.due <= due:
                    return
                self._timers.remove(timer)
                heapq.heapify(self._timers)
                break
        heapq.heappush(self._timers, _Timer(due, next(self._seq), name))

    def cancel(self, name: str) -> None:
        self._timers = [t for t in self._timers if t.name != name]
        heapq.heapify(self._timers)

    def next(self, timeout: float | None = None) -> Event | None:
        """The next event: a queued one first, else the earliest due timer, else wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                pass
            now = time.monotonic()
            if self._timers and self._timers[0].due <= now:
                return Event(TIMER, heapq.heappop(self._timers).name)
            waits = [t for t in (self._timers[0].due if self._timers else None, deadline) if t is not None]
            wait = max(0.0, min(waits) - now) if waits else None
            try:
                return self._queue.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline and not (
                    self._timers and self._timers[0].due <= time.monotonic()
                ):
                    return None
