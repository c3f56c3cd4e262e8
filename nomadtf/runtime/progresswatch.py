"""Progress and hang detection for the running child.

Our child's code may report its step (`nomadtf.progress.report`), which writes a small file
in the task directory. While the child runs, the supervisor reads that file every
`TICK_S` (a local read, no request); a new step resets the hang clock (policy.HangClock:
recovery.hang_timeout without a new step is a hang), and a changed report is published to
Consul at most every `PUBLISH_S`, for `nomadtf run` and `nomadtf status`.
"""

from __future__ import annotations

from pathlib import Path

from nomadtf.errors import ServerError
from nomadtf.progress import read as read_progress
from nomadtf.runtime.policy import HangClock
from nomadtf.runtime.recording import Identity
from nomadtf.servers.consul import ConsulDiscovery

TICK_S = 0.5  # the local progress file is read this often (no Consul read)
PUBLISH_S = 2.0  # and published at most this often


class ProgressWatch:
    """Usage (the supervisor's loop, one thread):
    watch = ProgressWatch(path, spec.recovery.hang_timeout_s, discovery, identity)
    watch.restart(now)          # a child (re)started: the whole timeout again
    if watch.tick(now): ...     # every TICK_S while it runs; True: it hangs
    """

    def __init__(self, path: Path, hang_timeout_s: float, discovery: ConsulDiscovery, me: Identity):
        self.path = path
        self.hang = HangClock(hang_timeout_s)
        self.discovery = discovery
        self.me = me  # whose report it is (its index is the one we hold when it is published)
        self.last: dict | None = None
        self.published: dict | None = None  # the report Consul has
        self.published_at = 0.0

    @property
    def timeout_s(self) -> float:
        return self.hang.timeout_s

    def restart(self, now: float) -> None:
        self.hang.restart(now)

    def tick(self, now: float) -> bool:
        """Read the progress file; feed a new step to the hang clock; publish a changed report
        (best effort); True when the child hangs.

        PUT /v1/kv/nomadtf/<ns>/<job>/<run>/progress (outside the watched prefix)
        """
        progress = read_progress(str(self.path))
        if progress and progress != self.last:  # a restarted child's first report changes it
            self.hang.observe(progress.get("step"), now)
            if progress.get("done"):
                self.hang.finish()
            self.last = progress
        # A new checkpoint goes out at once: a preemption or a growth waits on it, and every
        # step run after it until the stop is lost. Otherwise at most every PUBLISH_S, and a
        # change held back is sent at the next tick due (not dropped).
        new_checkpoint = bool(progress) and progress.get("checkpoint_step") != (self.published or {}).get("checkpoint_step")
        if progress and progress != self.published and (new_checkpoint or now - self.published_at >= PUBLISH_S):
            self.published_at = now
            try:
                self.discovery.publish_progress({**progress, "role": self.me.role, "index": self.me.index})
                self.published = progress
            except ServerError:
                pass  # progress is best effort
        return self.hang.hung(now)
