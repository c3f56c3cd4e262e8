"""The phase machine of one task: claim an index, rendezvous, run the child, follow the
cluster, end cleanly. It reads one event at a time from the loop, asks `policy` what to do,
and does it through its parts (membership, starter, progresswatch, secretenv, budget,
deadline); the phases are explicit:

    CLAIMING     taking a unique index (a Consul lock); retried on a timer
    RENDEZVOUS   waiting until everyone we depend on is registered and passing
    RUNNING      the child runs; membership changes and job state are acted on
    CHECKING     our child failed; a peer change that explains it is looked for
    FENCED       no renewal of our session for one TTL (cut off from Consul): our child
                 was stopped before a replacement may take our index; once Consul answers,
                 a new rendezvous starts it again, or ends the task if the index was taken

A Consul error in any step is logged and the step is retried on the next event or after
a second; writes a decision depends on are retried by membership.
"""

from __future__ import annotations

import enum
import logging
import signal
import time
from dataclasses import dataclass

from nomadtf import roles, wire
from nomadtf.errors import RendezvousTimeout, ServerError, TaskError, VaultError
from nomadtf.job.outcome import failed_state
from nomadtf.job.spec import JobSpec
from nomadtf.runtime import codeuser, deadline, notify, oom, policy, progresswatch, startup
from nomadtf.runtime.alloc import AllocInfo
from nomadtf.runtime.archive import TaskArchive
from nomadtf.runtime.budget import AllocationBudget
from nomadtf.runtime.child import Child, become_subreaper, make_undumpable, reap_orphans
from nomadtf.runtime.loop import (
    CATALOG,
    CHILD_EXIT,
    CLUSTER_FILE,
    CLUSTER_KV,
    SIGNAL,
    TIMER,
    Event,
    EventLoop,
)
from nomadtf.runtime.membership import Membership, describe
from nomadtf.runtime.policy import Act
from nomadtf.runtime.recording import Identity, new_incarnation
from nomadtf.runtime.secretenv import SecretEnv
from nomadtf.runtime.starter import ChildStarter
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.tfconfig import Member
from nomadtf.usercode import health as health_endpoint

log = logging.getLogger("nomadtf.task")

RETRY_S = 1.0  # a step that failed on a Consul error is tried again this soon


class Phase(enum.Enum):
    CLAIMING = "claiming"
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"
    CHECKING = "checking"
    FENCED = "fenced"


@dataclass
class Running:
    child: Child
    members: list[Member]
    generation: int
    started: float = 0.0  # monotonic
    for_peer_change: bool = False  # (re)started because peers we depend on changed
    exit_seen: bool = False  # its exit was acted on before its exit event arrived
    oom_kills: int | None = None  # our memory cgroup's OOM kills when it started (runtime/oom.py)


class Supervisor:
    """Usage: `Supervisor(spec, role, alloc, discovery, vault=vault).run()` -> the task's exit code
    (nomadtf.runtime.task.run_task builds its arguments)."""

    def __init__(
        self, spec: JobSpec, role: str, alloc: AllocInfo, discovery: ConsulDiscovery, loop: EventLoop | None = None, vault=None
    ):
        self.spec = spec
        self.role = role
        self.alloc = alloc
        self.discovery = discovery
        self.loop = loop or EventLoop()
        self.me = Identity(role, alloc.alloc_id, alloc.alloc_index, new_incarnation())
        self.membership = Membership(spec, self.me, discovery, alloc.task_dir / wire.CLUSTER_FILE, lambda: self.loop.stop_requested)
        self.budget = AllocationBudget(spec, alloc.task_dir)
        user = codeuser.resolve(spec.driver.code_user)
        self.secrets = SecretEnv(spec, alloc.secrets_dir, vault, user)
        progress_file = alloc.task_dir / wire.PROGRESS_FILE
        self.progress = progresswatch.ProgressWatch(progress_file, spec.recovery.hang_timeout_s, discovery, self.me)
        # The code's output and the run's outcome, kept beside its checkpoints (archive.py);
        # the outcome POSTed where job.json `notify` says (notify.py): its URL read now, before any code starts.
        self.archive = TaskArchive.of(spec, role, alloc.alloc_index, alloc.alloc_id, user)
        self.notifier = notify.Notifier(notify.read_url(spec, alloc.secrets_dir))
        self.membership.on_recorded = self._on_recorded
        self.starter = ChildStarter(role, alloc, progress_file, lambda pid, code: self.loop.post(Event(CHILD_EXIT, (pid, code))), self._publish_versions, user,
                                    capture=self.archive.capture if self.archive else None)
        self.phase = Phase.CLAIMING
        self.running: Running | None = None
        self.succeeded_at: float | None = None
        self.start_for_peer_change = False  # the next child starts because a peer changed
        self.failed_code = 0
        self.last_missing: list[str] = []
        self.rendezvous_started = time.monotonic()

    # ---- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        self.loop.install_signals()
        become_subreaper()
        make_undumpable()  # our child cannot read our tokens in /proc/<pid>/environ
        # Nomad's service check; usually up already (nomadtf.__main__ starts it first thing).
        health = health_endpoint.serve(self.alloc.health_port)
        try:
            return self._main()
        finally:
            self._stop_child()
            self.starter.close()
            self.membership.close()
            self.secrets.close()  # stops its renewers; revokes a token we logged in for
            health.shutdown()
            reap_orphans()
            self.notifier.wait()  # last: the outcome is recorded and our peers are told already

    def _main(self) -> int:
        ended = startup.before_claim(
            self.spec, self.role, self.alloc, self.membership, self.budget, self.starter, lambda: self.loop.stop_requested
        )
        if ended is not None:
            return ended
        if self.spec.environment is not None:
            self.rendezvous_started = time.monotonic()  # the time its build took is no wait for peers
        self.membership.start_watches(self.loop.post)
        # The first rendezvous may wait for peers that still build the job's environment.
        building = self.spec.environment.timeout_s if self.spec.environment is not None else 0.0
        self.loop.call_at(time.monotonic() + self.spec.discovery.rendezvous_timeout_s + building, "rendezvous-deadline")
        self.loop.call_at(time.monotonic(), "step")
        left = deadline.seconds_left(self.spec, time.time())
        if left is not None:
            self.loop.call_at(time.monotonic() + left, "job-deadline")
        while True:
            outcome = self._handle(self.loop.next())
            reap_orphans()  # re-parented processes that exited since the last event
            if outcome is not None:
                return outcome

    def _handle(self, event: Event | None) -> int | None:
        if event is None:
            return None
        if event.kind == SIGNAL:
            if event.data == signal.SIGHUP:
                return self._step()  # someone asks us to re-read the cluster (file)
            if event.data == signal.SIGUSR1:
                self._pass_checkpoint_request()
                return None
            log.info("received signal %d; stopping", event.data)
            code = self._stop_child()
            return 0 if code in (None, 0, -signal.SIGTERM, -signal.SIGKILL) else code
        if event.kind == CHILD_EXIT:
            pid, code = event.data
            if self.starter.died(pid, code):
                return None  # the child started ahead of the cluster: replaced, not a failure
            if not self.running or pid != self.running.child.pid or self.running.exit_seen:
                return None  # a child we already replaced, or whose exit we already acted on
            return self._guard(lambda: self._on_child_exit(code))
        if event.kind == TIMER:
            return self._on_timer(event.data)
        if event.kind == CATALOG and self.phase is Phase.RENDEZVOUS and not self.membership.may_be_complete():
            # Another arrival while peers are still missing: nothing to decide, nothing to
            # read. (Without this, N tasks arriving one by one cost N x N reads.) Slot and
            # job-state changes (CLUSTER_KV) are always looked at.
            return None
        if event.kind in (CATALOG, CLUSTER_KV, CLUSTER_FILE):
            # One step for a burst of changes: queued events come before timers, so every
            # watch event already waiting is taken before this one step runs. (A peer's
            # arrival is a registration, a check and a slot claim: three wakes, one step.)
            self.loop.call_at(time.monotonic(), "watch-step")
        return None

    def _on_timer(self, name: str) -> int | None:
        if name in ("step", "watch-step"):
            return self._step()
        if name == "rendezvous-deadline":
            if self.phase is Phase.CLAIMING:
                count = self.spec.counts.get(self.role, 1)
                raise TaskError(f"every {self.role} index (0..{count - 1}) is held by a live task; is a previous run still stopping?")
            if self.phase is Phase.RENDEZVOUS and self.membership.forming:
                # A task waiting for the cluster to form last looked up to a wait ago: look
                # now, so that the error names who is missing now (or the cluster is complete).
                ended = self._step()
                if ended is not None or self.phase is not Phase.RENDEZVOUS:
                    return ended
            if self.phase is Phase.RENDEZVOUS or (self.phase is Phase.CHECKING and self.last_missing):
                raise RendezvousTimeout(self.last_missing, self.spec.discovery.rendezvous_timeout_s)
            return None
        if name == "progress" and self.phase is Phase.RUNNING:
            self.loop.call_at(time.monotonic() + progresswatch.TICK_S, "progress")
            # Before the tick: its publish may wait on the Consul we are cut off from.
            if policy.must_fence(self.discovery.renewed_at, time.monotonic()):
                return self._fence()
            if self.progress.tick(time.monotonic()):
                return self._guard(lambda: self._recover(f"no training step for {self.progress.timeout_s:.0f}s (hang)"))
            return None
        if name == "peer-settle" and self.phase is Phase.CHECKING:
            # A peer still missing when the window closes (its supervisor was killed and
            # Nomad is restarting it) explains our failure as much as a changed one: wait
            # for it in a new rendezvous, bounded by the rendezvous timeout. The decision
            # waits for Consul, never for a wake that may not come.
            return self._guard(lambda: self._decide_after_peer_check(bool(self.membership.missing_peers())),
                               timer="peer-settle", then="deciding about our child's exit")
        if name == "job-deadline":
            return self._on_deadline()
        if name == "straggler":
            log.info("the job succeeded %.0fs ago and our code is still running; stopping it", policy.STRAGGLER_GRACE_S)
            self._stop_child()
            return 0
        return None

    def _guard(self, step, timer: str = "step", then: str = "retrying") -> int | None:
        """Run a step; a Consul error leaves the state as it is and fires `timer` again soon."""
        try:
            return step()
        except ServerError as exc:
            log.warning("Consul: %s; %s in %.0fs", exc, then, RETRY_S)
            self.loop.call_at(time.monotonic() + RETRY_S, timer)
            return None

    def _step(self) -> int | None:
        act = {
            Phase.CLAIMING: self._claim,
            Phase.RENDEZVOUS: self._rendezvous,
            Phase.RUNNING: self._look,
            Phase.CHECKING: self._check_peers,
            Phase.FENCED: self._unfence,
        }[self.phase]

        def step() -> int | None:
            with self.discovery.one_read():  # state, counts, slots, generation: one request
                self.spec = self.membership.rescale()
                return act()

        return self._guard(step)

    # ---- claiming and rendezvous ------------------------------------------------------------

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

    # ---- running ----------------------------------------------------------------------------

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
            return self._recover(f"crashed ({_describe_code(code)})")
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
            return self._recover(f"crashed ({_describe_code(code)})")
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

    def _begin_rendezvous(self) -> None:
        """Back to RENDEZVOUS for a new generation: a child started ahead while we wait, and
        the rendezvous timeout counted from now."""
        self.starter.start_ahead(self.spec, self.me.index)
        self.phase = Phase.RENDEZVOUS
        self.rendezvous_started = time.monotonic()
        self.loop.call_at(self.rendezvous_started + self.spec.discovery.rendezvous_timeout_s, "rendezvous-deadline")

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


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"
