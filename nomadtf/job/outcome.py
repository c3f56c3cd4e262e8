"""A run's one outcome, decided the same way by `nomadtf run`, `status` and `logs`. Pure.

    succeeded   its success policy was met: the task whose exit decides it recorded it   exit 0
    failed      a task recorded a permanent failure, or a slot failed more often than
                Nomad may reschedule it, or the job died with failed allocations, or a
                task exited 78 (a failure it could not record: Consul unreachable), or
                a docker task's image cannot be pulled (it never starts)                 exit 1
    stopped     from outside: `nomadtf stop`, `nomad job stop`, a purge, or another
                run of the same name (`--replace` from another shell)                      exit 4
    timed out   the run passed its `recovery.deadline`                                      exit 5
    lost        every task ended and nobody recorded why (nothing else fits)              exit 6

(exit 3 is `--timeout`: the follower gave up, the run goes on; 2 is a bad job.json.)

The tasks record succeeded / failed in the run's Consul state (`cluster/state`); that
record comes first. A job whose allocations all ended `complete` is *never* called
succeeded without it: a stopped job's tasks exit 0 on SIGTERM and Nomad marks them complete.
Side roles (evaluator, TensorBoard) never decide anything: their failures are warnings.

Usage:
    result = decide(job, allocs, recorded="succeeded", run_id="3f2a9c1e", reschedule_attempts=2)
    result.kind, result.exit_code        # "succeeded", 0
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nomadtf import roles, wire
from nomadtf.errors import CannotRecord
from nomadtf.job.answers import Allocation, Job

SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"
TIMED_OUT = "timed out"
LOST = "lost"

EXIT_CODES = {SUCCEEDED: 0, FAILED: 1, STOPPED: 4, TIMED_OUT: 5, LOST: 6}

# What a task records when the run passes recovery.deadline (inside its "failed: ..." state,
# so that every task treats it as a failure; `decide` tells it apart).
DEADLINE_WHY = "ran past recovery.deadline"

UNKNOWN = object()  # the recorded state could not be read (Consul away): decide nothing from it

# The recorded state of a permanent failure names the task that decided it.
_FAILED_SLOT = re.compile(r"^failed: (\w+)\[(\d+)\]")


def failed_state(role: str, index: int, code: int, why: str) -> str:
    """The job state a permanent failure records (read back by `failed_slot`)."""
    return f"failed: {role}[{index}] exited {code}, {why}"


def failed_slot(state: str | None) -> tuple[str, int] | None:
    """The (role, index) a recorded failure names; None for any other state."""
    match = _FAILED_SLOT.match(state or "")
    return (match[1], int(match[2])) if match else None



@dataclass(frozen=True)
class RunOutcome:
    kind: str
    reason: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}" if self.reason else self.kind


def latest_allocs(allocs: list[Allocation]) -> dict[tuple[str, int], Allocation]:
    """The newest allocation for every (role, index): replacements supersede what they replace."""
    latest: dict[tuple[str, int], Allocation] = {}
    for alloc in sorted(allocs, key=lambda a: a.create_index):
        latest[alloc.slot] = alloc
    return latest


def exited_cannot_record(alloc: Allocation) -> bool:
    """Whether a task of the allocation ended with CannotRecord's exit code: a failure it
    could not record in Consul (unreachable), which no restart of Nomad's would fix."""
    return any(event.type == "Terminated" and event.exit_code == CannotRecord.exit_code for _task, event in alloc.events())


# Nomad's docker driver reports an image it could not pull as a "Driver Failure" task event,
# "Failed to pull `IMAGE`: REASON" (drivers/docker/coordinator.go, recoverablePullError, in
# v1.6.1 as in 2.0). It calls most of them recoverable and retries for restart attempts ×
# reschedule attempts, so a mistyped image ends minutes later as "failed N times".
DRIVER_FAILURE = "Driver Failure"
_PULL_FAILED = re.compile(r"Failed to pull `([^`]*)`: (.*)", re.S)
# What a registry (or the daemon) answers for an image that is not there, or not for this
# client: no retry brings it.
_IMAGE_MISSING = re.compile(
    r"not found|does not exist|pull access denied|manifest unknown|unauthorized|denied|invalid reference format", re.I
)
# Any other pull failure (a registry away, a timeout) fails the run when Nomad's restart of
# the task could not pull either: that is seconds (recovery.restart_delay), not minutes.
PULL_TRIES = 2
PULL_FIX = "build it (`nomadtf dev image build`) or push it where the clients pull from"


@dataclass(frozen=True)
class PullFailure:
    """A docker task's image that its client could not pull."""

    image: str
    reason: str
    tries: int  # the allocation's pull failures so far

    @property
    def final(self) -> bool:
        return self.tries >= PULL_TRIES or bool(_IMAGE_MISSING.search(self.reason))


def pull_failure(alloc: Allocation) -> PullFailure | None:
    """The allocation's last image pull failure (its task events), None when it had none."""
    found = []
    for _task, event in alloc.events():
        if event.type != DRIVER_FAILURE:
            continue
        match = _PULL_FAILED.search(event.driver_error or event.display_message)
        if match:
            found.append((event.time, match[1], " ".join(match[2].split())))
    if not found:
        return None
    _time, image, reason = max(found)
    return PullFailure(image, reason, len(found))


def image_field(job: Mapping[str, Any], role: str, image: str) -> str:
    """The job.json field that names `image` for `role`: `driver.gpu_image` is the image of
    the roles with GPUs when it is set, `driver.image` every other role's. Told from the
    Nomad job: a GPU task's image that no task without GPUs uses is gpu_image's."""
    gpu_roles, plain_images = set(), set()
    for group in job.get("TaskGroups") or []:
        for task in group.get("Tasks") or []:
            if (task.get("Resources") or {}).get("Devices"):
                gpu_roles.add(group.get("Name"))
            else:
                plain_images.add((task.get("Config") or {}).get("image"))
    if role not in gpu_roles or image in plain_images:
        return "driver.image"
    return "driver.gpu_image" if plain_images else "driver.gpu_image (driver.image when gpu_image is not set)"


def describe_pull_failure(job: Mapping[str, Any], alloc: Allocation, failure: PullFailure) -> str:
    """"worker[0]: driver.image X could not be pulled on client N: REASON; build it …". Pure."""
    role, index = alloc.slot
    field = image_field(job, role, failure.image)
    return f"{role}[{index}]: {field} {failure.image} could not be pulled on client {alloc.short_node}: {failure.reason}; {PULL_FIX}"


def from_record(recorded: str | None) -> RunOutcome | None:
    """The outcome a task recorded, or None while nothing is recorded."""
    if recorded == wire.STATE_SUCCEEDED:
        return RunOutcome(SUCCEEDED)
    if recorded and recorded.startswith(wire.STATE_FAILED):
        reason = recorded.removeprefix(wire.STATE_FAILED).lstrip(": ")
        return RunOutcome(TIMED_OUT if DEADLINE_WHY in reason else FAILED, reason)
    return None


def decide(
    job: Job | None,
    allocs: list[Allocation],
    recorded: Any,
    run_id: str,
    reschedule_attempts: int,
) -> RunOutcome | None:
    """The run's outcome, or None while it is still going (or cannot be told yet).

    `job` is the job as Nomad has it now (None: purged), `allocs` this run's allocations,
    `recorded` the run's Consul state (a string, None, or UNKNOWN when unreadable).
    """
    if recorded is not UNKNOWN:
        told = from_record(recorded)
        if told and told.kind == SUCCEEDED and job is not None and not job.dead:
            # Succeeded; the run ends once every task has stopped and freed its capacity.
            ending = any(a.client_status in ("pending", "running") for a in latest_allocs(allocs).values())
            return None if ending else told
        if told:
            return told
    if job is None:
        return RunOutcome(STOPPED, "the job was purged from Nomad")
    if run_id and job.run_id and job.run_id != run_id:
        return RunOutcome(STOPPED, f"replaced by run {job.run_id} of the same job")
    if job.stop:
        return RunOutcome(STOPPED, "stopped from outside (nomadtf stop, nomad job stop, another run with --replace)")
    training = [a for a in allocs if not roles.is_soft(a.slot[0])]
    for alloc in sorted(training, key=lambda a: a.create_index):
        # A task that never starts records nothing: its image is the fault, not the code.
        failure = pull_failure(alloc)
        if failure and failure.final:
            return RunOutcome(FAILED, describe_pull_failure(job.document, alloc, failure))
    unrecorded = [a for a in training if exited_cannot_record(a)]
    if unrecorded:
        role, index = min(unrecorded, key=lambda a: a.create_index).slot
        return RunOutcome(
            FAILED, f"{role}[{index}] exited {CannotRecord.exit_code}: it failed and could not record why in Consul; its stderr says why"
        )
    failures: dict[tuple[str, int], int] = {}
    for alloc in training:
        # A `lost` allocation (its node went down) is replaced by Nomad whatever the
        # reschedule policy says: it spends none of the job's reschedule attempts.
        if alloc.client_status == "failed":
            failures[alloc.slot] = failures.get(alloc.slot, 0) + 1
    over = sorted(slot for slot, count in failures.items() if count > reschedule_attempts)
    if over:
        role, index = over[0]
        return RunOutcome(FAILED, f"{role}[{index}] failed {failures[over[0]]} times, more than recovery.reschedule_attempts ({reschedule_attempts}) allow")
    latest = {slot: a for slot, a in latest_allocs(training).items()}
    if job.dead and latest:
        broken = sorted(slot for slot, a in latest.items() if a.client_status in ("failed", "lost"))
        if broken:
            role, index = broken[0]
            return RunOutcome(FAILED, f"{role}[{index}] ended {latest[broken[0]].client_status} and Nomad will not replace it")
        if recorded is UNKNOWN:
            return None  # the record may say succeeded: wait until it can be read
        return RunOutcome(LOST, "every task ended without recording an outcome (see nomadtf logs)")
    return None
