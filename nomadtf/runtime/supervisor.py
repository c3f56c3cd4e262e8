"""The life of one task: claim an index, rendezvous, run the child, follow the cluster,
end cleanly. It reads one event at a time from the loop, asks `policy` what to do, and
does it; the phases are explicit:

    CLAIMING     taking a unique index (a Consul lock); retried on a timer
    RENDEZVOUS   waiting until everyone we depend on is registered and passing
    RUNNING      the child runs; membership changes and job state are acted on
    CHECKING     our child failed; a peer change that explains it is looked for

A Consul error in any step is logged and the step is retried on the next event or after
a second; writes a failure path depends on retry with bounded backoff (discovery.retrying).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from nomadtf import health as health_endpoint
from nomadtf import roles, wire
from nomadtf.discovery import ConsulDiscovery, consul_client, retrying
from nomadtf.environment import EnvBuildError, EnvBuildStopped
from nomadtf.errors import CannotRecord, RendezvousTimeout, ServerError, TaskError, VaultError
from nomadtf.outcome import DEADLINE_WHY
from nomadtf.progress import read as read_progress
from nomadtf.runtime import jobenv, launch, policy, warm
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
from nomadtf.runtime.membership import Identity, Membership, describe
from nomadtf.runtime.policy import Act
from nomadtf.spec import JobSpec, for_task, read_spec_file
from nomadtf.tfconfig import Member

log = logging.getLogger("nomadtf.task")

RETRY_S = 1.0  # a step that failed on a Consul error is tried again this soon
PROGRESS_TICK_S = 1.0  # the local progress file is read this often (no Consul read)
PROGRESS_PUBLISH_S = 2.0  # and published at most this often


class Phase(enum.Enum):
    CLAIMING = "claiming"
    RENDEZVOUS = "rendezvous"
    RUNNING = "running"
    CHECKING = "checking"


@dataclass
class AllocInfo:
    """What Nomad tells the task about itself through its environment."""

    job_id: str
    alloc_id: str
    alloc_index: int
    tf_port: int
    health_port: int
    task_dir: Path
    secrets_dir: Path

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> AllocInfo:
        try:
            return cls(
                job_id=env["NOMAD_JOB_ID"],
                alloc_id=env["NOMAD_ALLOC_ID"],
                alloc_index=int(env.get("NOMAD_ALLOC_INDEX", "0")),
                tf_port=int(env["NOMAD_PORT_tf"]),
                health_port=int(env["NOMAD_PORT_health"]),
                task_dir=Path(env.get("NOMAD_TASK_DIR", ".")),
                secrets_dir=Path(env.get("NOMAD_SECRETS_DIR", ".")),
            )
        except KeyError as exc:
            raise TaskError(f"{exc.args[0]} is not set: `nomadtf task` runs inside a Nomad allocation of a rendered job") from None


@dataclass
class Running:
    child: Child
    members: list[Member]
    generation: int
    started: float = 0.0  # monotonic
    for_peer_change: bool = False  # (re)started because peers we depend on changed
    exit_seen: bool = False  # its exit was acted on before its exit event arrived


class Supervisor:
    def __init__(
        self, spec: JobSpec, role: str, alloc: AllocInfo, discovery: ConsulDiscovery, loop: EventLoop | None = None, vault=None
    ):
        self.spec = spec
        self.base_counts = dict(spec.counts)  # as submitted; `nomadtf scale` may change them
        self.role = role
        self.alloc = alloc
        self.discovery = discovery
        self.loop = loop or EventLoop()
        self.me = Identity(role, alloc.alloc_id, alloc.alloc_index, _incarnation())
        self.membership = Membership(spec, self.me, discovery, alloc.task_dir / wire.CLUSTER_FILE)
        self.phase = Phase.CLAIMING
        self.running: Running | None = None
        self.budget_file = alloc.task_dir / wire.RECOVERIES_FILE
        self.restarted_by_nomad = self.budget_file.exists()  # a predecessor in this allocation ran
        self.budget = policy.RestartBudget.from_json(
            spec.recovery.restart_attempts, spec.recovery.restart_interval_s,
            self.budget_file.read_text() if self.restarted_by_nomad else None,
        )
        self.debounce = policy.Debounce(spec.discovery.debounce_s)
        self.hang = policy.HangClock(spec.recovery.hang_timeout_s)
        self.progress_file = alloc.task_dir / wire.PROGRESS_FILE
        self.last_progress: dict | None = None
        self.published_at = 0.0
        self.secret_env: dict[str, str] = {}
        self.vault = vault  # secrets.VaultSession: the task's one Vault login (None: no secrets, or not yet)
        self.secrets_read = False
        self.succeeded_at: float | None = None
        self.start_for_peer_change = False  # the next child starts because a peer changed
        self.failed_code = 0
        self.last_missing: list[str] = []
        self.rendezvous_started = time.monotonic()
        self.job_env: jobenv.Ready | None = None  # job.json `environment`, held until we exit
        self.warm = warm.WarmStart()  # the child started while we wait for the cluster

    @property
    def completes_job(self) -> bool:
        return roles.completes_job(self.spec.strategy, self.role, self.me.index, self.spec.counts, self.spec.success)

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
            self.warm.close()
            self.membership.close()
            if self.vault is not None:
                self.vault.close()  # stops its renewers; revokes a token we logged in for
            health.shutdown()
            reap_orphans()

    def _main(self) -> int:
        log.info("job %s (namespace %s), alloc %s, %s strategy", self.spec.name, self.spec.namespace, self.alloc.alloc_id[:8], self.spec.strategy)
        gpus = launch.assigned_gpus(dict(os.environ))
        if self.spec.gpus.get(self.role):
            log.info("GPUs assigned by Nomad: %s", ", ".join(gpus) or "none (no device plugin granted any)")
        else:
            log.info("GPUs: none requested; CUDA_VISIBLE_DEVICES is empty for our code")
        ended = self._ended_before_start(self._job_state(), self.alloc.alloc_index, "before we started")
        if ended is not None:
            return ended
        if self.restarted_by_nomad and not self._spend_budget():
            # Nomad restarted this task (our supervisor died or gave up): that restart is a
            # recovery too. With the budget spent, the allocation fails at once and Nomad's
            # reschedule policy decides (recovery.restart_attempts is one budget, not two).
            log.error("the restart budget of this allocation is spent (%d in %.0fs); not starting our code again",
                      self.spec.recovery.restart_attempts, self.budget.window_s)
            return 1
        if not self.restarted_by_nomad:
            self._save_budget()  # what tells a restarted supervisor it is one
        if self.spec.environment is not None:
            ended = self._prepare_environment()
            if ended is not None:
                return ended
        self._open_session()
        ended = self._check_code()
        if ended is not None:
            return ended
        self.membership.start_watches(self.loop.post)
        # The first rendezvous may wait for peers that still build the job's environment.
        building = self.spec.environment.timeout_s if self.spec.environment is not None else 0.0
        self.loop.call_at(time.monotonic() + self.spec.discovery.rendezvous_timeout_s + building, "rendezvous-deadline")
        self.loop.call_at(time.monotonic(), "step")
        if self.spec.submitted_at is not None:
            # recovery.deadline counts from the submission, whoever follows the job or not.
            left = self.spec.submitted_at + self.spec.recovery.deadline_s - time.time()
            self.loop.call_at(time.monotonic() + max(0.0, left), "job-deadline")
        while True:
            event = self.loop.next()
            outcome = self._handle(event)
            reap_orphans()  # re-parented processes that exited since the last event
            if outcome is not None:
                return outcome

    def _handle(self, event: Event | None) -> int | None:
        if event is None:
            return None
        if event.kind == SIGNAL:
            if event.data == signal.SIGHUP:
                return self._step()  # someone asks us to re-read the cluster (file)
            log.info("received signal %d; stopping", event.data)
            code = self._stop_child()
            return 0 if code in (None, 0, -signal.SIGTERM, -signal.SIGKILL) else code
        if event.kind == CHILD_EXIT:
            pid, code = event.data
            if self.warm.died(pid, code):
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
            if self.phase is Phase.RENDEZVOUS or (self.phase is Phase.CHECKING and self.last_missing):
                raise RendezvousTimeout(self.last_missing, self.spec.discovery.rendezvous_timeout_s)
            return None
        if name == "progress":
            return self._on_progress_tick()
        if name == "peer-settle" and self.phase is Phase.CHECKING:
            # A peer still missing when the window closes (its supervisor was killed and
            # Nomad is restarting it) explains our failure as much as a changed one: wait
            # for it in a new rendezvous, bounded by the rendezvous timeout.
            try:
                # Our own slot lapsing (our session expired while Consul was away) is no
                # peer's change: it explains nothing about our child's exit.
                me = f"{self.role}[{self.me.index}]"
                peers_missing = [m for m in self.membership.missing(self.membership.members()) if m != me]
                return self._decide_after_peer_check(bool(peers_missing), [])
            except ServerError as exc:
                # The decision waits for Consul, never for a wake that may not come.
                log.warning("Consul: %s; deciding about our child's exit in %.0fs", exc, RETRY_S)
                self.loop.call_at(time.monotonic() + RETRY_S, "peer-settle")
                return None
        if name == "job-deadline":
            return self._on_deadline()
        if name == "straggler":
            log.info("the job succeeded %.0fs ago and our code is still running; stopping it", policy.STRAGGLER_GRACE_S)
            self._stop_child()
            return 0
        return None

    def _guard(self, step) -> int | None:
        """Run a step; a Consul error leaves the state as it is and retries the step soon."""
        try:
            return step()
        except ServerError as exc:
            log.warning("Consul: %s; retrying in %.0fs", exc, RETRY_S)
            self.loop.call_at(time.monotonic() + RETRY_S, "step")
            return None

    def _step(self) -> int | None:
        act = {
            Phase.CLAIMING: self._claim,
            Phase.RENDEZVOUS: self._rendezvous,
            Phase.RUNNING: self._look,
            Phase.CHECKING: self._check_peers,
        }[self.phase]
        def step() -> int | None:
            with self.discovery.one_read():  # state, counts, slots, generation: one request
                self._refresh_counts()
                return act()

        return self._guard(step)

    def _refresh_counts(self) -> None:
        """`nomadtf scale` writes new role counts under the watched prefix: from then on the
        cluster has that many tasks of the role (the change of members does the rest)."""
        scaled = self.discovery.counts()
        counts = {role: scaled.get(role, n) if n else 0 for role, n in self.base_counts.items()}
        if counts != self.spec.counts:
            log.info("role counts are now %s (nomadtf scale)", counts)
            self.spec = dataclasses.replace(self.spec, counts=counts)
            self.membership.spec = self.spec

    def _prepare_environment(self) -> int | None:
        """Reuse or build the job's Python environment before the rendezvous (whose timeout
        counts from then on). A build that fails is a permanent failure of the job: recorded,
        so that `run` reports it and stops the job, and no restart builds it again."""
        try:
            self.job_env = jobenv.prepare(
                self.spec, self.role, self.alloc.alloc_index, self.alloc.task_dir, self.discovery, lambda: self.loop.stop_requested
            )
        except EnvBuildStopped:
            log.info("asked to stop while preparing the environment")
            return 0
        except EnvBuildError as exc:
            log.error("%s", exc)
            state = policy.failed_state(self.role, self.alloc.alloc_index, 1, f"its Python environment: {exc}")
            self._record(state, "marking the job failed")
            return 1
        self.rendezvous_started = time.monotonic()
        return None

    # ---- claiming and rendezvous ------------------------------------------------------------

    def _claim(self) -> int | None:
        if self.membership.try_claim():
            self.last_missing = []
            self.phase = Phase.RENDEZVOUS
            self._warm_up()
            return self._rendezvous()
        if not self.last_missing:
            self.last_missing = [f"a free {self.role} index"]
            log.info("every %s index is held by a live task; waiting for one to be freed", self.role)
        self.loop.call_at(time.monotonic() + RETRY_S, "step")
        return None

    def _rendezvous(self) -> int | None:
        ended = self._ended_before_start(self.discovery.job_state(), self.me.index, "while we waited for the cluster")
        if ended is not None:
            return ended
        slots = self.discovery.slots()
        state = self.membership.slot_state(slots)
        if state is policy.SlotState.TAKEN:
            return self._replaced(self.membership.holder(slots))
        if state is policy.SlotState.LOST:
            self.membership.reclaim()
            slots = self.discovery.slots()
        members = self.membership.members(slots)
        missing = self.membership.missing(members)
        if missing:
            if missing != self.last_missing:
                log.info("waiting for %s", ", ".join(missing))
            self.last_missing = missing
            return None
        self.last_missing = []
        self.loop.cancel("rendezvous-deadline")
        log.info("cluster complete after %.1fs: %s", time.monotonic() - self.rendezvous_started, describe(members) or "(nobody to wait for)")
        generation = self._bump(policy.fingerprint(members))
        if roles.runs_user_code(self.spec.strategy, self.role) and self.spec.secrets and not self.secrets_read:
            ended = self._fetch_secrets()
            if ended is not None:
                return ended
        self._start_child(members, generation)
        return None

    def _ended_before_start(self, state: str | None, index: int, when: str) -> int | None:
        """The exit code when the job ended before our child could start, else None."""
        act = policy.on_start(state, self.role, index)
        if act is Act.EXIT_FAILED:
            log.error("the job failed here %s (%s); not starting", when, state)
            return 1
        if act is Act.EXIT_OK:
            log.info("the job ended %s (%s); nothing to do", when, state)
            return 0
        return None

    # ---- running ----------------------------------------------------------------------------

    def _look(self) -> int | None:
        """Act on the job's state, then on a settled change of the complete cluster."""
        assert self.running is not None
        state = self.discovery.job_state()
        if state == "succeeded" and self.succeeded_at is None:
            self.succeeded_at = time.monotonic()
        since = time.monotonic() - self.succeeded_at if self.succeeded_at else 0.0
        act = policy.on_job_state(state, self.spec.strategy, self.role, self.completes_job, since)
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
        slots = self.discovery.slots()
        state = self.membership.slot_state(slots)
        if state is policy.SlotState.TAKEN:
            return self._replaced(self.membership.holder(slots))
        if state is policy.SlotState.LOST:
            self.membership.reclaim()
            return None  # the claim's KV write wakes us again
        members = self.membership.members(slots)
        if self.membership.missing(members):
            self.debounce.reset()  # a peer is away; act once it is back (and only if it changed)
            return None
        current = policy.fingerprint(members)
        generation, _ = self.discovery.generation()
        if generation.get("fingerprint") != current:
            if self.debounce.value != current:
                log.info("peers changed: %s; acting once this holds for %.1fs", describe(members), self.debounce.hold_s)
            if not self.debounce.observe(current, time.monotonic()):
                self.loop.call_at(self.debounce.due() or time.monotonic(), "step")
                return None
            self.debounce.reset()
            generation = self.discovery.bump_generation(current)
            log.info("cluster changed: generation %d: %s", generation["generation"], describe(members))
        else:
            self.debounce.reset()
        number = int(generation.get("generation", 0))
        if number != self.running.generation and generation.get("fingerprint") == current:
            if policy.must_restart(self.spec.strategy, self.role, self.me.index, self.running.members, members):
                return self._restart_child(members, number, f"generation {number} changed peers we depend on")
            else:
                self.running.generation, self.running.members = number, members
        return None

    def _replaced(self, holder: str) -> int:
        """Another allocation holds our index: Nomad placed a replacement of ours while our
        node was cut off, and our Consul session lapsed meanwhile. Two tasks of one index must
        never run (two ps[0] would each hold half the truth), so we stop our child and end.
        Exit 0: this task did nothing wrong, and Nomad stops its allocation anyway once it
        hears from our node again."""
        log.error(
            "%s[%d] is held by allocation %s now, a replacement of ours (we were cut off); stopping our child",
            self.role, self.me.index, holder[:8],
        )
        self._stop_child()
        return 0

    def _on_child_exit(self, code: int) -> int | None:
        state = self._job_state()
        act = policy.on_child_exit(code, self.spec.recovery.permanent_exit_codes, state, self.completes_job, roles.is_soft(self.role))
        if act is Act.SUCCEED_JOB and self.spec.success == "all_workers":
            done = self._retry(lambda: self.discovery.mark_done(self.role, self.me.index), "recording that we finished", self._record_budget_s())
            left = [i for i in range(self.spec.counts.get("worker", 0)) if ("worker", i) not in done]
            if left:
                log.info("our code finished; the job succeeds once every worker has (still running: %s)", left)
                return 0
        if act is Act.SUCCEED_JOB:
            self._record(wire.STATE_SUCCEEDED, "marking the job succeeded")
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
        self._warm_up()  # most checks end in a restart
        return self._check_peers()

    def _check_peers(self) -> int | None:
        assert self.running is not None
        members = self.membership.members()
        missing = self.membership.missing(members)
        self.last_missing = missing
        if not missing and policy.fingerprint(members) != policy.fingerprint(self.running.members):
            return self._decide_after_peer_check(True, members)
        return None

    def _decide_after_peer_check(self, changed: bool, members: list[Member]) -> int | None:
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
        state = policy.failed_state(self.role, self.me.index, code, "a permanent exit code")
        log.error("our code exited %d, a permanent exit code; marking the job failed so that nothing retries it", code)
        self._record(state, "marking the job failed")
        return code

    def _recover(self, why: str, own_crash: bool = True) -> int | None:
        """Restart our child in place through a new rendezvous, within the budget. A crash
        (and a hang) gets a new incarnation, so peers that depend on our state restart too."""
        if not self._spend_budget():
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
            incarnation = _incarnation()
            self._retry(lambda: self.membership.announce_incarnation(incarnation), "telling peers we restarted")
        self._stop_child()
        self._warm_up()
        self.phase = Phase.RENDEZVOUS
        # A recovery for a peer's change starts a child that may fail again while that
        # peer's new server comes up: the same peer's fault, not our code's (see
        # _decide_after_peer_check), whichever way the restart came about.
        self.start_for_peer_change = not own_crash
        self.rendezvous_started = time.monotonic()
        self.loop.call_at(self.rendezvous_started + self.spec.discovery.rendezvous_timeout_s, "rendezvous-deadline")
        return self._step()

    # ---- the child --------------------------------------------------------------------------

    def _start_child(self, members: list[Member], generation: int) -> None:
        Path(self.spec.model_dir).mkdir(parents=True, exist_ok=True)
        env = launch.child_env(
            self.spec, self.role, self.me.index, members, generation, dict(os.environ), str(self.progress_file), self.secret_env
        )
        argv, env, cwd = self._child_command(env)
        log.info("generation %d: starting %s with TF_CONFIG %s", generation, " ".join(argv[1:4]), env.get(wire.ENV_TF_CONFIG, "(none)"))

        child = self.warm.take(argv, env, cwd) or Child(argv, env, cwd, self._post_child_exit)
        self.running = Running(child, members, generation, time.monotonic(), for_peer_change=self.start_for_peer_change)
        self.start_for_peer_change = False
        self.phase = Phase.RUNNING
        self.hang.restart(time.monotonic())
        self.loop.call_at(time.monotonic() + PROGRESS_TICK_S, "progress")

    def _warm_up(self) -> None:
        """Start the child now, while we wait for the cluster: its interpreter and TensorFlow
        load meanwhile; TF_CONFIG and the secrets follow in the handoff (warm.py)."""
        env = launch.waiting_env(self.spec, self.role, self.me.index, dict(os.environ), str(self.progress_file))
        self.warm.prepare(self.role, *self._child_command(env), self._post_child_exit)

    def _child_command(self, env: dict[str, str]) -> tuple[list[str], dict[str, str], str]:
        """argv, environment and working directory of our child, from its environment."""
        if self.job_env is not None:
            env.update(self.job_env.child_environ(env))
        python = self.job_env.python if self.job_env is not None else sys.executable
        argv = launch.child_argv(self.spec, self.role, self.alloc.tf_port, python, host=os.environ.get("NOMAD_IP_tf", ""))
        return argv, env, self.spec.entrypoint.workdir or str(self.alloc.task_dir)

    def _post_child_exit(self, pid: int, code: int) -> None:
        self.loop.post(Event(CHILD_EXIT, (pid, code)))

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

    def _stop_child(self) -> int | None:
        if not self.running:
            return None
        child = self.running.child
        return child.returncode if not child.alive() and child.returncode is not None else child.stop()

    def _on_deadline(self) -> int:
        """The job ran past recovery.deadline: it fails as a whole, recorded against the
        task whose exit decides the job, and every task stops."""
        deciding = next(
            ((role, i) for role, n in self.spec.counts.items() for i in range(n)
             if roles.completes_job(self.spec.strategy, role, i, self.spec.counts, self.spec.success)),
            (self.role, self.me.index),
        )
        state = self._job_state()
        if state is None:
            why = f"{DEADLINE_WHY} ({self.spec.recovery.deadline_s:.0f}s after submission)"
            state = policy.failed_state(deciding[0], deciding[1], 1, why)
            self._record(state, "marking the job failed (deadline)", deadline_s=60.0)
        log.error("the job's deadline passed (%s); stopping", state)
        self._stop_child()
        return 1 if deciding == (self.role, self.me.index) else 0

    # ---- progress and hang -----------------------------------------------------------------

    def _on_progress_tick(self) -> int | None:
        if self.phase is not Phase.RUNNING:
            return None
        self.loop.call_at(time.monotonic() + PROGRESS_TICK_S, "progress")
        now = time.monotonic()
        progress = read_progress(str(self.progress_file))
        if progress and progress != self.last_progress:
            self.hang.observe(progress.get("step"), now)
            self.last_progress = progress
            if now - self.published_at >= PROGRESS_PUBLISH_S:
                self.published_at = now
                try:
                    self.discovery.publish_progress({**progress, "role": self.role, "index": self.me.index})
                except ServerError:
                    pass  # progress is best effort
        if self.hang.hung(now):
            return self._guard(lambda: self._recover(f"no training step for {self.hang.timeout_s:.0f}s (hang)"))
        return None

    # ---- helpers ---------------------------------------------------------------------------

    def _bump(self, fingerprint: str) -> int:
        generation = self._retry(lambda: self.discovery.bump_generation(fingerprint), "moving to a new generation")
        return int(generation.get("generation", 1))

    def _job_state(self) -> str | None:
        try:
            return self._retry(self.discovery.job_state, "reading the job state", deadline_s=10.0)
        except ServerError:
            return None

    def _spend_budget(self) -> bool:
        """One recovery from the allocation's budget (recorded in the task directory, which
        Nomad keeps across restarts of the task); False when it is spent."""
        within = self.budget.spend(time.time())
        self._save_budget()
        return within

    def _save_budget(self) -> None:
        try:
            self.budget_file.write_text(self.budget.to_json())
        except OSError as exc:
            log.warning("could not record the restart budget in %s: %s", self.budget_file, exc)

    def _record(self, state: str, what: str, deadline_s: float | None = None) -> None:
        """Record the run's outcome. A decision is never dropped: while Consul is away it is
        retried until the job's deadline (at least a minute), and only then given up."""
        self._retry(lambda: self.discovery.set_job_state(state), what, deadline_s or self._record_budget_s())

    def _record_budget_s(self) -> float:
        """Seconds left until recovery.deadline (from the submission), at least 60."""
        if self.spec.submitted_at is None:
            return max(60.0, self.spec.recovery.deadline_s)
        return max(60.0, self.spec.submitted_at + self.spec.recovery.deadline_s - time.time())

    def _retry(self, call, what: str, deadline_s: float = 60.0):
        for attempt in retrying(deadline_s, give_up=lambda: self.loop.stop_requested):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    log.warning("Consul at %s: retrying %s (attempt %d)", self._consul_address(), what, attempt.retry_state.attempt_number)
                return call()
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    def _fetch_secrets(self) -> int | None:
        """Read the job's secrets once per task (one login, its renewers kept until we exit).
        A secret that cannot be had is a mistake a human must fix (or a Vault still away
        after the retry budget): the job is marked failed, naming the path, and we exit 1."""
        from nomadtf import vault as vault_api  # hvac only when the job has secrets

        if self.vault is None:
            self.vault = vault_api.VaultSession(self.spec.vault, on_error=log.warning, budget_s=server_retry_s())
        try:
            fetched = self.vault.fetch(list(self.spec.secrets), self.alloc.secrets_dir)
        except VaultError as exc:
            log.error("secrets: %s", exc)
            if roles.is_soft(self.role):
                return 1  # a side role's failure is its own (reported as a warning)
            self._record(policy.failed_state(self.role, self.me.index, 1, f"its secrets: {exc}"), "marking the job failed")
            return 1
        self.secret_env, self.secrets_read = fetched.env, True
        log.info("read %d secret(s) for the training process (%s)%s", len(self.spec.secrets), ", ".join(
            s.get("env") or f"file {s['file']}" for s in self.spec.secrets), "; leases renewed while we run" if fetched.leases else "")
        return None

    def _check_code(self) -> int | None:
        """An entrypoint script that is not there is a mistake no restart fixes: the job is
        marked failed naming the file (a side role only fails itself), and we exit 1."""
        entry = self.spec.entrypoint
        if entry.kind != "script" or self.role == "tensorboard" or not roles.runs_user_code(self.spec.strategy, self.role):
            return None
        workdir = Path(self.spec.entrypoint.workdir or self.alloc.task_dir)
        if (workdir / entry.target).is_file():
            return None
        why = f"its code: entrypoint.script {entry.target} not found in {workdir} (entrypoint.workdir)"
        log.error("%s", why)
        if not roles.is_soft(self.role):
            # Before the claim: our index is the one Nomad gave the allocation.
            self._record(policy.failed_state(self.role, self.alloc.alloc_index, 1, why), "marking the job failed")
        return 1

    def _open_session(self) -> None:
        """Our Consul session, retried for the server retry budget; a Consul still away after
        it is a failure Consul cannot hold: CannotRecord (exit 78) names the address."""
        budget = server_retry_s()
        try:
            self._retry(self.membership.open, "opening a Consul session", budget)
        except ServerError as exc:
            raise CannotRecord(
                f"{exc}; tried Consul at {self._consul_address()} for {budget:.0f}s: check discovery.consul_address "
                "(CONSUL_HTTP_ADDR), its scheme (https for a TLS-only port) and discovery.consul_ca_file"
            ) from None

    def _consul_address(self) -> str:
        http = getattr(self.discovery.consul, "http", None)
        return str(getattr(http, "base_uri", "")) or os.environ.get("CONSUL_HTTP_ADDR", "127.0.0.1:8500")


def server_retry_s() -> float:
    """How long a task retries a Consul or Vault it cannot reach (job.json `env`
    NOMADTF_SERVER_RETRY_S; 120 s by default)."""
    try:
        return max(1.0, float(os.environ.get(wire.ENV_SERVER_RETRY_S, wire.DEFAULT_SERVER_RETRY_S)))
    except ValueError:
        return wire.DEFAULT_SERVER_RETRY_S

def _incarnation() -> str:
    return uuid.uuid4().hex[:12]


def _describe_code(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


def spec_path(environ: dict[str, str]) -> Path:
    explicit = environ.get(wire.ENV_SPEC_FILE)
    if explicit:
        return Path(explicit)
    return Path(environ.get("NOMAD_TASK_DIR", ".")) / wire.SPEC_FILE


def run_task(role: str) -> int:
    spec = for_task(read_spec_file(spec_path(dict(os.environ))), dict(os.environ))
    alloc = AllocInfo.from_environ(dict(os.environ))
    grant = vault = None
    if spec.discovery.consul_token_path or spec.secrets:
        from nomadtf import vault as vault_api  # hvac only when the job reads Vault

        vault = vault_api.VaultSession(spec.vault, on_error=log.warning, budget_s=server_retry_s())  # one login per task
    try:
        if spec.discovery.consul_token_path:
            try:
                grant = vault_api.ConsulToken.read(vault, spec.discovery.consul_token_path)
            except ServerError as exc:
                # Without its Consul token the task cannot record the failure in Consul.
                raise CannotRecord(f"the tasks' Consul token ({spec.discovery.consul_token_path}): {exc}") from None
            log.info("Consul token read from Vault (%s)%s", grant.path, "; renewed while we run" if grant.lease else "")
        client = consul_client(token=grant.token if grant else None)
        discovery = ConsulDiscovery(spec.name, spec.namespace, client=client, run_id=spec.run_id)
        return Supervisor(spec, role, alloc, discovery, vault=vault).run()
    finally:
        if grant is not None:
            grant.close()
        if vault is not None:
            vault.close()
