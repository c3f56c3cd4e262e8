"""What the leader knows of sharing: the operator's policy, each namespace's remembered
usage and the ledger of what each used and what became of its runs, kept current from
Consul and the allocations.

The policy is read again every POLICY_RECHECK_S (a change takes effect within that); one
that does not parse (written past `admission policy set`, which checks it) is reported and
the last good one kept. Usage is advanced every step from what each namespace's batch
allocations hold, and saved every USAGE_SAVE_S, so a new leader remembers it. The ledger
(ledger.py) is booked the same way and saved with it, or within LEDGER_SAVE_S of an event
(an admission, an end) so that `nomadtf usage` shows it soon.

Usage:
    sharing = Sharing(consul_client, on_event)
    sharing.load(now)                      # when it starts to lead
    sharing.step(held_by_namespace, now)   # each step: policy re-read when due, usage advanced
    sharing.policy.of("team-a"); sharing.usage.average_share("team-a", total)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import consul

from nomadtf import wire
from nomadtf.admission import policy as policies
from nomadtf.admission.ledger import Ledger, month_of
from nomadtf.admission.usage import Usage
from nomadtf.errors import PolicyError, ServerError
from nomadtf.job.capacity import Resources

POLICY_RECHECK_S = 10.0
USAGE_SAVE_S = 30.0
LEDGER_SAVE_S = 5.0  # a ledger with a new event is saved within this


class Sharing:
    def __init__(self, client: consul.Consul, on_event: Callable[[str], None] = lambda line: None):
        self.consul = client
        self.on_event = on_event
        self.policy = policies.Policy()
        self.usage = Usage(self.policy.half_life_s)
        self.requests = 0
        self._policy_index = -1
        self._policy_checked = 0.0
        self._saved_at = 0.0
        self.ledger = Ledger(month_of(0))
        self._ledger_dirty = False
        self._last_step = 0.0
        self.problem = ""  # why the stored policy is not the one in force ("" when it is)

    def load(self, now: float) -> None:
        """The policy and the last leader's usage.  GET .../policy ; GET .../usage"""
        from nomadtf.servers.consulhttp import consul_call

        self._read_policy(now)
        try:
            _, item = consul_call("reading the namespaces' usage", self.consul.kv.get, wire.KV_ADMISSION_USAGE)
        except ServerError as exc:  # admission goes on; the order starts from no memory
            self.on_event(f"could not read the namespaces' usage, starting from none: {exc}")
            item = None
        self.requests += 1
        self.usage = Usage.load((item or {}).get("Value"), self.policy.half_life_s, now)
        self.ledger = self._load_ledger(now)
        self._saved_at = self._last_step = now

    def step(self, held: Mapping[str, Resources], now: float) -> None:
        """GET .../policy every POLICY_RECHECK_S ; PUT .../usage every USAGE_SAVE_S"""
        from nomadtf.servers.consulhttp import consul_call

        if now - self._policy_checked >= POLICY_RECHECK_S:
            self._read_policy(now)
        self.usage.advance(held, now)
        if month_of(now) != self.ledger.month:
            self._save_ledger()  # the month's last word, then a new month's key
            self.ledger = self._load_ledger(now)
        if self._last_step:
            self.ledger.held(held, min(now - self._last_step, 60.0), now)  # a longer gap: not ours to book
        self._last_step = now
        since = now - self._saved_at
        if since >= USAGE_SAVE_S or self._ledger_dirty and since >= LEDGER_SAVE_S:
            self._saved_at = now
            try:
                consul_call("saving the namespaces' usage", self.consul.kv.put, wire.KV_ADMISSION_USAGE, self.usage.dump())
                self.requests += 1
            except ServerError as exc:
                self.on_event(f"could not save the namespaces' usage: {exc}")
            self._save_ledger()

    def record(self, namespace: str, what: str, now: float, amount: float = 1) -> None:
        """An event for the ledger (ledger.FIELDS): saved within LEDGER_SAVE_S."""
        self.ledger.add(namespace, what, amount, now)
        self._ledger_dirty = True

    def _load_ledger(self, now: float) -> Ledger:
        """GET /v1/kv/nomadtf/_admission/ledger/<YYYY-MM>"""
        from nomadtf.servers.consulhttp import consul_call

        month = month_of(now)
        try:
            _, item = consul_call("reading the ledger", self.consul.kv.get, wire.KV_ADMISSION_LEDGER + month)
        except ServerError as exc:
            self.on_event(f"could not read the ledger of {month}, starting it afresh: {exc}")
            item = None
        self.requests += 1
        return Ledger.load((item or {}).get("Value"), month)

    def _save_ledger(self) -> None:
        """PUT /v1/kv/nomadtf/_admission/ledger/<YYYY-MM>"""
        from nomadtf.servers.consulhttp import consul_call

        try:
            consul_call("saving the ledger", self.consul.kv.put, wire.KV_ADMISSION_LEDGER + self.ledger.month, self.ledger.dump())
            self.requests += 1
            self._ledger_dirty = False
        except ServerError as exc:
            self.on_event(f"could not save the ledger: {exc}")

    def _read_policy(self, now: float) -> None:
        from nomadtf.servers.consulhttp import consul_call

        self._policy_checked = now
        try:
            _, item = consul_call("reading the sharing policy", self.consul.kv.get, wire.KV_ADMISSION_POLICY)
        except ServerError as exc:  # a token without read on it (an older controller policy): admission goes on
            problem = f"could not read the sharing policy, the one in force stays: {exc}"
            if problem != self.problem:
                self.on_event(problem)
            self.problem = problem
            return
        self.requests += 1
        index = int(item.get("ModifyIndex") or 0) if item else 0
        if index == self._policy_index:
            return
        self._policy_index = index
        try:
            new = policies.parse(item["Value"]) if item and item.get("Value") else policies.Policy()
        except PolicyError as exc:
            problem = "; ".join(exc.problems)
            if problem != self.problem:
                self.on_event(f"the stored sharing policy is not valid, the last good one stays: {problem}")
            self.problem = problem
            return
        if new != self.policy:
            self.on_event("sharing policy " + ("set" if item and item.get("Value") else "cleared: the defaults apply"))
        self.problem = ""
        self.policy = new
        self.usage.half_life_s = new.half_life_s
