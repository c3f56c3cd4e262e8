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
"""

from __future__ import annotations

import json
import os
import time

_MIN_INTERVAL_S = 1.0
_last_write = 0.0


def report(step: int, **metrics: float) -> None:
    """Write {"step", "metrics", "time"} to the progress file, unless the last write is less
    than a second old (then this call is dropped)."""
    global _last_write
    path = os.environ.get("NOMADTF_PROGRESS_FILE")
    if not path:
        return
    now = time.monotonic()
    if now - _last_write < _MIN_INTERVAL_S:
        return
    _last_write = now
    payload = {"step": int(step), "metrics": {k: float(v) for k, v in metrics.items()}, "time": time.time()}
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
