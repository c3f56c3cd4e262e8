"""CLAIMING and RENDEZVOUS: the task takes a unique index, then waits until everyone it
depends on is registered and passing, reads its secrets once and starts its child.

One part of the task's supervisor (supervisor.py): its methods run on the `Supervisor`,
whose state (the phase, the running child, the membership, the event loop) they share."""

from __future__ import annotations

import logging
import time

from nomadtf import roles
from nomadtf.errors import VaultError
from nomadtf.runtime import policy, startup
from nomadtf.runtime.membership import describe
from nomadtf.runtime.phase import RETRY_S, Phase

log = logging.getLogger("nomadtf.task")


class Gathers:
    """Claiming an index and the rendezvous."""

    def _claim(self) -> int | None:
        if self.membership.try_claim():
            self.last_missing = []
            self.phase = Phase.RENDEZVOUS
            self.starter.start_ahead(self.spec, self.me.index)
            return self._rendezvous()
        if not self.last_missing:
            self.last_missing = [f"a free {self.role} index"]
            log.info("every %s index is held by a live task; waiting for one to be freed", self.role)
        self.loop.call_at(time.monotonic() + RETRY_S, "step")
        return None

    def _rendezvous(self) -> int | None:
        ended = startup.ended_before_start(self.discovery.job_state(), self.role, self.me.index, "while we waited for the cluster")
        if ended is not None:
            return ended
        members = self.membership.held_members(read_again=True)
        if members is policy.SlotState.TAKEN:
            # A replacement of ours holds our index: exit 0, this task did nothing wrong, and
            # Nomad stops its allocation anyway once it hears from our node again.
            self._stop_child()
            return 0
        missing = self.membership.missing(members)
        if missing:
            if missing != self.last_missing:
                log.info("waiting for %s", ", ".join(missing))
            self.last_missing = missing
            if self.membership.forming:
                self.membership.watch_closely_if_needed(self.discovery.slots())
            return None
        self.last_missing = []
        self.loop.cancel("rendezvous-deadline")
        log.info("cluster complete after %.1fs: %s", time.monotonic() - self.rendezvous_started, describe(members) or "(nobody to wait for)")
        generation = self.membership.bump(members)
        self.membership.watch_everything()
        if roles.runs_user_code(self.spec.strategy, self.role):
            try:
                self.secrets.read_once()
            except VaultError as exc:
                # A secret that cannot be had is a mistake a human must fix (or a Vault still
                # away after the retry budget): the job fails naming the path.
                log.error("secrets: %s", exc)
                if not roles.is_soft(self.role):  # a side role's failure is its own (a warning)
                    self.membership.record_failure(1, f"its secrets: {exc}")
                return 1
        self._start_child(members, generation)
        return None

    def _begin_rendezvous(self) -> None:
        """Back to RENDEZVOUS for a new generation: a child started ahead while we wait, and
        the rendezvous timeout counted from now."""
        self.starter.start_ahead(self.spec, self.me.index)
        self.phase = Phase.RENDEZVOUS
        self.rendezvous_started = time.monotonic()
        self.loop.call_at(self.rendezvous_started + self.spec.discovery.rendezvous_timeout_s, "rendezvous-deadline")

