"""Optional helper for training code: `nomadtf.progress.report(step=n, loss=x)`.

Costs microseconds: it keeps the latest values in memory and writes them to a small file
at most once a second. The surrounding `nomadtf task` publishes that file to Consul KV
(nomadtf/<job>/progress), where `nomadtf run` shows it and recovery uses it to detect a
hang. Outside nomadtf (no NOMADTF_PROGRESS_FILE) it does nothing.
"""

from __future__ import annotations

import json
import os
import time

_MIN_INTERVAL_S = 1.0
_last_write = 0.0


def report(step: int, **metrics: float) -> None:
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
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
