"""The operator's side of sharing: store the policy where the controller reads it, read it
back (`nomadtf admission policy`); read the ledger of what each namespace used (`nomadtf usage`).

Usage:
    policy = store_policy(consul_client(), text)   # checked first: PolicyError names every bad field
    policy, stored = stored_policy(consul_client()) # (the policy in force, whether one is stored)
    clear_policy(consul_client())
    rows = usage_rows(consul_client(), since=time.time() - 7 * 86400)
"""

from __future__ import annotations

import time

import consul

from nomadtf import wire
from nomadtf.admission import ledger as ledgers
from nomadtf.admission import policy as policies
from nomadtf.servers.consulhttp import consul_call

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


def usage_rows(client: consul.Consul, since: float, namespace: str | None = None, now: float | None = None) -> list[ledgers.Row]:
    """Each namespace's totals from `since`'s UTC day on.  GET /v1/kv/nomadtf/_admission/ledger/<YYYY-MM> per month"""
    now = time.time() if now is None else now
    read = []
    for month in ledgers.months_between(since, now):
        _, item = consul_call(f"reading the ledger of {month}", client.kv.get, wire.KV_ADMISSION_LEDGER + month,
                              needs=f"reading it takes an operator's token with read on {wire.KV_ADMISSION_LEDGER}")  # fmt: skip
        read.append(ledgers.Ledger.load((item or {}).get("Value"), month))
    return ledgers.totals(read, since, namespace)
