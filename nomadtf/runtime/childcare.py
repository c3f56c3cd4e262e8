"""Our child: started, restarted, stopped, told of a checkpoint request; what it runs
published; and the run's outcome kept in the archive and sent (notify) once recorded.

One part of the task's supervisor (supervisor.py): its methods run on the `Supervisor`,
whose state (the phase, the running child, the membership, the event loop) they share."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass

from nomadtf.errors import ServerError
from nomadtf.runtime import notify, oom, progresswatch
from nomadtf.runtime.child import Child
from nomadtf.runtime.phase import Phase
from nomadtf.tfconfig import Member

log = logging.getLogger("nomadtf.task")


@dataclass
class Running:
    """The child that runs now, and the cluster it was started for."""

    child: Child
    members: list[Member]
    generation: int
    started: float = 0.0  # monotonic
    for_peer_change: bool = False  # (re)started because peers we depend on changed
    exit_seen: bool = False  # its exit was acted on before its exit event arrived
    oom_kills: int | None = None  # our memory cgroup's OOM kills when it started (runtime/oom.py)


class HoldsTheChild:
    """The child process and the outcome's copies."""

    # ---- the run's end -----------------------------------------------------------------------

    def _on_recorded(self, state: str) -> None:
        """We recorded the run's outcome: keep it in the archive and send it (notify), best
        effort: neither may delay or change the outcome (the POST runs in its own thread).

        GET /v1/kv/nomadtf/<ns>/<job>/<run>/progress (the run's last metrics, any task's)
        """
        try:
            self._keep_and_send(state)
        except Exception as exc:  # noqa: BLE001 - the outcome is recorded; its copies are best effort
            log.warning("archive and notify: %s", exc)

    def _keep_and_send(self, state: str) -> None:
        try:
            progress = self.discovery.progress()
        except ServerError:
            progress = None
        progress = progress or self.progress.last
        code = self.running.child.returncode if self.running else None
        if self.running:
            self.running.child.drain()  # what the child wrote last (its traceback) is in the archive
        stderr = self.archive.last_stderr() if self.archive else ""
        advice = notify.what_to_do(self.spec.name, state, stderr, code, self.alloc.alloc_id)
        record = notify.outcome_record(self.spec, state, f"{self.role}[{self.me.index}]", time.time(), progress, advice)
        if self.archive:
            self.archive.write_outcome(record)
        self.notifier.send(record)

    # ---- the child --------------------------------------------------------------------------

    def _publish_versions(self, line: str) -> None:
        """What our child runs, for `run` and `status`, added to the environment's own record
        so that its "ready" is never lost to a follower that looks late (best effort: a Consul
        hiccup must not hold the start)."""
        job_env = self.starter.job_env
        record = {**(job_env.status if job_env else {"state": "started"}), "runs": line}
        try:
            self.discovery.publish_environment(self.role, self.me.index, record)
        except ServerError as exc:
            log.warning("could not publish what our child runs: %s", exc)

    def _start_child(self, members: list[Member], generation: int) -> None:
        oom_kills = oom.kills()
        child = self.starter.start(self.spec, self.me.index, members, generation, self.secrets.env)
        self.running = Running(child, members, generation, time.monotonic(), for_peer_change=self.start_for_peer_change, oom_kills=oom_kills)
        self.start_for_peer_change = False
        self.phase = Phase.RUNNING
        self.progress.restart(time.monotonic())
        self.loop.call_at(time.monotonic() + progresswatch.TICK_S, "progress")

    def _restart_child(self, members: list[Member], generation: int, why: str) -> int | None:
        assert self.running is not None
        child = self.running.child
        if not child.alive() and child.returncode is not None:
            # Our code ended before the restart could stop it (its exit event is queued):
            # that exit is the news, never lost to the restart (a chief's 0 ends the job).
            self.running.exit_seen = True
            return self._on_child_exit(child.returncode)
        log.info("restarting our child: %s", why)
        self._stop_child()
        self._start_child(members, generation)
        assert self.running is not None
        self.running.for_peer_change = True
        return None

    def _pass_checkpoint_request(self) -> None:
        """The admission controller asks the run to checkpoint before it is preempted: the
        code gets the signal when it catches it (nomadtf.progress.on_checkpoint_request);
        code that does not would be killed by it, and is stopped with SIGTERM soon anyway."""
        child = self.running.child if self.running else None
        if child is None or not child.alive():
            return
        if child.catches(signal.SIGUSR1):
            log.info("checkpoint requested (the run is being preempted): passed on to the code")
            child.send(signal.SIGUSR1)
        else:
            log.info("checkpoint requested (the run is being preempted); the code does not catch SIGUSR1: not passed on")

    def _stop_child(self) -> int | None:
        if not self.running:
            return None
        child = self.running.child
        return child.returncode if not child.alive() and child.returncode is not None else child.stop()


