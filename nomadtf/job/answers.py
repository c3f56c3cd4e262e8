"""Nomad's answers in nomadtf's words: small read-only views of an allocation (with its
tasks' states and their events), an evaluation (and why it placed none of a group), a plan's
answer, a client node, a listed job, a whole job, the answer to a job's write and a group's
scaling event, built from Nomad's JSON by
`from_api`. The Nomad adapter (servers/nomad.py) builds them; everything above it reads
attributes, never Nomad's PascalCase keys. Pure.

Only what nomadtf reads is kept; a key Nomad leaves out reads as its zero value, as Go's
JSON encoder would have written it (an allocation's namespace and desired status as Nomad's
defaults, "default" and "run").

Usage:
    alloc = Allocation.from_api(json_of_GET_v1_allocation)
    alloc.slot, alloc.client_status, alloc.restarts        # ("worker", 1), "running", 0
    [event.type for event in alloc.events()]
    held_by_job(allocs)     # (namespace, job) -> Resources its allocations hold now
    node = Node.from_api(one_of_GET_v1_nodes_resources_true)
    node.usable, node.offers                               # True, Resources(cpu, memory, devices)
    stub = JobStub.from_api(one_of_GET_v1_jobs_meta_true)
    stub.key, stub.run_id, stub.ran                       # ("team-a", "digits"), "r-1f3a", {"failed": 0, ...}

    job = Job.from_api(json_of_GET_v1_job_id)
    job.status, job.stop, job.run_id, job.modify_index     # "running", False, "r-1f3a", 412
    JobWrite.from_api(json_of_POST_v1_jobs).eval_id

A whole job's groups stay Nomad's JSON (`Job.document`): it is the document nomadtf rendered
and registers again (suspension.py reads and rewrites its counts), and that document is the
point there; its state (status, stop, version, Meta) is read as the view's attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from nomadtf import wire
from nomadtf.job.capacity import HOLDING_CLIENT_STATES, Resources


@dataclass(frozen=True)
class TaskEvent:
    """One event of a task (`TaskStates.<task>.Events[]`)."""

    type: str
    time: int = 0  # ns since the epoch
    display_message: str = ""
    exit_code: int = 0
    driver_error: str = ""

    @classmethod
    def from_api(cls, event: Mapping[str, Any]) -> TaskEvent:
        return cls(
            type=str(event.get("Type") or ""),
            time=int(event.get("Time") or 0),
            display_message=str(event.get("DisplayMessage") or ""),
            exit_code=int(event.get("ExitCode") or 0),
            driver_error=str(event.get("DriverError") or ""),
        )

    @property
    def text(self) -> str:
        """What the Nomad UI shows for it: its message, else its type."""
        return self.display_message or self.type


@dataclass(frozen=True)
class TaskState:
    """One task of an allocation (`TaskStates.<task>`)."""

    state: str = ""  # pending, running, dead
    restarts: int = 0
    events: tuple[TaskEvent, ...] = ()

    @classmethod
    def from_api(cls, state: Mapping[str, Any]) -> TaskState:
        return cls(
            state=str(state.get("State") or ""),
            restarts=int(state.get("Restarts") or 0),
            events=tuple(TaskEvent.from_api(e) for e in state.get("Events") or []),
        )


@dataclass(frozen=True)
class Port:
    """A port Nomad reserved for the allocation's group (`AllocatedResources.Shared.Ports[]`)."""

    label: str
    value: int
    host_ip: str = ""


@dataclass(frozen=True)
class Allocation:
    """An allocation as `GET /v1/job/:id/allocations` (a stub), `GET /v1/allocation/:id` or
    `GET /v1/allocations?resources=true` answers it: only the full one has ports, only the
    last two its resources."""

    id: str = ""
    name: str = ""  # "<job>.<group>[<index>]"
    task_group: str = ""
    job_id: str = ""
    namespace: str = wire.DEFAULT_NAMESPACE
    job_type: str = ""  # service, batch, system, sysbatch
    job_version: int = 0
    node_id: str = ""
    node_name: str = ""
    client_status: str = ""  # pending, running, complete, failed, lost, unknown
    desired_status: str = "run"  # run, stop, evict
    create_index: int = 0
    create_time: int = 0  # ns since the epoch
    modify_time: int = 0
    task_states: Mapping[str, TaskState] = field(default_factory=dict)
    ports: tuple[Port, ...] = ()
    reserved_ports: frozenset[int] = frozenset()  # every port value it holds on its node, dynamic or static
    resources: Resources = field(default_factory=Resources)  # what its tasks hold: CPU, memory, devices

    @classmethod
    def from_api(cls, alloc: Mapping[str, Any]) -> Allocation:
        allocated = alloc.get("AllocatedResources") or {}
        shared = allocated.get("Shared") or {}
        ports = tuple(Port(str(p.get("Label") or ""), int(p.get("Value") or 0), str(p.get("HostIP") or "")) for p in shared.get("Ports") or [])
        static = [int(p.get("Value") or 0) for network in shared.get("Networks") or [] for p in (network or {}).get("ReservedPorts") or []]
        return cls(
            id=str(alloc.get("ID") or ""),
            name=str(alloc.get("Name") or ""),
            task_group=str(alloc.get("TaskGroup") or ""),
            job_id=str(alloc.get("JobID") or ""),
            namespace=str(alloc.get("Namespace") or wire.DEFAULT_NAMESPACE),
            job_type=str(alloc.get("JobType") or ""),
            job_version=int(alloc.get("JobVersion") or 0),
            node_id=str(alloc.get("NodeID") or ""),
            node_name=str(alloc.get("NodeName") or ""),
            client_status=str(alloc.get("ClientStatus") or ""),
            desired_status=str(alloc.get("DesiredStatus") or "run"),
            create_index=int(alloc.get("CreateIndex") or 0),
            create_time=int(alloc.get("CreateTime") or 0),
            modify_time=int(alloc.get("ModifyTime") or 0),
            task_states={task: TaskState.from_api(state) for task, state in (alloc.get("TaskStates") or {}).items()},
            ports=ports,
            reserved_ports=frozenset(v for v in [*(p.value for p in ports), *static] if v),
            resources=_task_resources(allocated.get("Tasks") or {}),
        )

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, job id): whose allocation it is."""
        return self.namespace, self.job_id

    @property
    def holds_resources(self) -> bool:
        """Whether its client status holds its node's resources (pending, running, unknown)."""
        return self.client_status in HOLDING_CLIENT_STATES

    @property
    def slot(self) -> tuple[str, int]:
        """("worker", 1) from the name "digits.worker[1]"; (task group, 0) for another name."""
        head, _, rest = self.name.rpartition("[")
        if head and rest.endswith("]") and rest[:-1].isdigit():
            return head.rpartition(".")[2], int(rest[:-1])
        return self.task_group or "?", 0

    @property
    def restarts(self) -> int:
        """Nomad's restarts of the allocation's tasks, in all."""
        return sum(state.restarts for state in self.task_states.values())

    @property
    def short_node(self) -> str:
        """The client's name, else the first 8 characters of its id."""
        return self.node_name or (self.node_id or "?")[:8]

    def events(self) -> Iterator[tuple[str, TaskEvent]]:
        """(task, event) for every event of every task, task by task."""
        for task, state in self.task_states.items():
            for event in state.events:
                yield task, event

    def port_address(self, label: str) -> str | None:
        """"host:port" of the port labelled `label` (the full allocation only)."""
        for port in self.ports:
            if port.label == label and port.value:
                return f"{port.host_ip or '127.0.0.1'}:{port.value}"
        return None


def held_by_job(allocs: Iterable[Allocation]) -> dict[tuple[str, str], Resources]:
    """(namespace, job) -> what its allocations hold now, for every job that holds anything."""
    out: dict[tuple[str, str], Resources] = {}
    for alloc in allocs:
        if alloc.holds_resources:
            out[alloc.key] = out.get(alloc.key, Resources()) + alloc.resources
    return out


def _task_resources(tasks: Mapping[str, Any]) -> Resources:
    """What an allocation's tasks hold (`AllocatedResources.Tasks`): CPU shares, memory MB,
    and each device kind ("vendor/type/name") by the count of its instances."""
    out = Resources()
    for task in tasks.values():
        devices: dict[str, int] = {}
        for device in task.get("Devices") or []:
            name = f"{device.get('Vendor')}/{device.get('Type')}/{device.get('Name')}"
            devices[name] = devices.get(name, 0) + len(device.get("DeviceIDs") or [])
        out = out + Resources(int((task.get("Cpu") or {}).get("CpuShares") or 0), int((task.get("Memory") or {}).get("MemoryMB") or 0), devices)
    return out


def _counts(raw: Mapping[str, Any] | None) -> dict[str, int]:
    return {str(k): int(v or 0) for k, v in (raw or {}).items()}


@dataclass(frozen=True)
class AllocMetric:
    """Why the scheduler placed none of a group (`FailedTGAllocs.<group>` of an evaluation
    or a plan, Nomad's AllocMetric): how many nodes it looked at, how many it filtered and
    by what, how many were full and of what."""

    nodes_evaluated: int = 0
    nodes_available: int = 0  # in the job's datacenters, summed
    nodes_filtered: int = 0
    nodes_exhausted: int = 0
    constraint_filtered: Mapping[str, int] = field(default_factory=dict)  # constraint -> nodes it filtered
    class_filtered: Mapping[str, int] = field(default_factory=dict)  # node class -> nodes filtered, whatever filtered them
    dimension_exhausted: Mapping[str, int] = field(default_factory=dict)  # "cpu", "memory", "devices: …" -> nodes
    quota_exhausted: tuple[str, ...] = ()
    coalesced_failures: int = 0  # further allocations of the group that failed the same way

    @classmethod
    def from_api(cls, metric: Mapping[str, Any]) -> AllocMetric:
        return cls(
            nodes_evaluated=int(metric.get("NodesEvaluated") or 0),
            nodes_available=sum(_counts(metric.get("NodesAvailable")).values()),
            nodes_filtered=int(metric.get("NodesFiltered") or 0),
            nodes_exhausted=int(metric.get("NodesExhausted") or 0),
            constraint_filtered=_counts(metric.get("ConstraintFiltered")),
            class_filtered=_counts(metric.get("ClassFiltered")),
            dimension_exhausted=_counts(metric.get("DimensionExhausted")),
            quota_exhausted=tuple(str(q) for q in metric.get("QuotaExhausted") or ()),
            coalesced_failures=int(metric.get("CoalescedFailures") or 0),
        )

    @classmethod
    def of_groups(cls, failed: Mapping[str, Any] | None) -> dict[str, AllocMetric]:
        """FailedTGAllocs (group -> AllocMetric, or null) as views."""
        return {str(group): cls.from_api(metric or {}) for group, metric in (failed or {}).items()}


@dataclass(frozen=True)
class PlanResult:
    """What `POST /v1/job/:id/plan` answers: the job's diff, what the scheduler would do to
    each group, and the groups it could not place."""

    diff_type: str = "None"  # "None", "Added", "Edited", …
    updates: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # group -> {"Place": 2, "Ignore": 0, …}
    failed_groups: Mapping[str, AllocMetric] = field(default_factory=dict)

    @classmethod
    def from_api(cls, result: Mapping[str, Any]) -> PlanResult:
        updates = (result.get("Annotations") or {}).get("DesiredTGUpdates") or {}
        return cls(
            diff_type=str((result.get("Diff") or {}).get("Type") or "None"),
            updates={str(group): _counts(counts) for group, counts in updates.items()},
            failed_groups=AllocMetric.of_groups(result.get("FailedTGAllocs")),
        )


@dataclass(frozen=True)
class Evaluation:
    """An evaluation as `GET /v1/evaluation/:id` answers it: its status, and for each group
    Nomad could not place, the metrics of why (kept as Nomad's JSON: plan.py reads them in
    words, and Nomad's names of its metrics are the point there)."""

    id: str
    status: str = ""  # pending, blocked, complete, failed, canceled
    status_description: str = ""
    failed_groups: Mapping[str, AllocMetric] = field(default_factory=dict)

    @classmethod
    def from_api(cls, evaluation: Mapping[str, Any]) -> Evaluation:
        return cls(
            id=str(evaluation.get("ID") or ""),
            status=str(evaluation.get("Status") or ""),
            status_description=str(evaluation.get("StatusDescription") or ""),
            failed_groups=AllocMetric.of_groups(evaluation.get("FailedTGAllocs")),
        )

    @property
    def ended(self) -> bool:
        return self.status in ("complete", "failed", "canceled")


@dataclass(frozen=True)
class Node:
    """A client node as `GET /v1/nodes?resources=true` lists it: where it is, whether it
    takes work now, and what it offers allocations (its resources less what its operator
    reserved; of each device kind, the healthy instances)."""

    id: str
    name: str = ""
    datacenter: str = ""
    node_pool: str = "default"
    status: str = ""  # initializing, ready, down, disconnected
    eligibility: str = "eligible"  # eligible, ineligible
    drain: bool = False
    offers: Resources = field(default_factory=Resources)

    @classmethod
    def from_api(cls, stub: Mapping[str, Any]) -> Node:
        node_id = str(stub.get("ID") or "")
        return cls(
            id=node_id,
            name=str(stub.get("Name") or node_id[:8]),
            datacenter=str(stub.get("Datacenter") or ""),
            node_pool=str(stub.get("NodePool") or "default"),
            status=str(stub.get("Status") or ""),
            eligibility=str(stub.get("SchedulingEligibility") or "eligible"),
            drain=bool(stub.get("Drain")),
            offers=_node_offers(stub),
        )

    @property
    def usable(self) -> bool:
        """Ready, eligible and not draining: the scheduler places work on it now."""
        return self.status == "ready" and self.eligibility == "eligible" and not self.drain


def _node_offers(stub: Mapping[str, Any]) -> Resources:
    offered = stub.get("NodeResources") or {}
    reserved = stub.get("ReservedResources") or {}
    cpu = ((offered.get("Cpu") or {}).get("CpuShares") or 0) - ((reserved.get("Cpu") or {}).get("CpuShares") or 0)
    memory = ((offered.get("Memory") or {}).get("MemoryMB") or 0) - ((reserved.get("Memory") or {}).get("MemoryMB") or 0)
    devices = {}
    for group in offered.get("Devices") or []:
        healthy = sum(1 for instance in group.get("Instances") or [] if instance.get("Healthy"))
        devices[f"{group.get('Vendor')}/{group.get('Type')}/{group.get('Name')}"] = healthy
    return Resources(max(int(cpu), 0), max(int(memory), 0), devices)


@dataclass(frozen=True)
class JobStub:
    """A job as `GET /v1/jobs?meta=true` lists it."""

    id: str
    namespace: str = wire.DEFAULT_NAMESPACE
    status: str = ""  # pending, running, dead
    stop: bool = False
    meta: Mapping[str, str] | None = None  # None: the list carried no Meta (the job's own may still hold nomadtf's)
    job_modify_index: int = 0
    ran: Mapping[str, int] = field(default_factory=dict)  # "complete", "failed", "lost": its allocations so, summed over groups

    @classmethod
    def from_api(cls, stub: Mapping[str, Any]) -> JobStub:
        summary = (stub.get("JobSummary") or {}).get("Summary") or {}
        meta = stub.get("Meta")
        return cls(
            id=str(stub.get("ID") or ""),
            namespace=str(stub.get("Namespace") or wire.DEFAULT_NAMESPACE),
            status=str(stub.get("Status") or ""),
            stop=bool(stub.get("Stop")),
            meta=None if meta is None else {str(k): str(v) for k, v in meta.items()},
            job_modify_index=int(stub.get("JobModifyIndex") or 0),
            ran={word.lower(): sum(int((g or {}).get(word) or 0) for g in summary.values()) for word in ("Complete", "Failed", "Lost")},
        )

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, job id)."""
        return self.namespace, self.id

    @property
    def run_id(self) -> str:
        """The nomadtf run it was registered for ("" when none is listed)."""
        return (self.meta or {}).get(wire.META_RUN, "")


@dataclass(frozen=True)
class Job:
    """A whole job as `GET /v1/job/:id` answers: its state as attributes, and the document
    itself (`document`, Nomad's JSON: what nomadtf rendered and registers again; its groups
    and counts are suspension.py's to read)."""

    id: str
    namespace: str = wire.DEFAULT_NAMESPACE
    status: str = ""  # pending, running, dead
    stop: bool = False
    version: int = 0
    submit_time: int = 0  # ns since the epoch
    modify_index: int = 0  # JobModifyIndex: what a check-and-set write must name
    priority: int = 50  # Nomad's, 1 to 100
    meta: Mapping[str, str] = field(default_factory=dict)
    document: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, job: Mapping[str, Any]) -> Job:
        return cls(
            id=str(job.get("ID") or ""),
            namespace=str(job.get("Namespace") or wire.DEFAULT_NAMESPACE),
            status=str(job.get("Status") or ""),
            stop=bool(job.get("Stop")),
            version=int(job.get("Version") or 0),
            submit_time=int(job.get("SubmitTime") or 0),
            modify_index=int(job.get("JobModifyIndex") or 0),
            priority=int(job.get("Priority") or 50),
            meta={str(k): str(v) for k, v in (job.get("Meta") or {}).items()},
            document=job,
        )

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, job id)."""
        return self.namespace, self.id

    @property
    def dead(self) -> bool:
        """Nomad counts it finished: every allocation stopped, none wanted."""
        return self.status == "dead"

    @property
    def ours(self) -> bool:
        """nomadtf registered it (its Meta carries nomadtf's version)."""
        return wire.META_VERSION in self.meta

    @property
    def run_id(self) -> str:
        """The nomadtf run its current version belongs to ("" for a job rendered without one)."""
        return self.meta.get(wire.META_RUN, "")


@dataclass(frozen=True)
class JobWrite:
    """What Nomad answers a write of a job (register, scale, stop): the evaluation it created
    ("" when none) and the job's modify index after the write."""

    eval_id: str = ""
    job_modify_index: int = 0

    @classmethod
    def from_api(cls, reply: Mapping[str, Any] | None) -> JobWrite:
        reply = reply or {}
        return cls(eval_id=str(reply.get("EvalID") or ""), job_modify_index=int(reply.get("JobModifyIndex") or 0))


@dataclass(frozen=True)
class ScalingEvent:
    """One scaling event of a group (`GET /v1/job/:id/scale`: `TaskGroups.<group>.Events[]`):
    what the admission controller (or whoever scaled it) said, when, and to which count."""

    message: str = ""
    time: int = 0  # ns since the epoch
    count: int | None = None  # None: an event that changed no count
    meta: Mapping[str, str] = field(default_factory=dict)  # the scaler's own words (nomadtf's: the run and the verdict)

    @classmethod
    def from_api(cls, event: Mapping[str, Any]) -> ScalingEvent:
        count = event.get("Count")
        return cls(
            message=str(event.get("Message") or ""),
            time=int(event.get("Time") or 0),
            count=None if count is None else int(count),
            meta={str(k): str(v) for k, v in (event.get("Meta") or {}).items()},
        )
