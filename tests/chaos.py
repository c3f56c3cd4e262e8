"""Seeded chaos for the soak tests (tests/stack/test_soak.py): one seed gives the whole fault
schedule; `Soak` applies each fault to a job training on the local stack, waits until the
job has recovered from it and measures what it cost.

    seed = chaos.seed()                      # NOMADTF_SOAK_SEED, else a random one
    plan = chaos.schedule(seed, "parameter_server", {"chief": 1, "worker": 2, "ps": 1}, 10, 6, 50)
    soak = chaos.Soak("digits-ab12cd", "parameter_server", counts, 50, stack.restart_consul)
    soak.wait_for_training(240)
    record = soak.inject(plan[0], bound_s=180)

The kinds of fault:
    kill-child   kill -9 of one task's child (a bare TensorFlow server or the user's code)
    kill-task    kill -9 of one `nomadtf task` supervisor (its child dies with it)
    hang         SIGSTOP of one child's process group: nothing but hang detection ends it
    consul       the Consul agent restarted (a -dev agent: catalog, KV and sessions are gone)

The producer is the task whose stdout counts the training (`step=N`, `resumed from step
N`, `final_accuracy=`): the chief under parameter_server, worker 0 under
multi_worker_mirrored. Timing is the machine's; only the schedule replays from the seed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from nomadtf import roles
from nomadtf.errors import NomadtfError
from nomadtf.servers.consul import ConsulDiscovery
from tests import faults
from tests.helpers import allocations, task_log

KILL_CHILD, KILL_TASK, HANG, CONSUL = "kill-child", "kill-task", "hang", "consul"
POLL_S = 0.3
# A whole-job fault (hang detection, a Consul restart) is slow to recover from; these keep
# a schedule from being mostly that.
MOST_PER_KIND = {HANG: 2, CONSUL: 2}
# Drawn after the kinds every schedule has: kills are what a real cluster sees most.
WEIGHTS = {KILL_CHILD: 5, KILL_TASK: 3, HANG: 1, CONSUL: 1}


def seed() -> int:
    """NOMADTF_SOAK_SEED (to replay a run), else a fresh random one."""
    given = os.environ.get("NOMADTF_SOAK_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**32)


@dataclass(frozen=True)
class Fault:
    kind: str
    role: str = ""  # the target slot; empty for consul
    index: int = 0
    after_steps: int = 0  # fires once training went this far past the previous recovery
    delay_s: float = 0.0  # and then this much later: a random point inside a logging interval

    @property
    def target(self) -> str:
        if self.kind == CONSUL:
            return "consul agent"
        return f"{self.role}[{self.index}] {'nomadtf task' if self.kind == KILL_TASK else 'child'}"


def producer(strategy: str) -> tuple[str, int]:
    return ("chief", 0) if strategy == "parameter_server" else ("worker", 0)


def hang_targets(strategy: str, counts: dict[str, int]) -> list[tuple[str, int]]:
    """Where hang detection is the one thing that can end a hang: the task that reports
    progress. Elsewhere it is not what ends it: a stopped bare TensorFlow server (ps,
    parameter-server worker) reports nothing and blocks a restarted chief before its first
    report; a stopped MWMS worker 1 makes worker 0's TensorFlow give up on its heartbeats
    (exit 1, with no peer change to explain it) before worker 0's hang clock runs out."""
    return [producer(strategy)]


def restarts_producer(strategy: str, fault: Fault) -> bool:
    """Does this fault restart the producer's code (so that training resumes from a
    checkpoint)? Its own crash does; a peer's new incarnation does where roles.TABLE says so."""
    if fault.kind == CONSUL:
        return False
    role, index = producer(strategy)
    if (fault.role, fault.index) == (role, index):
        return True
    return roles.rule(strategy, role).restarts_for(fault.role, roles.RESTARTED)


def schedule(seed_: int, strategy: str, counts: dict[str, int], faults_: int, extra: int, log_every: int) -> list[Fault]:
    """`faults_` faults that cover every kind (a child of every role, a supervisor, Consul,
    a hang), in a random order, then `extra` more drawn by WEIGHTS for a soak that has time
    left. Everything random here comes from `seed_` (and the strategy)."""
    rng = random.Random(f"{seed_}:{strategy}")
    slots = [(role, i) for role in sorted(counts) for i in range(counts[role])]

    def draw(kind: str, role: str | None = None) -> Fault:
        if kind == CONSUL:
            target = ("", 0)
        elif role is not None:
            target = (role, rng.randrange(counts[role]))
        else:
            target = rng.choice(hang_targets(strategy, counts) if kind == HANG else slots)
        return Fault(kind, *target, rng.randint(1, 6) * log_every, round(rng.uniform(0.0, 2.5), 2))

    # A child of every role (one index drawn), one supervisor, Consul, one hang.
    plan = [draw(KILL_CHILD, role) for role in sorted(counts)] + [draw(KILL_TASK), draw(CONSUL), draw(HANG)]
    while len(plan) < faults_ + extra:
        kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        if sum(f.kind == kind for f in plan) < MOST_PER_KIND.get(kind, faults_ + extra):
            plan.append(draw(kind))
    head = plan[:faults_]
    rng.shuffle(head)
    return head + plan[faults_:]


# ---- reading the producer's stdout -----------------------------------------------------------

_EVENT = re.compile(r"^(?:step=(\d+)|resumed from step (\d+))", re.MULTILINE)


def events(stdout: str) -> list[tuple[str, int]]:
    """("step", n) and ("resumed", n) in the order the producer printed them."""
    return [("step", int(s)) if s else ("resumed", int(r)) for s, r in _EVENT.findall(stdout)]


def current_step(stdout: str) -> int:
    """The latest step line (after a resume the step goes back: not the maximum)."""
    steps = [n for kind, n in events(stdout) if kind == "step"]
    return steps[-1] if steps else 0


def resumes_with_loss(history: list[tuple[str, int]]) -> list[tuple[int, int]]:
    """(resumed-from step, steps lost) for every restart: lost = the last step printed
    before the restart minus the step it resumed from."""
    out, last = [], 0
    for kind, n in history:
        if kind == "resumed":
            out.append((n, max(0, last - n)))
        last = n
    return out


def step_regressions(history: list[tuple[str, int]]) -> list[tuple[int, int]]:
    """Step lines that went back without a resume in between (two producers, or a lost
    log): (previous, next)."""
    out, last = [], None
    for kind, n in history:
        if kind == "step" and last is not None and n < last:
            out.append((last, n))
        last = n
    return out


def time_to_step(stdout: str, needs_resume: bool) -> bool:
    """Has a training step been printed in this stretch of stdout (after a resume in it,
    where the fault restarts the producer)?"""
    seen_resume = not needs_resume
    for kind, _n in events(stdout):
        if kind == "resumed":
            seen_resume = True
        elif seen_resume:
            return True
    return False


# What a fault may replace, as docs/guide/recovery.md promises it: strategy -> the role whose
# process failed -> the other roles whose code restarts with it. Written out here, not read
# from nomadtf.roles: the soak checks the product's table, it does not copy it. (A
# parameter-server worker that moves restarts the chief too, but no soak fault moves one:
# Nomad restarts a task in its own allocation, on its own port.)
RESTART_WITH = {
    "parameter_server": {"chief": set(), "worker": set(), "ps": {"chief"}},
    "multi_worker_mirrored": {"chief": {"chief", "worker"}, "worker": {"chief", "worker"}},
}


def may_replace(strategy: str, counts: dict[str, int], fault: Fault) -> set[tuple[str, str, int]]:
    """The processes ((kind, role, index), as faults.processes names them) that `fault` may
    replace: the target's child, its `nomadtf task` too for a kill-task, and the children of
    the roles that restart with the target's. A Consul restart replaces nothing."""
    if fault.kind == CONSUL:
        return set()
    allowed = {("child", fault.role, fault.index)}
    if fault.kind == KILL_TASK:
        allowed.add(("task", fault.role, fault.index))
    for role in RESTART_WITH[strategy][fault.role]:
        allowed |= {("child", role, i) for i in range(counts.get(role, 0))}
    return allowed


def replaced(before: dict, after: dict) -> set:
    """The slots whose process is another one (or gone) after than before."""
    return {key for key, pid in before.items() if after.get(key) != pid}


# ---- the job as it runs ----------------------------------------------------------------------


@dataclass
class FaultRecord:
    number: int
    kind: str
    target: str
    at_s: float  # since the first training step
    step: int  # the step line last printed when the fault hit
    next_step_s: float | None = None  # until the producer printed a training step again
    recovered_s: float | None = None  # until the job was whole and one checkpoint further
    steps_lost: int = 0
    producer_restarted: bool = False
    hang_detected: bool | None = None
    # What the fault replaced beyond what may_replace allows (processes), and the
    # allocations Nomad restarted beyond the killed `nomadtf task`'s: both empty, or the
    # fault restarted a task the recovery policy should have left running. None where the
    # training ended before the job was whole again (nothing to compare).
    replaced_beyond_policy: list[str] | None = None
    nomad_restarted_beyond_policy: list[str] | None = None


def leftover_processes(job_id: str) -> dict[int, str]:
    """Every process whose environment says it belongs to the job: pid -> state and command."""
    found = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("NOMAD_JOB_ID") == job_id:
                found[proc.pid] = f"{proc.status()} {' '.join(proc.cmdline())[:160]}"
        except psutil.Error:
            continue
    return found


def session_names(job_id: str) -> list[str]:
    """GET /v1/session/list, the job's sessions (`nomadtf <job> <role> <alloc8>`)."""
    return sorted(s["Name"] for s in ConsulDiscovery(job_id).sessions())


class Soak:
    def __init__(self, job_id: str, strategy: str, counts: dict[str, int], checkpoint_every: int,
                 restart_consul: Callable[[], None], alive: Callable[[], bool] = lambda: True):
        self.job_id = job_id
        self.strategy = strategy
        self.counts = counts
        self.checkpoint_every = checkpoint_every
        self.restart_consul = restart_consul
        self.alive = alive  # False once whoever follows the job has given up: stop waiting
        self.started = 0.0
        self.recovered_step = 0
        self.records: list[FaultRecord] = []

    def producer_stdout(self) -> str:
        role, index = producer(self.strategy)
        name = f"{self.job_id}.{role}[{index}]"
        allocs = sorted((a for a in allocations(self.job_id) if a["Name"] == name), key=lambda a: a["CreateIndex"])
        return "\n".join(task_log(a["ID"], role) for a in allocs)

    def hang_reports(self) -> int:
        """How often a task logged a hang (its stderr: `... (hang)`)."""
        return sum(task_log(a["ID"], a["TaskGroup"], "stderr").count("(hang)") for a in allocations(self.job_id))

    def whole(self) -> bool:
        """Every slot has its `nomadtf task` and its child, none of them stopped, and every
        task holds a Consul session."""
        procs = faults.processes(self.job_id)
        slots = [(role, i) for role, n in self.counts.items() for i in range(n)]
        if any((kind, role, i) not in procs for kind in ("task", "child") for role, i in slots):
            return False
        try:
            if any(psutil.Process(pid).status() == psutil.STATUS_STOPPED for pid in procs.values()):
                return False
            return len({name for name in session_names(self.job_id)}) == len(slots)
        except (psutil.Error, NomadtfError):
            return False

    def check_not_failed(self) -> None:
        """A job marked failed never recovers: say so at once, not after the bound."""
        try:
            state = ConsulDiscovery(self.job_id).job_state()
        except NomadtfError:
            return  # Consul restarting: look again on the next poll
        if state and state.startswith("failed"):
            raise AssertionError(f"the job was marked {state!r}")

    def wait_for_end(self, timeout: float) -> None:
        """Until whoever follows the job is done with it."""
        deadline = time.monotonic() + timeout
        while self.alive():
            self.check_not_failed()
            if time.monotonic() > deadline:
                raise AssertionError(f"the job did not end within {timeout:.0f}s")
            time.sleep(1.0)

    def _wait(self, check: Callable[[], object], timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_not_failed()
            if not self.alive():
                raise AssertionError(f"the job ended while waiting for {what}")
            value = check()
            if value:
                return value
            time.sleep(POLL_S)
        tail = "\n".join(self.producer_stdout().splitlines()[-15:])
        raise AssertionError(f"no {what} within {timeout:.0f}s; the producer's stdout ends:\n{tail}")

    def wait_for_training(self, timeout: float) -> None:
        self.recovered_step = self._wait(lambda: current_step(self.producer_stdout()), timeout, "first training step")
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def inject(self, fault: Fault, bound_s: float) -> FaultRecord:
        """Wait for the fault's moment, apply it, and wait (at most `bound_s`) until the job
        is whole again and training went one checkpoint past that point."""
        self._wait(lambda: current_step(self.producer_stdout()) >= self.recovered_step + fault.after_steps,
                   bound_s, f"step {self.recovered_step + fault.after_steps}")
        time.sleep(fault.delay_s)
        before = self.producer_stdout()
        hangs_before = self.hang_reports() if fault.kind == HANG else 0
        record = FaultRecord(len(self.records) + 1, fault.kind, fault.target, round(self.elapsed(), 1), current_step(before))
        kind = "task" if fault.kind == KILL_TASK else "child"
        pid = 0 if fault.kind == CONSUL else self._wait(
            lambda: faults.processes(self.job_id).get((kind, fault.role, fault.index)), 30, f"the {fault.target}")
        procs_before, restarts_before = faults.processes(self.job_id), faults.restarts(self.job_id)
        hit_at = time.monotonic()
        # In a thread: a Consul restart takes seconds, and training goes on meanwhile.
        failures: list[BaseException] = []
        applying = threading.Thread(target=self._apply, args=(fault, pid, failures), name="chaos-fault")
        applying.start()
        needs_resume = restarts_producer(self.strategy, fault)
        whole_at_step = None
        deadline = hit_at + bound_s
        while True:
            if failures:
                raise failures[0]
            self.check_not_failed()
            stdout = self.producer_stdout()
            after = stdout[len(before):]
            if record.next_step_s is None and time_to_step(after, needs_resume):
                record.next_step_s = round(time.monotonic() - hit_at, 1)
            if record.next_step_s is not None and "final_accuracy=" in after:
                break  # the training ended: nothing left to recover
            if not self.alive():
                raise AssertionError(f"the job ended during fault {record.number} ({fault.kind} {fault.target})")
            if record.next_step_s is not None and whole_at_step is None and not applying.is_alive() and self.whole():
                whole_at_step = current_step(stdout)
            if whole_at_step is not None and current_step(stdout) >= whole_at_step + self.checkpoint_every:
                self._compare(record, fault, procs_before, restarts_before)
                break
            if time.monotonic() > deadline:
                tail = "\n".join(stdout.splitlines()[-15:])
                raise AssertionError(
                    f"fault {record.number} ({fault.kind} {fault.target}): not recovered within {bound_s:.0f}s "
                    f"(next step after {record.next_step_s}s, whole at step {whole_at_step}); "
                    f"processes {faults.processes(self.job_id)}; the producer's stdout ends:\n{tail}"
                )
            time.sleep(POLL_S)
        applying.join()
        if failures:
            raise failures[0]
        record.recovered_s = round(time.monotonic() - hit_at, 1)
        losses = resumes_with_loss(events(stdout))[len(resumes_with_loss(events(before))):]
        record.producer_restarted = bool(losses)
        record.steps_lost = max((lost for _r, lost in losses), default=0)
        if fault.kind == HANG:
            record.hang_detected = self.hang_reports() > hangs_before
        self.recovered_step = current_step(stdout)
        self.records.append(record)
        return record

    def _compare(self, record: FaultRecord, fault: Fault, procs_before: dict, restarts_before: dict[str, int]) -> None:
        """Record what the fault replaced beyond the recovery policy: processes, and Nomad
        restarts (only a killed `nomadtf task` is Nomad's to restart; a child's supervisor
        restarts it in place)."""
        beyond = replaced(procs_before, faults.processes(self.job_id)) - may_replace(self.strategy, self.counts, fault)
        record.replaced_beyond_policy = sorted(f"{role}[{index}] {kind}" for kind, role, index in beyond)
        killed_alloc = f"{self.job_id}.{fault.role}[{fault.index}]" if fault.kind == KILL_TASK else None
        restarts_after = faults.restarts(self.job_id)
        record.nomad_restarted_beyond_policy = sorted(
            name for name, count in restarts_after.items()
            if name != killed_alloc and name in restarts_before and count != restarts_before[name]
        )

    def _apply(self, fault: Fault, pid: int, failures: list[BaseException]) -> None:
        try:
            if fault.kind == CONSUL:
                self.restart_consul()
            elif fault.kind == HANG:
                os.killpg(os.getpgid(pid), signal.SIGSTOP)
            else:
                os.kill(pid, signal.SIGKILL)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failures.append(exc)


# ---- the outcome -----------------------------------------------------------------------------


def summary(records: list[FaultRecord]) -> dict:
    nexts = [r.next_step_s for r in records if r.next_step_s is not None]
    return {
        "faults": len(records),
        "by_kind": {k: sum(r.kind == k for r in records) for k in (KILL_CHILD, KILL_TASK, HANG, CONSUL)},
        "next_step_s_median": round(statistics.median(nexts), 1) if nexts else None,
        "next_step_s_worst": max(nexts, default=None),
        "steps_lost_worst": max((r.steps_lost for r in records), default=0),
        "steps_lost_total": sum(r.steps_lost for r in records),
    }


def table(records: list[FaultRecord]) -> str:
    head = f"{'#':>3} {'at s':>6}  {'kind':<10} {'target':<22} {'step':>6} {'next step s':>11} {'recovered s':>11} {'lost':>5}  restarted"
    rows = [head]
    for r in records:
        nxt = "-" if r.next_step_s is None else f"{r.next_step_s:.1f}"
        rows.append(f"{r.number:>3} {r.at_s:>6.1f}  {r.kind:<10} {r.target:<22} {r.step:>6} {nxt:>11} "
                    f"{r.recovered_s or 0:>11.1f} {r.steps_lost:>5}  {'yes' if r.producer_restarted else 'no'}")
    return "\n".join(rows)


def as_dicts(records: list[FaultRecord]) -> list[dict]:
    return [asdict(r) for r in records]


def report_dir() -> Path:
    path = Path(__file__).resolve().parent / ".soak"
    path.mkdir(exist_ok=True)
    return path
