"""A run registered suspended, and what state a registered run is in. Pure.

`nomadtf run` registers a run with its own token, in its own namespace, *suspended*: every
group at count 0, the counts it wants in the job's Meta, and one placeholder group
(`queued`, count 1) that no node can ever take. The placeholder keeps the job `pending`
in Nomad and in its UI (a batch job whose groups are all at 0 is `dead` at once, reads as
finished, and Nomad's job GC removes it after `job_gc_threshold`); its blocked evaluation
holds nothing. The admission controller resumes the run by scaling each group to its
wanted count (`POST /v1/job/:id/scale`, each call checked against the JobModifyIndex the
last one left) and the placeholder to 0 last, so the job never passes through `dead`.

States of a registered nomadtf run (`state`):

    PLAIN      registered as it is (no controller ran at submission): Nomad places it
    QUEUED     suspended, waiting for the controller
    ADMITTING  the controller has scaled some groups up, the placeholder not yet down
    ADMITTED   every group at its count (or scaled since), the placeholder at 0
    REFUSED    the controller gave up on it (never fits, forbidden): every group at 0,
               the placeholder at 0 (the job is dead); the reason is the placeholder's
               last scaling event

Usage:
    body = suspend(render_job(...), gang_timeout_s=30)
    state(job)                 # QUEUED
    Suspension.of(job).counts  # {"chief": 1, "worker": 2}
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PLACEHOLDER_GROUP = "queued"
PLACEHOLDER_TASK = "waits-for-admission"
META_ADMISSION = "nomadtf.admission"  # SUSPENDED: the run goes through the controller
META_COUNTS = "nomadtf.counts"  # JSON {"chief": 1, "worker": 2}: the counts the controller resumes
META_GANG_TIMEOUT = "nomadtf.gang_timeout"  # seconds the whole run has to be placed once admitted
META_READY_TIMEOUT = "nomadtf.ready_timeout"  # seconds its cluster has to form once placed (absent or 0: not watched)
META_REQUEUE_LIMIT = "nomadtf.requeue_limit"  # how often it may be requeued for not forming before it is refused
META_ELASTIC = "nomadtf.elastic"  # JSON {"worker": 1}: the fewest tasks of each elastic group (its count is the most)
DEFAULT_REQUEUE_LIMIT = 3
MAX_REQUEUE_LIMIT = 9  # the tries are counted in the placeholder's scaling events, of which Nomad keeps 20
SUSPENDED = "suspended"
MAX_GROUP_COUNT = 1000  # more allocations than any nomadtf run has a use for: a typo or a trick

PLAIN, QUEUED, ADMITTING, ADMITTED, REFUSED = "plain", "queued", "admitting", "admitted", "refused"

# No node carries this meta value. Node meta is part of Nomad's computed node class, so the
# placeholder's blocked evaluation wakes only when a node of a new class registers, not on
# every change of capacity anywhere (a constraint on ${node.unique.id} would).
PLACEHOLDER_CONSTRAINT = {"LTarget": "${meta.nomadtf_admission}", "RTarget": "never-placed", "Operand": "="}


class Malformed(ValueError):
    """A suspended run whose admission Meta cannot be read: the controller skips it and
    says why (admission status); it never acts on a guess."""


def placeholder_group() -> dict[str, Any]:
    """The group that keeps a suspended run pending; it never places, so it holds nothing."""
    task = {
        "Name": PLACEHOLDER_TASK,
        "Driver": "raw_exec",
        "Config": {"command": "/bin/true"},
        "Resources": {"CPU": 1, "MemoryMB": 10},
        "Meta": {META_ADMISSION: "placeholder: waits for the nomadtf admission controller; never runs"},
    }
    return {
        "Name": PLACEHOLDER_GROUP,
        "Count": 1,
        "Constraints": [dict(PLACEHOLDER_CONSTRAINT)],
        "Tasks": [task],
        "Meta": {META_ADMISSION: "this run waits in the admission queue (nomadtf status)"},
    }


def suspend(job: Mapping[str, Any], gang_timeout_s: float, ready_timeout_s: float = 0.0,
            requeue_limit: int = DEFAULT_REQUEUE_LIMIT, elastic: Mapping[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """`job` (the body of POST /v1/jobs) registered suspended: a copy, every group at 0,
    the wanted counts, the gang timeout (and the ready timeout with its requeue limit, when
    given; the elastic groups' minimums, when any) in Meta, the placeholder group added."""
    body = copy.deepcopy(dict(job))
    inner = body["Job"]
    counts = {group["Name"]: int(group.get("Count", 1)) for group in inner["TaskGroups"]}
    for group in inner["TaskGroups"]:
        group["Count"] = 0
    inner["TaskGroups"].append(placeholder_group())
    meta = dict(inner.get("Meta") or {})
    meta.update({META_ADMISSION: SUSPENDED, META_COUNTS: json.dumps(counts, sort_keys=True), META_GANG_TIMEOUT: f"{gang_timeout_s:g}"})
    if ready_timeout_s > 0:
        meta.update({META_READY_TIMEOUT: f"{ready_timeout_s:g}", META_REQUEUE_LIMIT: str(int(requeue_limit))})
    if elastic:
        meta[META_ELASTIC] = json.dumps(dict(elastic), sort_keys=True)
    inner["Meta"] = meta
    return body


@dataclass(frozen=True)
class Suspension:
    """What a suspended run's Meta asks of the controller, checked against its own groups."""

    counts: dict[str, int]
    gang_timeout_s: float
    ready_timeout_s: float = 0.0  # 0: whether its cluster forms is not watched
    requeue_limit: int = DEFAULT_REQUEUE_LIMIT
    minimum: dict[str, int] = field(default_factory=dict)  # elastic groups: the fewest tasks (counts: the most)

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> Suspension | None:
        """None for a run registered as it is; Malformed when the Meta cannot be trusted."""
        inner = job.get("Job", job)
        meta = inner.get("Meta") or {}
        if meta.get(META_ADMISSION) != SUSPENDED:
            return None
        try:
            counts = json.loads(meta.get(META_COUNTS) or "")
        except ValueError as exc:
            raise Malformed(f"Meta {META_COUNTS} is not JSON") from exc
        groups = {g.get("Name") for g in inner.get("TaskGroups") or []} - {PLACEHOLDER_GROUP}
        if not isinstance(counts, dict) or not counts:
            raise Malformed(f"Meta {META_COUNTS} is not an object of group counts")
        for name, count in counts.items():
            if name not in groups:
                raise Malformed(f"Meta {META_COUNTS} names a group the job does not have ({str(name)[:40]!r})")
            if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_GROUP_COUNT:
                raise Malformed(f"Meta {META_COUNTS}: {name} is not a count from 0 to {MAX_GROUP_COUNT}")
        if PLACEHOLDER_GROUP not in {g.get("Name") for g in inner.get("TaskGroups") or []}:
            raise Malformed(f"the job has no {PLACEHOLDER_GROUP!r} group")
        try:
            gang = float(meta.get(META_GANG_TIMEOUT) or 30)
        except ValueError as exc:
            raise Malformed(f"Meta {META_GANG_TIMEOUT} is not a number of seconds") from exc
        if not math.isfinite(gang):
            raise Malformed(f"Meta {META_GANG_TIMEOUT} is not a number of seconds")
        try:
            ready = float(meta.get(META_READY_TIMEOUT) or 0)
            limit = int(meta.get(META_REQUEUE_LIMIT) or DEFAULT_REQUEUE_LIMIT)
        except ValueError as exc:
            raise Malformed(f"Meta {META_READY_TIMEOUT} or {META_REQUEUE_LIMIT} is not a number") from exc
        # At most 9: Nomad keeps a group's last 20 scaling events, and each try leaves two.
        if not math.isfinite(ready) or ready < 0 or not 0 <= limit <= MAX_REQUEUE_LIMIT:
            raise Malformed(f"Meta {META_READY_TIMEOUT} is not a number of seconds, or {META_REQUEUE_LIMIT} not from 0 to {MAX_REQUEUE_LIMIT}")
        minimum = _minimum(meta.get(META_ELASTIC), counts)
        # Bounded: no run holds the controller's reservation longer than ten minutes.
        return cls(dict(counts), min(max(gang, 1.0), 600.0), min(ready, 86400.0), limit, minimum)


def _minimum(raw: Any, counts: Mapping[str, int]) -> dict[str, int]:
    """The elastic groups' minimums (Meta nomadtf.elastic), each from 1 to its group's count."""
    if not raw:
        return {}
    try:
        minimum = json.loads(raw)
    except ValueError as exc:
        raise Malformed(f"Meta {META_ELASTIC} is not JSON") from exc
    if not isinstance(minimum, dict):
        raise Malformed(f"Meta {META_ELASTIC} is not an object of group minimums")
    for name, least in minimum.items():
        if name not in counts or not isinstance(least, int) or isinstance(least, bool) or not 1 <= least <= counts[name]:
            raise Malformed(f"Meta {META_ELASTIC}: {str(name)[:40]!r} is not a group of the run with a minimum from 1 to its count")
    return dict(minimum)


def shrinkable(counts: Mapping[str, int], minimum: Mapping[str, int]) -> int:
    """How many tasks an elastic run may give up from `counts` (0: none)."""
    return sum(max(0, count - minimum.get(group, count)) for group, count in counts.items())


def shrunk(counts: Mapping[str, int], minimum: Mapping[str, int], by: int) -> dict[str, int]:
    """`counts` with `by` tasks fewer, taken from the elastic groups in turn (the largest
    first), never below their minimums."""
    out = dict(counts)
    for _ in range(by):
        room = [(out[g] - minimum[g], g) for g in sorted(minimum) if out.get(g, 0) > minimum[g]]
        if not room:
            break
        out[max(room)[1]] -= 1
    return out


def group_counts(job: Mapping[str, Any]) -> dict[str, int]:
    inner = job.get("Job", job)
    return {g.get("Name", ""): int(g.get("Count") or 0) for g in inner.get("TaskGroups") or []}


def state(job: Mapping[str, Any]) -> str:
    """PLAIN, QUEUED, ADMITTING, ADMITTED or REFUSED (see the module's table). A suspended
    run whose Meta cannot be read is judged by its counts alone."""
    inner = job.get("Job", job)
    if (inner.get("Meta") or {}).get(META_ADMISSION) != SUSPENDED:
        return PLAIN
    counts = group_counts(inner)
    placeholder = counts.pop(PLACEHOLDER_GROUP, 0)
    up = any(count > 0 for count in counts.values())
    if placeholder > 0:
        return ADMITTING if up else QUEUED
    return ADMITTED if up else REFUSED


def is_waiting(job: Mapping[str, Any]) -> bool:
    """Queued, or being admitted: nothing of it may be counted as a run's outcome yet."""
    return state(job) in (QUEUED, ADMITTING)


def wanted_job(job: Mapping[str, Any], counts: Mapping[str, int]) -> dict[str, Any]:
    """The job as it runs once admitted (its groups at `counts`, without the placeholder):
    what capacity checks measure."""
    inner = dict(job.get("Job", job))
    inner["TaskGroups"] = [
        {**g, "Count": int(counts.get(g.get("Name", ""), 0))} for g in inner.get("TaskGroups") or [] if g.get("Name") != PLACEHOLDER_GROUP
    ]
    return inner


def without_placeholder(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [g for g in groups if g.get("Name") != PLACEHOLDER_GROUP]
