"""RUNNING: the job's state and the settled cluster acted on, our child's exit decided
(success, recovery, a check of the peers, or a failure), its memory kill, the job's deadline.

One part of the task's supervisor (supervisor.py): its methods run on the `Supervisor`,
whose state (the phase, the running child, the membership, the event loop) they share."""

from __future__ import annotations

import logging
import time

from nomadtf import roles, wire
from nomadtf.job.outcome import failed_state
from nomadtf.runtime import deadline, oom, policy
from nomadtf.runtime.phase import Phase, describe_code
from nomadtf.runtime.policy import Act

log = logging.getLogger("nomadtf.task")


class FollowsTheRun:
    """The run while our child runs, and its exit."""

    def _look(self) -> int | None:
        """Act on the job's state, then on a settled change of the complete cluster."""
        assert self.running is not None
        state = self.discovery.job_state()
        if state == "succeeded" and self.succeeded_at is None:
            self.succeeded_at = time.monotonic()
        since = time.monotonic() - self.succeeded_at if self.succeeded_at else 0.0
        act = policy.on_job_state(state, self.spec.strategy, self.role, self.membership.completes_job, since)
        if act is Act.STOP_NOW:
            log.info("the job succeeded; stopping our %s", "TensorFlow server" if not roles.runs_user_code(self.spec.strategy, self.role) else "child")
            self._stop_child()
            return 0
        if act is Act.STOP_JOB_FAILED:
            log.error("the job failed (%s); stopping our child", state)
            self._stop_child()
            return 0
        if act is Act.STOP_AFTER_GRACE:
            self.loop.call_at(self.succeeded_at + policy.STRAGGLER_GRACE_S, "straggler")
            return None
        members = self.membership.held_members(read_again=False)
        if members is policy.SlotState.TAKEN:
            self._stop_child()  # a replacement of ours holds our index (see _rendezvous)
            return 0
        if members is policy.SlotState.LOST:
            return None  # the claim's KV write wakes us again
        settled = self.membership.settle(members, time.monotonic())
        if settled is None:
            return None  # a peer is away; act once it is back (and only if it changed)
        if settled.look_again_at is not None:
            self.loop.call_at(settled.look_again_at, "step")
            return None
        number = settled.generation
        if number != self.running.generation and settled.ours:
            if policy.must_restart(self.spec.strategy, self.role, self.me.index, self.running.members, members):
                return self._restart_child(members, number, f"generation {number} changed peers we depend on")
            self.running.generation, self.running.members = number, members
        return None

    def _on_child_exit(self, code: int) -> int | None:
        if self.running and oom.killed_for_memory(self.running.oom_kills, code):
            return self._on_oom()
        state = self.membership.recorded_state()
        act = policy.on_child_exit(code, self.spec.recovery.permanent_exit_codes, state, self.membership.completes_job, roles.is_soft(self.role))
        if act is Act.SUCCEED_JOB and self.spec.success == "all_workers":
            done = self.membership.mark_done()
            left = [i for i in range(self.spec.counts.get("worker", 0)) if ("worker", i) not in done]
            if left:
                log.info("our code finished; the job succeeds once every worker has (still running: %s)", left)
                return 0
        if act is Act.SUCCEED_JOB:
            self.membership.record(wire.STATE_SUCCEEDED, "marking the job succeeded")
            log.info("training finished; job marked succeeded")
            return 0
        if act is Act.EXIT_OK:
            log.info("our child exited %d%s; done", code, " after the job succeeded" if state == "succeeded" else "")
            return 0
        if act is Act.RECOVER:
            return self._recover(f"crashed ({describe_code(code)})")
        # CHECK_PEERS: did a peer move or lose its state? Wait a little to see.
        self.phase = Phase.CHECKING
        self.failed_code = code
        self.loop.call_at(time.monotonic() + policy.PEER_SETTLE_S, "peer-settle")
        self.loop.call_at(time.monotonic() + self.spec.discovery.rendezvous_timeout_s, "rendezvous-deadline")
        self.starter.start_ahead(self.spec, self.me.index)  # most checks end in a restart
        return self._check_peers()

    def _on_oom(self) -> int | None:
        """Our child was killed for exceeding the role's memory: the same limit would kill it
        again, so a training role fails the job at once, saying which field to raise. A side
        role's child restarts in place as after any failure, and says why."""
        cfg = self.spec.roles[self.role]
        why = oom.why(self.role, cfg.memory_max or cfg.memory, "memory_max" if cfg.memory_max else "memory")
        log.error("our child was %s", why)
        if roles.is_soft(self.role):
            return self._recover(why)
        self.membership.record_failure(oom.EXIT_CODE, why)
        return oom.EXIT_CODE

    def _on_deadline(self) -> int:
        """The job ran past recovery.deadline: it fails as a whole, recorded against the
        task whose exit decides the job, and every task stops."""
        deciding = deadline.deciding_task(self.spec) or (self.role, self.me.index)
        state = self.membership.recorded_state()
        if state is None:
            state = failed_state(deciding[0], deciding[1], 1, deadline.passed_why(self.spec))
            self.membership.record(state, "marking the job failed (deadline)", deadline_s=deadline.MIN_DECISION_RETRY_S)
        log.error("the job's deadline passed (%s); stopping", state)
        self._stop_child()
        return 1 if deciding == (self.role, self.me.index) else 0

