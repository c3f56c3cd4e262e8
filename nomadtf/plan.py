"""Nomad plan results and placement failures, explained in words. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PlanSummary:
    lines: list[str] = field(default_factory=list)
    changes: bool = False
    failures: bool = False


def explain_placement_failure(group: str, metric: dict[str, Any], requested_devices: list[str] | None = None) -> str:
    """One sentence for one task group's AllocMetric (FailedTGAllocs entry)."""
    evaluated = metric.get("NodesEvaluated", 0)
    available = sum((metric.get("NodesAvailable") or {}).values()) or evaluated
    reasons = []
    for constraint, count in sorted((metric.get("ConstraintFiltered") or {}).items()):
        if "device" in constraint:
            what = ", ".join(requested_devices or []) or "the requested device"
            reasons.append(f"no node offers {what}: {count} of {available} nodes have no matching device ({constraint})")
        else:
            reasons.append(f"{count} of {available} nodes filtered by constraint {constraint}")
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


def describe_plan(result: dict[str, Any], job: dict[str, Any] | None = None) -> PlanSummary:
    summary = PlanSummary()
    diff_type = (result.get("Diff") or {}).get("Type", "None")
    summary.changes = diff_type != "None"
    summary.lines.append(f"job diff: {diff_type.lower()}")
    updates = (result.get("Annotations") or {}).get("DesiredTGUpdates") or {}
    for group, counts in sorted(updates.items()):
        parts = [f"{k.lower()} {v}" for k, v in sorted(counts.items()) if v]
        summary.lines.append(f"  {group}: {', '.join(parts) or 'no change'}")
    devices = requested_devices(job)
    for group, metric in sorted((result.get("FailedTGAllocs") or {}).items()):
        summary.failures = True
        summary.lines.append(explain_placement_failure(group, metric, devices.get(group)))
    return summary
