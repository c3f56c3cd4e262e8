"""Registrations -> ClusterSpec -> TF_CONFIG. Pure functions, no I/O.

TensorFlow's rules (tf.distribute docs, "Multi-worker training" and "Parameter server
training"):
- parameter_server: cluster = chief + worker + ps; every task gets the full cluster.
- multi_worker_mirrored: cluster = worker (+ chief when present).
- legacy_server: the DC/OS layout; cluster = every training role present.
- The evaluator reads checkpoints on its own: it gets `task: evaluator` with the training
  cluster, and is never part of the cluster itself. TensorBoard is not a TF task at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nomadtf import roles as role_table

# Roles that hold a slot and a registration (the evaluator registers so that it is seen;
# nobody waits for it: see roles.rendezvous_roles). TensorBoard needs nobody. The data roles
# are members too (the code and the data workers need the dispatcher's address), never in
# TF_CONFIG.
RENDEZVOUS_ROLES = ("chief", "worker", "ps", "evaluator", "data_dispatcher", "data_worker")
# The roles that get a TF_CONFIG.
TF_CONFIG_ROLES = ("chief", "worker", "ps", "evaluator")


@dataclass(frozen=True, order=True)
class Member:
    """One registered task: a role, its unique index, and the address its TF server uses."""

    role: str
    index: int
    address: str  # host:port
    alloc_id: str = ""


def expected_members(counts: dict[str, int], roles: Iterable[str] = RENDEZVOUS_ROLES) -> list[tuple[str, int]]:
    """Every (role, index) of `roles` the job has."""
    return [(role, i) for role in roles for i in range(counts.get(role, 0))]


def missing_members(counts: dict[str, int], members: list[Member], roles: Iterable[str] = RENDEZVOUS_ROLES) -> list[str]:
    """Human-readable list of who is not there yet, e.g. ["worker[1]", "ps[0]"]."""
    present = {(m.role, m.index) for m in members}
    return [f"{role}[{i}]" for role, i in expected_members(counts, roles) if (role, i) not in present]


def build_cluster_spec(strategy: str, counts: dict[str, int], members: list[Member]) -> dict[str, list[str]]:
    """The `cluster` part of TF_CONFIG. Raises ValueError when a member is missing."""
    roles = role_table.cluster_roles(strategy)
    missing = missing_members(counts, members, roles)
    if missing:
        raise ValueError(f"cannot build the cluster spec; missing {', '.join(missing)}")
    by_slot = {(m.role, m.index): m.address for m in members}
    cluster: dict[str, list[str]] = {}
    for role in roles:
        count = counts.get(role, 0)
        if count:
            cluster[role] = [by_slot[(role, i)] for i in range(count)]
    return cluster


def build_tf_config(cluster: dict[str, list[str]], role: str, index: int) -> dict[str, Any]:
    """TF_CONFIG for one task. The evaluator gets the cluster but is not listed in it."""
    return {"cluster": cluster, "task": {"type": role, "index": index}}


def tf_config_json(tf_config: dict[str, Any]) -> str:
    # Sorted and compact, so "did the spec change?" is a string comparison.
    return json.dumps(tf_config, sort_keys=True, separators=(",", ":"))


def placeholder_members(job_id: str, counts: dict[str, int]) -> list[Member]:
    """Members with placeholder addresses, for `nomadtf render --tf-config` before discovery."""
    return [
        Member(role, i, f"<{job_id}-{role}[{i}] address>:<port>")
        for role, i in expected_members(counts)
    ]


def all_tf_configs(job_id: str, strategy: str, counts: dict[str, int]) -> dict[str, dict[str, Any]]:
    """"role[i]" -> TF_CONFIG for every task that gets one, with placeholder addresses."""
    cluster = build_cluster_spec(strategy, counts, placeholder_members(job_id, counts))
    return {f"{role}[{i}]": build_tf_config(cluster, role, i) for role, i in expected_members(counts, TF_CONFIG_ROLES)}


def runs_user_code(strategy: str, role: str) -> bool:
    """Who runs the user's entrypoint (see roles.TABLE). Under parameter_server only the
    chief and the evaluator do: workers and parameter servers run a bare TensorFlow server."""
    return role_table.runs_user_code(strategy, role)
