"""What a job asks of the cluster and what the cluster holds, in CPU, memory and devices. Pure.

The inputs are a rendered job (Nomad's JSON, POST /v1/jobs) and Nomad's answers as views
(answers.Node.offers: what a node offers; answers.Allocation.resources: what it holds).
Admission uses it for two things: whether a job could fit on the cluster were it empty
(`fits_when_empty`: "never" against "not now"), and the words a queued run shows (what it
needs, what is free, who holds it).

Usage:
    asks = job_asks(job)                       # one Ask per allocation the job places
    nodes = node_capacities(api.nodes(), job)   # the nodes that could take the job
    fits_when_empty(asks, nodes)               # False: no amount of waiting places it
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# Allocations in these client states hold their resources. One Nomad was told to stop still
# holds them until its client reports it ended (Nomad's ClientTerminalStatus): plans count
# it until then, so a stop frees capacity when the tasks have ended, not when it is asked.
HOLDING_CLIENT_STATES = ("pending", "running", "unknown")


@dataclass(frozen=True)
class Resources:
    """CPU in MHz, memory in MB, devices by name ("nvidia/gpu/Tesla-V100" offered,
    "nvidia/gpu" asked: see `device_matches`)."""

    cpu: int = 0
    memory: int = 0
    devices: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: Resources) -> Resources:
        devices = dict(self.devices)
        for name, count in other.devices.items():
            devices[name] = devices.get(name, 0) + count
        return Resources(self.cpu + other.cpu, self.memory + other.memory, devices)

    def times(self, count: int) -> Resources:
        return Resources(self.cpu * count, self.memory * count, {k: v * count for k, v in self.devices.items()})

    def describe(self) -> str:
        """'cpu 3380 MHz, memory 1800 MB, nvidia/gpu x2'"""
        parts = [f"cpu {self.cpu} MHz", f"memory {self.memory} MB"]
        parts += [f"{name} x{count}" for name, count in sorted(self.devices.items()) if count]
        return ", ".join(parts)


def total(items: Iterable[Resources]) -> Resources:
    out = Resources()
    for item in items:
        out = out + item
    return out


@dataclass(frozen=True)
class Ask:
    """One allocation of one task group: the sum of its tasks' resources."""

    group: str
    resources: Resources


def task_resources(resources: Mapping[str, Any]) -> Resources:
    """A rendered task's `Resources` (CPU, MemoryMB, Devices[{Name, Count}])."""
    devices: dict[str, int] = {}
    for device in resources.get("Devices") or []:
        devices[device["Name"]] = devices.get(device["Name"], 0) + int(device.get("Count", 1))
    return Resources(int(resources.get("CPU") or 0), int(resources.get("MemoryMB") or 0), devices)


def group_resources(group: Mapping[str, Any]) -> Resources:
    return total(task_resources(task.get("Resources") or {}) for task in group.get("Tasks") or [])


def job_asks(job: Mapping[str, Any]) -> list[Ask]:
    """Every allocation the job places: Count of each group. `job` is either the body of
    POST /v1/jobs ({"Job": ...}) or the job itself."""
    inner = job.get("Job", job)
    asks = []
    for group in inner.get("TaskGroups") or []:
        asks += [Ask(group["Name"], group_resources(group))] * int(group.get("Count", 1))
    return asks


def job_needs(job: Mapping[str, Any]) -> Resources:
    """The whole job's resources, every allocation together."""
    return total(ask.resources for ask in job_asks(job))


def device_matches(asked: str, offered: str) -> bool:
    """Nomad's rule for a device name: "gpu" (type), "nvidia/gpu" (vendor/type) or
    "nvidia/gpu/<model>" (all three) against an offered "vendor/type/name"."""
    vendor, type_, name = (offered.split("/", 2) + ["", ""])[:3]
    parts = asked.split("/")
    if len(parts) == 1:
        return parts[0] == type_
    if len(parts) == 2:
        return parts == [vendor, type_]
    return parts == [vendor, type_, name]


@dataclass(frozen=True)
class NodeCapacity:
    """What one node offers allocations: its resources less what its operator reserved."""

    node_id: str
    name: str
    resources: Resources


class OffersRoom(Protocol):
    """A client node as this module reads it (answers.Node, which builds on this module's
    Resources, is one)."""

    id: str
    name: str
    datacenter: str
    node_pool: str
    offers: Resources

    @property
    def usable(self) -> bool: ...


def _takes_jobs_of(node: OffersRoom, job: Mapping[str, Any]) -> bool:
    """A ready, eligible node in one of the job's datacenters (globs, as Nomad 1.5+ reads
    them) and its node pool ("all": any)."""
    if not node.usable:
        return False
    if not any(fnmatch.fnmatchcase(node.datacenter, pattern) for pattern in job.get("Datacenters") or ["*"]):
        return False
    pool = job.get("NodePool") or "default"
    return pool == "all" or node.node_pool == pool


def node_capacities(nodes: Iterable[OffersRoom], job: Mapping[str, Any]) -> list[NodeCapacity]:
    """The nodes that could ever take `job`'s allocations, by datacenter, pool and status.
    Constraints are not evaluated here (Nomad's plan did that): a node they rule out still
    counts, so the check errs towards "wait" rather than "never"."""
    inner = job.get("Job", job)
    return [NodeCapacity(n.id, n.name, n.offers) for n in nodes if _takes_jobs_of(n, inner)]


def cluster_capacity(nodes: Iterable[NodeCapacity]) -> Resources:
    return total(node.resources for node in nodes)


def _take_devices(free: dict[str, int], asked: Mapping[str, int]) -> bool:
    """Take `asked` from `free` (offered name -> count) in place; False, untouched, when it
    does not fit. Each ask takes from one offered group, as Nomad assigns one device group
    per request."""
    taken: list[tuple[str, int]] = []
    for name, count in asked.items():
        group = next((g for g, n in sorted(free.items()) if device_matches(name, g) and n >= count), None)
        if group is None:
            for g, n in taken:
                free[g] += n
            return False
        free[group] -= count
        taken.append((group, count))
    return True


def fits_when_empty(asks: Iterable[Ask], nodes: Iterable[NodeCapacity]) -> bool:
    """Whether every allocation fits on the nodes were nothing else running: first fit,
    largest allocation first, over CPU, memory and devices. First fit can miss a packing
    that exists, so this is used only to say "never" where even that simple packing fails
    on an empty cluster; Nomad's own placement is no better at it."""
    free = [[node.resources.cpu, node.resources.memory, dict(node.resources.devices)] for node in nodes]
    for ask in sorted(asks, key=lambda a: (sum(a.resources.devices.values()), a.resources.cpu, a.resources.memory), reverse=True):
        want = ask.resources
        for slot in free:
            if slot[0] >= want.cpu and slot[1] >= want.memory and _take_devices(slot[2], want.devices):
                slot[0] -= want.cpu
                slot[1] -= want.memory
                break
        else:
            return False
    return True


def largest_node(nodes: Iterable[NodeCapacity]) -> Resources:
    """The most CPU and the most memory any one node offers (not necessarily one node's)."""
    nodes = list(nodes)
    return Resources(max((n.resources.cpu for n in nodes), default=0), max((n.resources.memory for n in nodes), default=0))


def short_of(needs: Resources, free: Resources) -> list[str]:
    """The dimensions where `free` is less than `needs`: ["cpu", "nvidia/gpu"]."""
    out = []
    if needs.cpu > free.cpu:
        out.append("cpu")
    if needs.memory > free.memory:
        out.append("memory")
    for name, count in sorted(needs.devices.items()):
        offered = sum(n for g, n in free.devices.items() if device_matches(name, g))
        if count > offered:
            out.append(name)
    return out


def shortfall(needs: Resources, free: Resources) -> Resources:
    """How much of `needs` `free` lacks, per dimension (zero where it has enough); devices by
    the asked name, against every offered group it matches."""
    devices = {}
    for name, count in sorted(needs.devices.items()):
        offered = sum(n for g, n in free.devices.items() if device_matches(name, g))
        if count > offered:
            devices[name] = count - offered
    return Resources(max(0, needs.cpu - free.cpu), max(0, needs.memory - free.memory), devices)


def subtract(capacity: Resources, used: Resources) -> Resources:
    """What is left of `capacity` once `used` is taken (never below zero)."""
    devices = {name: max(0, count - used.devices.get(name, 0)) for name, count in capacity.devices.items()}
    return Resources(max(0, capacity.cpu - used.cpu), max(0, capacity.memory - used.memory), devices)
