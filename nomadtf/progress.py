"""Optional helper for training code: `nomadtf.progress.report(step=n, loss=x)`.

Costs microseconds: a call writes its values to a small file (NOMADTF_PROGRESS_FILE) only
when the last write is a second old or more; calls in between are dropped, not kept, so
the file can lag the latest call by up to a second, and the steps reported in the last
second before the code stops reporting may never reach it. The surrounding `nomadtf task`
reads that file every second, its hang detection watching the step
(nomadtf.runtime.progresswatch), and publishes a changed report at most every two seconds
to the run's one Consul KV key, nomadtf/<namespace>/<job>/<run id>/progress, tagged with the
reporting task's role and index (the latest report of any task is the one kept there), where
`nomadtf run` and `nomadtf status` show it. Outside nomadtf (no NOMADTF_PROGRESS_FILE) it
does nothing.

Preemption (docs/guide/queueing.md): before the admission controller suspends a run to make
room for another, the run is asked to checkpoint now: its tasks get SIGUSR1, which nomadtf
passes on to the code only when the code catches it. `on_checkpoint_request()` catches it;
the training loop then saves at its next step boundary and says so with `checkpointed(step)`,
which also tells the controller how many steps a preemption would lose:

    from nomadtf import progress
    progress.on_checkpoint_request()          # once, at the start
    for step in ...:
        train_one_step()
        progress.report(step=step, loss=loss)
        if step % 1000 == 0 or progress.checkpoint_requested():
            manager.save(step)
            progress.checkpointed(step)
    progress.done()                           # the loop is over: what follows is no hang

Hang detection (job.json `recovery.hang_timeout`) restarts code that reported a step once
and then none for that long. `done()` says the training loop is over: a final evaluation,
saving the model and TensorFlow's own shutdown may then take longer than the timeout (under
multi-worker mirrored the first worker's shutdown waits on its peers) without being taken
for a hang.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable

_MIN_INTERVAL_S = 1.0
CHECKPOINT_SIGNAL = signal.SIGUSR1
_last_write = 0.0
_last: dict = {}  # the last step and metrics reported (checkpointed() writes them again)
_checkpoint_step: int | None = None
_done = False
_requested = threading.Event()


def report(step: int, **metrics: float) -> None:
    """Write {"step", "metrics", "time"} (and "checkpoint_step" once one was saved) to the
    progress file, unless the last write is less than a second old (then this call is dropped)."""
    global _last_write
    _last.update(step=int(step), metrics={k: float(v) for k, v in metrics.items()})
    path = os.environ.get("NOMADTF_PROGRESS_FILE")
    if not path:
        return
    now = time.monotonic()
    if now - _last_write < _MIN_INTERVAL_S:
        return
    _last_write = now
    _write(path)


def checkpointed(step: int) -> None:
    """The code saved a checkpoint at `step`: written at once (not held back a second), and a
    checkpoint request is answered."""
    global _checkpoint_step, _last_write
    _checkpoint_step = int(step)
    _requested.clear()
    _last.setdefault("step", int(step))
    _last.setdefault("metrics", {})
    path = os.environ.get("NOMADTF_PROGRESS_FILE")
    if path:
        _last_write = time.monotonic()
        _write(path)


def done() -> None:
    """The training loop is over: written at once, and from then on no silence of this code
    is a hang (hang detection watches the next attempt afresh). Code that never reported a
    step writes nothing: it was never judged, and a report of step 0 would stand in the run's
    progress for the task that does report (the latest report of any task is the one kept)."""
    global _done, _last_write
    _done = True
    path = os.environ.get("NOMADTF_PROGRESS_FILE")
    if path and "step" in _last:
        _last_write = time.monotonic()
        _write(path)


def on_checkpoint_request(callback: Callable[[], None] | None = None) -> None:
    """Catch the checkpoint request (CHECKPOINT_SIGNAL): `checkpoint_requested()` turns True,
    and `callback` (when given) runs in the main thread, between two Python statements. Call
    it from the main thread."""

    def handler(_signum: int, _frame: object) -> None:
        _requested.set()
        if callback is not None:
            callback()

    signal.signal(CHECKPOINT_SIGNAL, handler)


def checkpoint_requested() -> bool:
    """Whether a checkpoint was asked for and `checkpointed()` not called since."""
    return _requested.is_set()


def _write(path: str) -> None:
    payload = {"step": int(_last.get("step", 0)), "metrics": dict(_last.get("metrics", {})), "time": time.time()}
    if _checkpoint_step is not None:
        payload["checkpoint_step"] = _checkpoint_step
    if _done:
        payload["done"] = True
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)  # readers never see half a file


def read(path: str) -> dict | None:
    """The last report written to `path`; None when there is none (yet) or it cannot be read."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
