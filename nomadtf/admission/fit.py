"""Whether a whole run fits the cluster now, and whether it ever could. Pure.

The controller cannot ask Nomad's plan (that needs `submit-job`, which its token does not
have), so it packs the run itself, on what Nomad reports: each node's resources (less what
its operator reserved) and the allocations that hold resources on it. The packing is first
fit, largest allocation first, and keeps the rules Nomad would: the job's datacenters and
node pool, `distinct_hosts` (job or group) and static ports (two allocations that want one
port never share a node, nor take a port another allocation holds).

"Never" is the same packing on the nodes as they would be with only the long-lived work
left on them (allocations of service and system jobs — the admission controller's own
replicas among them — which no batch run's end gives back), counting nodes that are down,
drained or ineligible for less than a grace period as coming back. Constraints other than
those are Nomad's to evaluate: a run they rule out is placed in part, given back after its
gang timeout and requeued (gang.py), never started half.

Usage:
    rooms = node_rooms(nodes, allocs)                  # NomadAPI.nodes(), cluster_allocations()
    ask = RunAsk.of(wanted_job)
    if place(ask, rooms): ...           # rooms now hold it (for the next run in line)
    why = never(ask, nodes, allocs, now=time.time())   # "" when it could fit some day
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, Node
from nomadtf.job.capacity import Resources

LONG_LIVED_TYPES = ("service", "system", "sysbatch")
DOWN_GRACE_S = 600.0  # a node away longer than this is no longer counted on for "never"


@dataclass
class Room:
    """What one node has free now (mutable: `place` takes from it)."""

    node_id: str
    name: str
    datacenter: str
    pool: str
    cpu: int
    memory: int
    devices: dict[str, int]
    ports: set[int] = field(default_factory=set)
    jobs: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (namespace, job) -> its groups here
    usable: bool = True  # ready and eligible: it may take a run now


@dataclass(frozen=True)
class Slot:
    """One allocation a run places."""

    group: str
    resources: Resources
    ports: frozenset[int] = frozenset()
    distinct: bool = False  # no two allocations of its group (or of its job) on one node


@dataclass(frozen=True)
class RunAsk:
    """Everything a whole run asks, and where it may go."""

    namespace: str
    job_id: str
    datacenters: tuple[str, ...]
    pool: str
    slots: tuple[Slot, ...]
    job_distinct: bool = False

    @property
    def needs(self) -> Resources:
        return capacity.total(s.resources for s in self.slots)

    def with_counts(self, counts: Mapping[str, int]) -> RunAsk:
        """The same run with at most `counts` allocations of each group (an elastic run's
        smaller sizes)."""
        seen: dict[str, int] = {}
        slots = []
        for slot in self.slots:
            seen[slot.group] = seen.get(slot.group, 0) + 1
            if seen[slot.group] <= counts.get(slot.group, 0):
                slots.append(slot)
        return replace(self, slots=tuple(slots))

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> RunAsk:
        """From a job as it runs (suspension.wanted_job): each group's Count of allocations."""
        inner = job.get("Job", job)
        job_distinct = _distinct(inner.get("Constraints"))
        slots: list[Slot] = []
        for group in inner.get("TaskGroups") or []:
            resources = capacity.group_resources(group)
            ports = frozenset(_static_ports(group))
            distinct = _distinct(group.get("Constraints"))
            slots += [Slot(group.get("Name", ""), resources, ports, distinct)] * int(group.get("Count") or 0)
        return cls(
            inner.get("Namespace") or "default", inner.get("ID", ""), tuple(inner.get("Datacenters") or ["*"]),
            inner.get("NodePool") or "default", tuple(slots), job_distinct,
        )  # fmt: skip


def _distinct(constraints: Any) -> bool:
    return any((c or {}).get("Operand") == "distinct_hosts" and str((c or {}).get("RTarget", "true")).lower() != "false" for c in constraints or [])


def _static_ports(group: Mapping[str, Any]) -> list[int]:
    networks = list(group.get("Networks") or [])
    for task in group.get("Tasks") or []:
        networks += (task.get("Resources") or {}).get("Networks") or []
    return [int(p["Value"]) for n in networks for p in (n or {}).get("ReservedPorts") or [] if p.get("Value")]


def may_return(node: Node, now: float, down_since: Mapping[str, float] | None = None) -> bool:
    """Usable; drained or ineligible (an operator's step, undone as easily); or down or
    disconnected for less than DOWN_GRACE_S (a reboot, a client restart). Nomad's node list
    says no time of the last status change: `down_since` (node id -> when its watcher first
    saw it away) does; without it a node away counts as coming back (errs towards waiting)."""
    if node.status == "ready":
        return True
    since = (down_since or {}).get(node.id)
    return since is None or now - since < DOWN_GRACE_S


def node_rooms(nodes: Iterable[Node], allocs: Iterable[Allocation], *, keep: Callable[[Allocation], bool] | None = None) -> list[Room]:
    """Every node (GET /v1/nodes?resources=true) with what the holding allocations (GET
    /v1/allocations?resources=true) leave free on it; `keep(alloc)` picks the allocations
    that count (default: every one that holds resources)."""
    keep = keep or (lambda alloc: alloc.holds_resources)
    rooms = {}
    for node in nodes:
        rooms[node.id] = Room(node.id, node.name, node.datacenter, node.node_pool, node.offers.cpu, node.offers.memory,
                              dict(node.offers.devices), usable=node.usable)  # fmt: skip
    for alloc in allocs:
        room = rooms.get(alloc.node_id)
        if room is None or not keep(alloc):
            continue
        held = alloc.resources
        room.cpu -= held.cpu
        room.memory -= held.memory
        for name, count in held.devices.items():
            room.devices[name] = room.devices.get(name, 0) - count
        room.ports |= alloc.reserved_ports
        room.jobs.setdefault(alloc.key, set()).add(alloc.task_group)
    return list(rooms.values())


def _takes(room: Room, ask: RunAsk) -> bool:
    if not any(fnmatch.fnmatchcase(room.datacenter, pattern) for pattern in ask.datacenters):
        return False
    return ask.pool == "all" or room.pool == ask.pool


def place(ask: RunAsk, rooms: list[Room], *, usable_only: bool = True, taken: list[tuple[str, Slot]] | None = None) -> bool:
    """Pack every slot of `ask` into `rooms` (first fit, largest first). True: `rooms` now
    hold the run (and `taken`, when given, lists (node id, slot) for each); False: they are
    left as they were."""
    candidates = [r for r in rooms if _takes(r, ask) and (r.usable or not usable_only)]
    saved = [(r, r.cpu, r.memory, dict(r.devices), set(r.ports), {k: set(v) for k, v in r.jobs.items()}) for r in candidates]
    key = (ask.namespace, ask.job_id)
    placed: list[tuple[str, Slot]] = []
    order = sorted(ask.slots, key=lambda s: (sum(s.resources.devices.values()), s.resources.cpu, s.resources.memory), reverse=True)
    for slot in order:
        want = slot.resources
        for room in candidates:
            groups = room.jobs.get(key, set())
            if ask.job_distinct and groups or slot.distinct and slot.group in groups:
                continue
            if slot.ports & room.ports or room.cpu < want.cpu or room.memory < want.memory:
                continue
            free = {name: n for name, n in room.devices.items() if n > 0}
            if not capacity._take_devices(free, want.devices):
                continue
            room.devices.update(free)
            room.cpu -= want.cpu
            room.memory -= want.memory
            room.ports |= slot.ports
            room.jobs.setdefault(key, set()).add(slot.group)
            placed.append((room.node_id, slot))
            break
        else:
            for room, cpu, memory, devices, ports, jobs in saved:
                room.cpu, room.memory, room.devices, room.ports, room.jobs = cpu, memory, devices, ports, jobs
            return False
    if taken is not None:
        taken.extend(placed)
    return True


def fits(ask: RunAsk, rooms: list[Room]) -> bool:
    """Whether `place` would take `ask`; `rooms` are left as they are."""
    return place(ask, copy.deepcopy(rooms))


def later_rooms(nodes: Iterable[Node], allocs: Iterable[Allocation]) -> list[Room]:
    """The usable nodes as they will be once the batch work on them ends: only long-lived
    allocations (service, system) stay. A walk builds it once and places every reservation
    in it in turn, so that two reservations never count on the same room."""
    return node_rooms([n for n in nodes if n.usable], allocs, keep=lambda a: a.holds_resources and a.job_type in LONG_LIVED_TYPES)


def reserve(ask: RunAsk, rooms: list[Room], later: list[Room]) -> bool:
    """Hold back in `rooms` (what is free now) what `ask` will take once the batch work on
    its nodes ends: it is packed into `later` (later_rooms, shared by the walk's reservations),
    and each slot is taken from its node's free room now, below zero where that room is still
    in use. Nothing new then starts in what the run waits for. False: it does not fit even
    then (nothing held back)."""
    taken: list[tuple[str, Slot]] = []
    if not place(ask, later, taken=taken):
        return False
    hold_back(rooms, taken)
    return True


def hold_back(rooms: list[Room], taken: Iterable[tuple[str, Slot]]) -> None:
    """Take each (node id, slot) from that node's free room, below zero where it is in use."""
    by_id = {room.node_id: room for room in rooms}
    for node_id, slot in taken:
        room = by_id.get(node_id)
        if room is None:
            continue
        room.cpu -= slot.resources.cpu
        room.memory -= slot.resources.memory
        room.ports |= slot.ports
        for asked, count in slot.resources.devices.items():
            for name in sorted(room.devices):
                if count and capacity.device_matches(asked, name):
                    took = min(count, max(room.devices[name], 0)) or count  # below zero once none is free
                    room.devices[name] -= took
                    count -= took


def never(
    ask: RunAsk, nodes: Iterable[Node], allocs: Iterable[Allocation], now: float,
    down_since: Mapping[str, float] | None = None,
) -> str:
    """Why `ask` could not fit even once every batch run ended ("" when it could): only
    long-lived allocations stay, on the nodes that are usable or may come back."""
    rooms = node_rooms([n for n in nodes if may_return(n, now, down_since)], allocs, keep=lambda a: a.holds_resources and a.job_type in LONG_LIVED_TYPES)
    mine = [r for r in rooms if _takes(r, ask)]
    if not mine:
        return f"no client node in datacenters {', '.join(ask.datacenters)} of node pool {ask.pool}"
    if place(ask, mine, usable_only=False):
        return ""
    largest_cpu, largest_memory = max(r.cpu for r in mine), max(r.memory for r in mine)
    for slot in ask.slots:
        if slot.resources.cpu > largest_cpu:
            return f"a {slot.group} allocation asks cpu {slot.resources.cpu} MHz; the most any node has beside long-running jobs is {largest_cpu} MHz"
        if slot.resources.memory > largest_memory:
            return f"a {slot.group} allocation asks memory {slot.resources.memory} MB; the most any node has beside long-running jobs is {largest_memory} MB"
    spread = [s for s in ask.slots if s.distinct or s.ports or ask.job_distinct]
    if spread and len(spread) > len(mine):
        return f"{len(spread)} allocations must each have a node of their own (distinct_hosts or a static port); {len(mine)} node(s) can take the job"
    needs = ask.needs
    return (
        f"the whole run asks {needs.describe()}; the {len(mine)} node(s) it may use cannot hold it beside the long-running jobs "
        "on them, even when every batch run has ended"
    )
