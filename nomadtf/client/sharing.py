"""The operator's side of the sharing policy: store it where the controller reads it, read
it back (`nomadtf admission policy`).

Usage:
    policy = store_policy(consul_client(), text)   # checked first: PolicyError names every bad field
    policy, stored = stored_policy(consul_client()) # (the policy in force, whether one is stored)
    clear_policy(consul_client())
"""

from __future__ import annotations

import consul

from nomadtf import wire
from nomadtf.admission import policy as policies
from nomadtf.discovery import consul_call

WRITE_NEEDS = f"writing the policy takes an operator's token with write on key {wire.KV_ADMISSION_POLICY} (set CONSUL_HTTP_TOKEN)"


def store_policy(client: consul.Consul, text: str) -> policies.Policy:
    """Check `text`, then write it whole.  PUT /v1/kv/nomadtf/_admission/policy"""
    parsed = policies.parse(text)
    consul_call("storing the sharing policy", client.kv.put, wire.KV_ADMISSION_POLICY, text, needs=WRITE_NEEDS)
    return parsed


def stored_policy(client: consul.Consul) -> tuple[policies.Policy, bool]:
    """The stored policy (the defaults when none is); PolicyError when what is stored does
    not parse.  GET /v1/kv/nomadtf/_admission/policy"""
    _, item = consul_call("reading the sharing policy", client.kv.get, wire.KV_ADMISSION_POLICY)
    if not item or not item.get("Value"):
        return policies.Policy(), False
    return policies.parse(item["Value"]), True


def clear_policy(client: consul.Consul) -> None:
    """DELETE /v1/kv/nomadtf/_admission/policy"""
    consul_call("clearing the sharing policy", client.kv.delete, wire.KV_ADMISSION_POLICY, needs=WRITE_NEEDS)
