"""Nomad plan results and placement failures, explained in words, and told apart: a job
that can never fit from one that does not fit now (`classify`). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nomadtf.job import capacity
from nomadtf.job.answers import AllocMetric, PlanResult
from nomadtf.job.capacity import NodeCapacity


@dataclass
class PlanSummary:
    lines: list[str] = field(default_factory=list)
    changes: bool = False
    failures: bool = False


# The ConstraintFiltered key Nomad's scheduler uses for a node that already runs an
# allocation of the group when the group asks for distinct hosts.
DISTINCT_HOSTS = "distinct_hosts"
# Nomad's key for nodes it skipped because another node of the same computed class (same
# attributes, class and meta) already failed the group's constraints.
COMPUTED_CLASS_INELIGIBLE = "computed class ineligible"
# Nomad's key for nodes that lack a host volume the group asks for (scheduler/feasible.go).
MISSING_HOST_VOLUMES = "missing compatible host volumes"
# Nomad's key for nodes without a healthy driver of the task's kind.
MISSING_DRIVERS = "missing drivers"


def explain_placement_failure(
    group: str, metric: AllocMetric, requested_devices: list[str] | None = None, wanted: int | None = None
) -> str:
    """One sentence for one task group's AllocMetric (FailedTGAllocs entry); `wanted` is
    the group's count, which turns a distinct_hosts failure into how many nodes it needs."""
    evaluated = metric.nodes_evaluated
    available = metric.nodes_available or evaluated
    reasons = []
    for constraint, count in sorted(metric.constraint_filtered.items()):
        # Nomad checks distinct_hosts after every other constraint: the nodes it filtered,
        # and those that passed it but had no room, are all the eligible ones.
        eligible = count + metric.nodes_exhausted
        if constraint == DISTINCT_HOSTS and wanted is not None and wanted > eligible:
            verb = "is" if eligible == 1 else "are"
            reasons.append(f"distinct_hosts asks for {wanted} different nodes, only {eligible} {verb} eligible")
        elif constraint == COMPUTED_CLASS_INELIGIBLE:
            reasons.append(f"{count} of {available} nodes do not meet the group's constraints (node_class, constraints)")
        elif "driver.docker.volumes.enabled" in constraint:
            reasons.append(
                f"{count} of {available} nodes have a docker driver that allows no bind mounts, which driver.volumes are: "
                "remove driver.volumes (checkpoints need none), or have the operator enable them on clients no other team shares"
            )
        elif constraint == MISSING_HOST_VOLUMES:
            reasons.append(
                f"{count} of {available} nodes do not declare the host volumes a docker task mounts (nomadtf-<namespace>, its checkpoint folder; nomadtf-ca, its CA files): "
                'the operator declares them in the clients\' config (client { host_volume "<name>" { path = ... } }, see docs/operations/drivers.md)'
            )
        elif constraint == MISSING_DRIVERS:
            reasons.append(f"{count} of {available} nodes have no healthy driver of the kind driver.name asks for (raw_exec or docker enabled on the client)")
        elif "device" in constraint:
            what = ", ".join(requested_devices or []) or "the requested device"
            reasons.append(f"no node offers {what}: {count} of {available} nodes have no matching device ({constraint})")
        else:
            reasons.append(f"{count} of {available} nodes filtered by constraint {constraint}")
    # ClassFiltered counts every filtered node by its class, whatever filtered it: only
    # worth saying for the nodes no constraint above accounts for.
    explained = sum(metric.constraint_filtered.values())
    if metric.nodes_filtered > explained:
        for cls, count in sorted(metric.class_filtered.items()):
            reasons.append(f"{count} nodes of class {cls} filtered")
    for dimension, count in sorted(metric.dimension_exhausted.items()):
        if "device" in dimension:
            what = ", ".join(requested_devices or []) or "the requested device"
            reasons.append(
                f"not enough free {what}: on {count} of {available} nodes the matching devices are fewer than asked "
                f"or in use by other allocations ({dimension})"
            )
        else:
            reasons.append(f"{count} of {available} nodes have too little {dimension}")
    for quota in metric.quota_exhausted:
        reasons.append(f"quota exhausted: {quota}")
    if metric.nodes_filtered and not reasons:
        reasons.append(f"{metric.nodes_filtered} of {available} nodes filtered")
    if not evaluated and not reasons:
        reasons.append("no client node is ready in the job's datacenters")
    if metric.coalesced_failures > 0:
        reasons.append(f"{metric.coalesced_failures + 1} allocations affected")
    return f"{group}: cannot be placed: " + "; ".join(reasons or ["the scheduler gave no reason"])


def requested_devices(job: dict[str, Any] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for group in (job or {}).get("TaskGroups") or []:
        names = []
        for task in group.get("Tasks") or []:
            for dev in (task.get("Resources") or {}).get("Devices") or []:
                names.append(f"{dev['Name']} x{dev.get('Count', 1)}")
        out[group["Name"]] = names
    return out


def group_counts(job: dict[str, Any] | None) -> dict[str, int]:
    return {group["Name"]: group.get("Count", 1) for group in (job or {}).get("TaskGroups") or []}


# What `classify` decides.
FITS = "fits"  # the plan places every allocation now
NOT_NOW = "not now"  # capacity is in use: it fits once enough is released (nomadtf run queues it)
NEVER = "never"  # no node could ever hold it, or the whole job exceeds the cluster: fail fast


@dataclass(frozen=True)
class Placement:
    """A plan's verdict: `reasons` has one line per group that did not place (as
    `explain_placement_failure` says it); `why_never` is set for NEVER."""

    verdict: str
    reasons: list[str] = field(default_factory=list)
    why_never: str = ""

    def failure_text(self) -> str:
        """What `nomadtf run` says when it fails fast."""
        text = "the job cannot be placed:\n  " + "\n  ".join(self.reasons)
        return text + (f"\n  it can never fit: {self.why_never}" if self.why_never else "")


def _never_by_feasibility(metric: AllocMetric, nodes: list[NodeCapacity] | None) -> str:
    """Why no node passes the group's feasibility checks ("" when some node does): every
    node filtered (constraints, devices it does not have, drivers, distinct_hosts); none
    was merely out of room. No node evaluated at all is "never" only when the token could
    read the nodes and none may take the job (a drained or rebooting node comes back)."""
    if not metric.nodes_evaluated:
        return "no client node is ready in the job's datacenters" if nodes is not None and not nodes else ""
    if not metric.nodes_exhausted and metric.nodes_filtered:
        return "no node meets its constraints (constraints, devices, drivers or distinct hosts)"
    return ""


def _never_by_size(job: dict[str, Any], nodes: list[NodeCapacity]) -> str:
    """Why the whole job could not fit even on an empty cluster ("" when it could)."""
    asks = capacity.job_asks(job)
    if capacity.fits_when_empty(asks, nodes):
        return ""
    if not nodes:
        return "no client node is ready in the job's datacenters"
    largest = capacity.largest_node(nodes)
    for ask in asks:
        if ask.resources.cpu > largest.cpu:
            return f"a {ask.group} allocation asks cpu {ask.resources.cpu} MHz; the largest node offers {largest.cpu} MHz"
        if ask.resources.memory > largest.memory:
            return f"a {ask.group} allocation asks memory {ask.resources.memory} MB; the largest node offers {largest.memory} MB"
    needs, cluster = capacity.job_needs(job), capacity.cluster_capacity(nodes)
    short = capacity.short_of(needs, cluster)
    if short:
        what = short[0]
        asked = {"cpu": f"{needs.cpu} MHz", "memory": f"{needs.memory} MB"}.get(what) or f"x{needs.devices[what]}"
        offered = {"cpu": f"{cluster.cpu} MHz", "memory": f"{cluster.memory} MB"}.get(what) or "x" + str(
            sum(n for g, n in cluster.devices.items() if capacity.device_matches(what, g))
        )
        return f"the whole job asks {what} {asked}; the {len(nodes)} node(s) it may use offer {offered} in all"
    return f"its {len(asks)} allocations do not pack onto the {len(nodes)} node(s) it may use even when they are empty"


def classify(result: PlanResult, job: dict[str, Any], nodes: list[NodeCapacity] | None) -> Placement:
    """FITS, NOT_NOW or NEVER for a plan `result` (POST /v1/job/:id/plan) of `job` (the
    body of POST /v1/jobs), given the `nodes` that could take it (capacity.node_capacities;
    None when the token may not read nodes: then only feasibility can say NEVER).

    NEVER when some group has no feasible node at all, or when the whole job could not be
    packed onto those nodes were they empty; otherwise a failed placement is NOT_NOW:
    capacity in use, which a finished job gives back."""
    failed = result.failed_groups
    if not failed:
        return Placement(FITS)
    inner = job.get("Job", job)
    devices, counts = requested_devices(inner), group_counts(inner)
    reasons = [explain_placement_failure(g, m, devices.get(g), counts.get(g)) for g, m in sorted(failed.items())]
    for group, metric in sorted(failed.items()):
        why = _never_by_feasibility(metric, nodes)
        if why:
            return Placement(NEVER, reasons, f"{group}: {why}")
    if nodes is None or not nodes:
        return Placement(NOT_NOW, reasons)  # nothing to measure against: wait (a node may come back)
    why = _never_by_size(job, nodes)
    return Placement(NEVER, reasons, why) if why else Placement(NOT_NOW, reasons)


def describe_plan(result: PlanResult, job: dict[str, Any] | None = None, placement: Placement | None = None) -> PlanSummary:
    summary = PlanSummary()
    summary.changes = result.diff_type != "None"
    summary.lines.append(f"job diff: {result.diff_type.lower()}")
    for group, counts in sorted(result.updates.items()):
        parts = [f"{k.lower()} {v}" for k, v in sorted(counts.items()) if v]
        summary.lines.append(f"  {group}: {', '.join(parts) or 'no change'}")
    devices, counts = requested_devices(job), group_counts(job)
    for group, metric in sorted(result.failed_groups.items()):
        summary.failures = True
        summary.lines.append(explain_placement_failure(group, metric, devices.get(group), counts.get(group)))
    if placement is not None and placement.verdict == NEVER:
        summary.lines.append(f"it can never fit: {placement.why_never}")
    elif placement is not None and placement.verdict == NOT_NOW:
        summary.lines.append("it does not fit now (capacity in use); nomadtf run queues it until enough is free")
    return summary
