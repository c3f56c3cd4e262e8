"""Every decision the in-allocation runtime makes, as pure functions and small value
objects. No I/O, no clock: callers pass `now`. Unit-tested exhaustively
(tests/unit/runtime/test_policy.py).

What restarts when is the role table (nomadtf.roles); this module applies it:
    peer change              restart our child if roles.TABLE says so for that peer's
                             role and the kind of change (moved / restarted)
    own child exits 0        the role that completes the job marks it succeeded; others end
    own child crashed        (signal, exit >= 128, or any code not listed as permanent)
                             restart in place with a new incarnation, peers are told
    own child hung           the same as a crash in every respect
    permanent exit code      the job is marked failed; every other task stops its child and
                             exits 0 (it did nothing wrong); the failed slot, restarted by
                             Nomad, exits 1 at once: nothing retries the code
    side role's child fails  (evaluator, TensorBoard; any code, permanent ones included)
                             restart in place within the budget, then exit 1 and leave it
                             to Nomad: training is never stopped, restarted or failed by it
    job succeeded            bare servers stop now; user code gets a grace period
    job failed               the same, seen by a running task
    budget                   at most restart_attempts recoveries per restart_interval
    our index taken          another allocation holds our slot (Nomad replaced ours while
                             our node was cut off and our session lapsed): stop our child
                             and exit 0; two tasks of one index never run
    no session renewal       for one TTL (cut off from Consul): stop our child before our
                             slot can pass to a replacement (fence); once Consul answers,
                             start it again if the slot is still ours or free, end if taken
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from nomadtf import roles, wire
from nomadtf.job.outcome import failed_slot
from nomadtf.tfconfig import Member

STRAGGLER_GRACE_S = 30.0  # after success, how long user code that is still running gets
PEER_FAULT_WINDOW_S = 60.0  # a child restarted for a peer change that fails within this: the peer's fault
PEER_SETTLE_S = 15.0  # after a child failure, how long to look for a peer change that explains it


def fingerprint(members: Iterable[Member]) -> str:
    return json.dumps(sorted((m.role, m.index, m.address, m.alloc_id) for m in members))


@dataclass(frozen=True, order=True)
class PeerChange:
    role: str
    index: int
    kind: str  # roles.MOVED or roles.RESTARTED


def peer_changes(old: Iterable[Member], new: Iterable[Member]) -> list[PeerChange]:
    """How each slot of two complete clusters changed. A slot in only one of them (the role
    was scaled, `nomadtf scale`) joined or left: for whoever depends on it, that is a move."""
    before = {(m.role, m.index): m for m in old}
    after = {(m.role, m.index): m for m in new}
    out = []
    for slot in sorted(set(before) | set(after)):
        a, b = before.get(slot), after.get(slot)
        if a is None or b is None:
            out.append(PeerChange(slot[0], slot[1], roles.MOVED))
        elif a.address != b.address:
            out.append(PeerChange(slot[0], slot[1], roles.MOVED))
        elif a.alloc_id != b.alloc_id:
            out.append(PeerChange(slot[0], slot[1], roles.RESTARTED))
    return out


def must_restart(strategy: str, role: str, index: int, old: Iterable[Member], new: Iterable[Member]) -> bool:
    """Does this task's child need the new cluster? roles.TABLE decides, per peer role and kind."""
    rule = roles.rule(strategy, role)
    return any(
        rule.restarts_for(change.role, change.kind)
        for change in peer_changes(old, new)
        if (change.role, change.index) != (role, index)
    )


# ---- our slot -----------------------------------------------------------------------------


class SlotState(enum.Enum):
    HELD = "held"  # our allocation holds it under our current session
    LOST = "lost"  # nobody holds it, or our allocation under a session Consul forgot: claim it back
    TAKEN = "taken"  # another allocation holds it: ours was replaced


def slot_state(holder_alloc: str | None, holder_session: str | None, alloc_id: str, session: str | None) -> SlotState:
    """What the slot of our index, as Consul shows it, means for us."""
    if holder_alloc is None:
        return SlotState.LOST
    if holder_alloc != alloc_id:
        return SlotState.TAKEN
    return SlotState.HELD if holder_session == session and session else SlotState.LOST


# Fencing: a task cut off from Consul stops its code once no renewal of its session has
# gone through for one TTL, timed from when the last accepted renewal was *sent*. Consul
# lets a session lapse no sooner than one TTL after the last renewal it received (its
# contract), in fact after two (it arms its timer at 2 x TTL); only then may a replacement
# take our slot, and it still has to claim, rendezvous and start. So the stop (SIGTERM, then
# SIGKILL after child.STOP_GRACE_S = 8 s) ends by TTL + 9 s = 24 s, before the 30 s at which
# Consul lets the session go. Never sooner than one TTL: a short Consul restart (a few
# seconds, after which the task claims its slot again with a new session) must not stop
# anybody. The session's lock delay would widen the margin past Consul's contract, but it
# would delay every handover of a slot too (discovery.open_session says why it is 0).
FENCE_AFTER_S = float(wire.TASK_SESSION_TTL_S)


def must_fence(renewed_at: float | None, now: float, after_s: float = FENCE_AFTER_S) -> bool:
    """Whether our code must stop now: no renewal of our session went through for
    `after_s` (`renewed_at`: monotonic, when the last accepted one was sent; None: no session yet)."""
    return renewed_at is not None and now - renewed_at >= after_s


# ---- exits ---------------------------------------------------------------------------------


class ExitClass(enum.Enum):
    OK = "ok"
    PERMANENT = "permanent"  # the code is broken: retrying cannot help
    RETRYABLE = "retryable"  # crash, signal, OOM, or a code the job did not call permanent


def exit_class(code: int, permanent: Iterable[int]) -> ExitClass:
    if code == 0:
        return ExitClass.OK
    if code < 0 or code >= 128:
        return ExitClass.RETRYABLE
    return ExitClass.PERMANENT if code in set(permanent) else ExitClass.RETRYABLE


class Act(enum.Enum):
    SUCCEED_JOB = "mark the job succeeded, exit 0"
    EXIT_OK = "exit 0"
    RECOVER = "restart our child in place (a crash: new incarnation)"
    RECOVER_WITH_CLUSTER = "restart our child with the new cluster"
    CHECK_PEERS = "look for a peer change that explains the failure"
    FAIL_JOB = "mark the job failed, exit with the child's code"
    GIVE_UP = "recovery budget spent: exit 1, Nomad's policy applies"
    STOP_NOW = "stop our child, exit 0"
    STOP_AFTER_GRACE = "let our code finish, stop it after the grace period"
    STOP_JOB_FAILED = "the job failed elsewhere: stop our child, exit 0"
    EXIT_FAILED = "the job failed here: exit 1 without starting anything"
    NOTHING = "nothing"


def on_child_exit(code: int, permanent: Iterable[int], job_state: str | None, completes_job: bool, soft: bool = False) -> Act:
    """The first decision after our child exited. A side role's (`soft`, roles.is_soft)
    failure, whatever its code, is restarted on its own budget: it never fails the job."""
    if job_state == "succeeded":
        return Act.EXIT_OK
    kind = exit_class(code, permanent)
    if kind is ExitClass.OK:
        return Act.SUCCEED_JOB if completes_job else Act.EXIT_OK
    if code < 0 or soft:
        # Killed by a signal from outside: our own crash. A side role: no peer explains it,
        # and no code of its fails training. Neither waits for peers.
        return Act.RECOVER
    return Act.CHECK_PEERS


def after_peer_check(code: int, permanent: Iterable[int], peer_changed: bool) -> Act:
    """The decision once we know whether a peer moved or lost its state meanwhile."""
    if peer_changed:
        return Act.RECOVER_WITH_CLUSTER
    return Act.FAIL_JOB if exit_class(code, permanent) is ExitClass.PERMANENT else Act.RECOVER


def on_job_state(state: str | None, strategy: str, role: str, completes_job: bool, succeeded_for_s: float) -> Act:
    """What the job's recorded state means for a task whose child still runs."""
    if state is None:
        return Act.NOTHING
    if state.startswith("failed"):
        return Act.STOP_JOB_FAILED
    if state != "succeeded" or completes_job:
        return Act.NOTHING
    if not roles.runs_user_code(strategy, role):
        return Act.STOP_NOW
    return Act.STOP_AFTER_GRACE if succeeded_for_s < STRAGGLER_GRACE_S else Act.STOP_NOW


def on_start(state: str | None, role: str, index: int) -> Act:
    """A supervisor that starts (or restarts) after the job already ended starts nothing.
    `index` is NOMAD_ALLOC_INDEX: before the claim it is the best guess of our slot."""
    if state == "succeeded":
        return Act.EXIT_OK
    if state and state.startswith("failed"):
        return Act.EXIT_FAILED if failed_slot(state) == (role, index) else Act.EXIT_OK
    return Act.NOTHING


# ---- budgets, debounce, hang ---------------------------------------------------------------


@dataclass
class RestartBudget:
    """At most `attempts` recoveries in any `window_s` per allocation, whoever performs them:
    our supervisor restarting its child in place, or Nomad restarting the task (a killed
    supervisor). Times are wall-clock seconds, so that the record (`to_json`) outlives the
    process: a supervisor that Nomad restarts reads what its predecessors spent."""

    attempts: int
    window_s: float
    spent: list[float] = field(default_factory=list)

    def spend(self, now: float) -> bool:
        """Record one recovery at `now`; False when that one is over the budget."""
        self.spent = [t for t in self.spent if now - t < self.window_s] + [now]
        return len(self.spent) <= self.attempts

    def to_json(self) -> str:
        return json.dumps({"spent": self.spent})

    @classmethod
    def from_json(cls, attempts: int, window_s: float, text: str | None) -> RestartBudget:
        """The budget as recorded (`text` None: a fresh allocation); a damaged record is a fresh one."""
        try:
            spent = [float(t) for t in json.loads(text)["spent"]] if text else []
        except (ValueError, KeyError, TypeError):
            spent = []
        return cls(attempts, window_s, spent)


@dataclass
class Debounce:
    """A change counts once the same value has been seen continuously for `hold_s`
    (consul-template's wait). Anything else in between, an incomplete cluster included,
    starts the clock again; so does acting on it (`reset`)."""

    hold_s: float
    value: str | None = None
    since: float = 0.0

    def observe(self, value: str, now: float) -> bool:
        if value != self.value:
            self.value, self.since = value, now
            return self.hold_s <= 0
        return now - self.since >= self.hold_s

    def due(self) -> float | None:
        """When a pending value will have held long enough (a timer for the loop)."""
        return None if self.value is None else self.since + self.hold_s

    def reset(self) -> None:
        self.value, self.since = None, 0.0


@dataclass
class HangClock:
    """No training step for `timeout_s` is a hang. Only code that reports progress can be
    judged: silence from the start is not a hang."""

    timeout_s: float
    step: int | None = None
    changed_at: float = 0.0
    # The code said its training loop is over (`progress.done()`): a final evaluation, saving
    # the model and TensorFlow's own shutdown report no step and take what they take.
    finished: bool = False

    def observe(self, step: int | None, now: float) -> None:
        if step is not None and step != self.step:
            self.step, self.changed_at = step, now

    def finish(self) -> None:
        self.finished = True

    def restart(self, now: float) -> None:
        """A new child: it has the whole timeout again, and must report before it is judged."""
        self.step, self.changed_at, self.finished = None, now, False

    def hung(self, now: float) -> bool:
        return self.step is not None and not self.finished and now - self.changed_at > self.timeout_s

    def due(self) -> float | None:
        return None if self.step is None or self.finished else self.changed_at + self.timeout_s
