"""Nomad plan results and placement failures, explained in words. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


def explain_placement_failure(
    group: str, metric: dict[str, Any], requested_devices: list[str] | None = None, wanted: int | None = None
) -> str:
    """One sentence for one task group's AllocMetric (FailedTGAllocs entry); `wanted` is
    the group's count, which turns a distinct_hosts failure into how many nodes it needs."""
    evaluated = metric.get("NodesEvaluated", 0)
    available = sum((metric.get("NodesAvailable") or {}).values()) or evaluated
    reasons = []
    for constraint, count in sorted((metric.get("ConstraintFiltered") or {}).items()):
        # Nomad checks distinct_hosts after every other constraint: the nodes it filtered,
        # and those that passed it but had no room, are all the eligible ones.
        eligible = count + (metric.get("NodesExhausted") or 0)
        if constraint == DISTINCT_HOSTS and wanted is not None and wanted > eligible:
            verb = "is" if eligible == 1 else "are"
            reasons.append(f"distinct_hosts asks for {wanted} different nodes, only {eligible} {verb} eligible")
        elif constraint == COMPUTED_CLASS_INELIGIBLE:
            reasons.append(f"{count} of {available} nodes do not meet the group's constraints (node_class, constraints)")
        elif "device" in constraint:
            what = ", ".join(requested_devices or []) or "the requested device"
            reasons.append(f"no node offers {what}: {count} of {available} nodes have no matching device ({constraint})")
        else:
            reasons.append(f"{count} of {available} nodes filtered by constraint {constraint}")
    # ClassFiltered counts every filtered node by its class, whatever filtered it: only
    # worth saying for the nodes no constraint above accounts for.
    explained = sum((metric.get("ConstraintFiltered") or {}).values())
    if (metric.get("NodesFiltered") or 0) > explained:
        for cls, count in sorted((metric.get("ClassFiltered") or {}).items()):
            reasons.append(f"{count} nodes of class {cls} filtered")
    for dimension, count in sorted((metric.get("DimensionExhausted") or {}).items()):
        if "device" in dimension:
            what = ", ".join(requested_devices or []) or "the requested device"
            reasons.append(
                f"not enough free {what}: on {count} of {available} nodes the matching devices are fewer than asked "
                f"or in use by other allocations ({dimension})"
            )
        else:
            reasons.append(f"{count} of {available} nodes have too little {dimension}")
    for quota in metric.get("QuotaExhausted") or []:
        reasons.append(f"quota exhausted: {quota}")
    if metric.get("NodesFiltered") and not reasons:
        reasons.append(f"{metric['NodesFiltered']} of {available} nodes filtered")
    if not evaluated and not reasons:
        reasons.append("no client node is ready in the job's datacenters")
    if (metric.get("CoalescedFailures") or 0) > 0:
        reasons.append(f"{metric['CoalescedFailures'] + 1} allocations affected")
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


def describe_plan(result: dict[str, Any], job: dict[str, Any] | None = None) -> PlanSummary:
    summary = PlanSummary()
    diff_type = (result.get("Diff") or {}).get("Type", "None")
    summary.changes = diff_type != "None"
    summary.lines.append(f"job diff: {diff_type.lower()}")
    updates = (result.get("Annotations") or {}).get("DesiredTGUpdates") or {}
    for group, counts in sorted(updates.items()):
        parts = [f"{k.lower()} {v}" for k, v in sorted(counts.items()) if v]
        summary.lines.append(f"  {group}: {', '.join(parts) or 'no change'}")
    devices, counts = requested_devices(job), group_counts(job)
    for group, metric in sorted((result.get("FailedTGAllocs") or {}).items()):
        summary.failures = True
        summary.lines.append(explain_placement_failure(group, metric, devices.get(group), counts.get(group)))
    return summary
