"""CHECKING and FENCED: whether a peer's change explains our child's failure, recovery
in place within the budget, and the fence when our Consul session goes unrenewed.

One part of the task's supervisor (supervisor.py): its methods run on the `Supervisor`,
whose state (the phase, the running child, the membership, the event loop) they share."""

from __future__ import annotations

import logging
import time

from nomadtf.runtime import policy
from nomadtf.runtime.phase import RETRY_S, Phase, describe_code
from nomadtf.runtime.policy import Act
from nomadtf.runtime.recording import new_incarnation

log = logging.getLogger("nomadtf.task")


class Recovers:
    """After our child failed, or when we are cut off from Consul."""

    def _check_peers(self) -> int | None:
        assert self.running is not None
        members = self.membership.members()
        missing = self.membership.missing(members)
        self.last_missing = missing
        if not missing and policy.fingerprint(members) != policy.fingerprint(self.running.members):
            return self._decide_after_peer_check(changed=True)
        return None

    def _decide_after_peer_check(self, changed: bool) -> int | None:
        self.loop.cancel("peer-settle")
        self.loop.cancel("rendezvous-deadline")
        code = self.failed_code
        # A child restarted for a peer's change that fails soon after failed because of
        # that peer (a parameter server whose new TensorFlow server was not listening yet):
        # recover again, within the budget, instead of calling the code broken.
        running = self.running
        if running and running.for_peer_change and time.monotonic() - running.started < policy.PEER_FAULT_WINDOW_S:
            changed = True
        act = policy.after_peer_check(code, self.spec.recovery.permanent_exit_codes, changed)
        if act is Act.RECOVER_WITH_CLUSTER:
            return self._recover(f"exit {code} after a peer changed", own_crash=False)
        if act is Act.RECOVER:
            return self._recover(f"crashed ({describe_code(code)})")
        log.error("our code exited %d, a permanent exit code; marking the job failed so that nothing retries it", code)
        self.membership.record_failure(code, "a permanent exit code")
        return code

    def _recover(self, why: str, own_crash: bool = True) -> int | None:
        """Restart our child in place through a new rendezvous, within the budget. A crash
        (and a hang) gets a new incarnation, so peers that depend on our state restart too."""
        if not self.budget.spend():
            log.error("giving up after %d recoveries in %.0fs (%s)", self.spec.recovery.restart_attempts, self.budget.window_s, why)
            self._stop_child()
            # Nomad's restart and reschedule policy is the rest of the budget: it restarts
            # this task (or places it elsewhere) until its own attempts are spent.
            return 1
        log.info("recovering: %s", why)
        if own_crash:
            # Peers are told first: stopping a hung child can take the whole stop grace,
            # and a peer whose own code failed meanwhile (a collective that timed out) is
            # looking for exactly this change to know it was not its own fault.
            self.membership.announce_restart()
        self._stop_child()
        # A recovery for a peer's change starts a child that may fail again while that
        # peer's new server comes up: the same peer's fault, not our code's (see
        # _decide_after_peer_check), whichever way the restart came about.
        self.start_for_peer_change = not own_crash
        self._begin_rendezvous()
        return self._step()

    def _fence(self) -> int | None:
        """No renewal of our session for one TTL: we may be cut off from Consul while Nomad
        places a replacement of ours, so our code stops before the replacement can take our
        index (policy.must_fence says when, and why that is soon enough). No failure of the
        code: no budget is spent; the steps that follow (FENCED) wait for Consul to answer."""
        assert self.running is not None
        if not self.running.child.alive():
            return None  # it ended by itself: its exit event is queued, and is the news
        log.error("no Consul session renewal for %.0fs: stopping our code before a replacement may take %s[%d]",
                  policy.FENCE_AFTER_S, self.role, self.me.index)
        self.loop.cancel("progress")
        self._stop_child()
        self.running = None
        self.phase = Phase.FENCED
        self.loop.call_at(time.monotonic() + RETRY_S, "step")
        return None

    def _unfence(self) -> int | None:
        """Consul answers again after a fence (this step's read went through). Our session
        still alive: the index is ours, and a new incarnation tells the peers that depend on
        our state that it is gone. Otherwise the rendezvous claims the index again, or finds
        it taken by a replacement and ends the task (as `_rendezvous` always does).

        PUT /v1/session/renew/:id ; PUT .../cluster/slots/<role>/<i>?acquire=<session>
        """
        if self.discovery.renew_session():
            self.membership.announce_restart()
        else:
            self.me.incarnation = new_incarnation()  # written by the claim again
        log.info("Consul answers again; starting our code anew through a new rendezvous")
        self._begin_rendezvous()
        return self._rendezvous()

