"""Is it ready yet? The checks `up` waits on, each one call (or two) through the client
libraries, and `wait_for`, which retries a check until it holds or time runs out.

A check returns True when ready. It may return False or raise one of NOT_YET (the server
does not answer yet, or answers with an error): both mean "ask again". Anything else is a
bug and propagates at once.

Usage:
    wait_for(lambda: consul_leader(stack.api()), 60, "consul", consul.log)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import consul
import hvac.exceptions
import nomad.api.exceptions
import requests
import tenacity

from nomadtf.devstack.protocol import StackApi
from nomadtf.durations import parse_seconds
from nomadtf.errors import DevStackError

NOT_YET = (
    requests.RequestException,
    nomad.api.exceptions.BaseNomadException,
    consul.ConsulException,
    hvac.exceptions.VaultError,
)
POLL_S = 0.3
CALL_TIMEOUT_S = 2.0


def wait_for(check: Callable[[], object], timeout: float, component: str, log: str) -> None:
    """Call `check` every POLL_S seconds until it returns something true; after `timeout`
    seconds a DevStackError that carries the end of `component`'s log (a failed `up`
    removes its state, log included)."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout),
        wait=tenacity.wait_fixed(POLL_S),
        retry=tenacity.retry_if_exception_type(NOT_YET) | tenacity.retry_if_not_result(bool),
    )
    try:
        retrying(check)
    except tenacity.RetryError:
        raise DevStackError(
            f"{component} did not become healthy within {timeout:.0f}s; the end of its log ({log}):\n{_tail(log)}"
        ) from None


def _tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "  (no log)"
    return "\n".join(f"  {line}" for line in text) or "  (empty)"


# ---- Consul -------------------------------------------------------------------------------


def consul_leader(api: StackApi) -> bool:
    """Consul has elected a leader. GET /v1/status/leader (answered without a token)"""
    return bool(api.consul(CALL_TIMEOUT_S).status.leader())


def consul_acl_ready(api: StackApi) -> bool:
    """Consul knows the stack's management token: a leader inserts the configured initial
    management token only after its election, so a call between the two is refused (403,
    "ACL not found"). GET /v1/acl/token/self"""
    return bool(api.consul(CALL_TIMEOUT_S).acl.token.read_self())


def consul_node_alive(api: StackApi, name: str) -> bool:
    """The servers see the Consul agent of node `name` alive: its serfHealth check passes.
    (Not GET /v1/agent/members: py-consul sends that one without the ACL token, and with
    ACLs on an anonymous caller sees no members.)

    GET /v1/health/node/:node
    """
    _index, checks = api.consul(CALL_TIMEOUT_S).health.node(name)
    return any(c.get("CheckID") == "serfHealth" and c.get("Status") == "passing" for c in checks)


# ---- OpenBao ------------------------------------------------------------------------------


def openbao_listening(api: StackApi) -> bool:
    """OpenBao answers, initialised or not, sealed or not. GET /v1/sys/init"""
    api.vault(CALL_TIMEOUT_S).sys.read_init_status()
    return True


def openbao_active(api: StackApi) -> bool:
    """OpenBao is initialised, unsealed and active. HEAD /v1/sys/health (200 only then)"""
    return api.vault(CALL_TIMEOUT_S).sys.read_health_status().status_code == 200


# ---- Nomad --------------------------------------------------------------------------------


def nomad_leader(api: StackApi) -> bool:
    """The Nomad servers have elected a leader. GET /v1/status/leader"""
    return bool(api.nomad(timeout=CALL_TIMEOUT_S).status.leader.get_leader())


def node_gpu_count(node: dict) -> int:
    """GPUs a node offers (its NodeResources' nvidia/gpu device groups). Pure."""
    devices = ((node.get("NodeResources") or {}).get("Devices")) or []
    return sum(len(d.get("Instances") or []) for d in devices if d.get("Vendor") == "nvidia" and d.get("Type") == "gpu")


def nomad_node_ready(api: StackApi, gpus: int = 0, name: str | None = None, drivers: tuple[str, ...] = ("raw_exec",)) -> bool:
    """A Nomad client is ready to run our jobs: status ready, each of `drivers` healthy, at
    least `gpus` NVIDIA GPUs fingerprinted (whole GPUs and MIG slices alike: each is a GPU to
    Nomad). With `name`, that node, and it talks to its own
    Consul agent (the agent's node name is the node's).

    GET /v1/nodes?resources=true ; with `name`, GET /v1/node/:node_id
    """
    client = api.nomad(timeout=CALL_TIMEOUT_S)
    for stub in client.nodes.get_nodes(resources=True):
        if stub.get("Status") != "ready" or name not in (None, stub.get("Name")):
            continue
        found = stub.get("Drivers") or {}
        healthy = all((found.get(driver) or {}).get("Healthy") for driver in drivers)
        if healthy and node_gpu_count(stub) >= gpus:
            if name is None:
                return True
            node = client.node.get_node(stub["ID"])
            return (node.get("Attributes") or {}).get("unique.consul.name") == name
    return False


def node_statuses(api: StackApi) -> dict[str, str]:
    """Node name -> status as the servers see it; empty when they do not answer.
    GET /v1/nodes"""
    try:
        nodes = api.nomad(timeout=CALL_TIMEOUT_S).nodes.get_nodes()
    except NOT_YET:
        return {}
    latest: dict[str, tuple[int, str]] = {}
    for node in nodes:
        # A node re-registering under a new ID leaves its old entry behind: the newest wins.
        order = int(node.get("ModifyIndex", 0))
        if order >= latest.get(node["Name"], (-1, ""))[0]:
            latest[node["Name"]] = (order, node.get("Status", "unknown"))
    return {name: status for name, (_order, status) in latest.items()}


class HeartbeatWatch:
    """Tells when a Nomad client has heartbeated since the watch began, from the instant of
    its last successful registration or heartbeat (the client agent's
    stats.client.last_heartbeat is the time since then). Two different instants seen means
    at least one heartbeat; heartbeats are seconds apart, polls are not.

    Usage:
        seen = HeartbeatWatch(api, "https://198.18.0.11:4646")
        wait_for(seen.heartbeated, 60, "client-1's first heartbeat", log)
    """

    def __init__(self, api: StackApi, client_address: str):
        self.agent = api.nomad(client_address, timeout=CALL_TIMEOUT_S).agent
        self.instants: list[float] = []

    def heartbeated(self) -> bool:
        """GET /v1/agent/self on the client agent"""
        stats = self.agent.get_agent()["stats"]["client"]
        instant = time.time() - parse_seconds(stats["last_heartbeat"])
        if not self.instants or instant - self.instants[-1] > 0.5:
            self.instants.append(instant)
        return len(self.instants) >= 2
