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

import logging
import signal
import time

from nomadtf import wire
from nomadtf.errors import RendezvousTimeout, ServerError, TaskError
from nomadtf.job.spec import JobSpec
from nomadtf.runtime import codeuser, deadline, notify, policy, progresswatch, startup
from nomadtf.runtime.alloc import AllocInfo
from nomadtf.runtime.archive import TaskArchive
from nomadtf.runtime.budget import AllocationBudget
from nomadtf.runtime.child import become_subreaper, make_undumpable, reap_orphans
from nomadtf.runtime.childcare import HoldsTheChild, Running
from nomadtf.runtime.following import FollowsTheRun
from nomadtf.runtime.gathering import Gathers
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
from nomadtf.runtime.membership import Membership
from nomadtf.runtime.phase import RETRY_S, Phase
from nomadtf.runtime.recording import Identity, new_incarnation
from nomadtf.runtime.recovering import Recovers
from nomadtf.runtime.secretenv import SecretEnv
from nomadtf.runtime.starter import ChildStarter
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.usercode import health as health_endpoint

log = logging.getLogger("nomadtf.task")


class Supervisor(Gathers, FollowsTheRun, Recovers, HoldsTheChild):
    """Usage: `Supervisor(spec, role, alloc, discovery, vault=vault).run()` -> the task's exit code
    (nomadtf.runtime.task.run_task builds its arguments). The loop, its events and timers are
    here; what each phase does is one base class, a module of its own: gathering.py (claiming,
    rendezvous), following.py (running), recovering.py (checking, fenced), childcare.py (the
    child and the outcome's copies)."""

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
