"""The controller's lead: a Consul lock with lock-delay, and the fence every admitting call
passes.

One key (wire.KV_ADMISSION_LEADER), held through the leader's session (TTL 15 s, renewed
every 5 s, `lock-delay` 15 s). A replica that dies stops renewing; Consul ends the session
within its TTL and, for the lock-delay after, lets nobody take the key, so a leader that
was only paused (a long GC, a frozen VM) has time to notice before a standby acts. Before
each call that admits (`POST /v1/job/:id/scale`), `still_leads` reads the key with a
consistent read: a leader whose session lapsed acts no more. The scale calls are also
checked against the JobModifyIndex the last one left, so a stale leader's call that slips
through fails instead of acting twice.

Only the controller's Consul token may write the key; submitters may read it (`run` asks
whether a controller leads).

Usage:
    lease = Lease(consul_client(), "host-1 pid 42")
    if lease.acquire(): ...; lease.still_leads()
    lease.wait_for_change(index)       # a standby's blocking wait
    lease.close()                      # hands the lead on at once
"""

from __future__ import annotations

import threading
from typing import Any

import consul

from nomadtf import wire
from nomadtf.servers.consulhttp import consul_call

SESSION_TTL_S = 15
LOCK_DELAY_S = 15
LEAD_WAIT_S = 30.0


def leader_of(client: consul.Consul) -> tuple[int, str]:
    """(index, the leader's name, "" when none leads).  GET /v1/kv/nomadtf/_admission/leader"""
    index, item = consul_call("reading the admission lead", client.kv.get, wire.KV_ADMISSION_LEADER)
    if not item or not item.get("Session"):
        return int(index or 0), ""
    return int(index or 0), (item.get("Value") or b"").decode(errors="replace")[:200]


class Lease:
    def __init__(self, client: consul.Consul, name: str):
        self.consul = client
        self.name = name
        self.session = ""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _open(self) -> str:
        """PUT /v1/session/create (behavior release, TTL, lock-delay)"""
        self.session = consul_call(
            "creating the controller's session", self.consul.session.create,
            name=f"nomadtf-admission {self.name}", ttl=SESSION_TTL_S, behavior="release", lock_delay=LOCK_DELAY_S,
        )  # fmt: skip
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew_loop, name="admission-lease", daemon=True)
            self._renewer.start()
        return self.session

    def _renew_loop(self) -> None:
        while not self._stop.wait(SESSION_TTL_S / 3):
            if self.session:
                try:
                    self.consul.session.renew(self.session)  # PUT /v1/session/renew/:id
                except Exception:  # noqa: BLE001 - gone or Consul away: still_leads says so, acquire reopens
                    continue

    def alive(self) -> bool:
        """GET /v1/session/info/:id"""
        if not self.session:
            return False
        _, info = consul_call("reading the controller's session", self.consul.session.info, self.session)
        return bool(info)

    def acquire(self) -> bool:
        """Take the lead if it is free (a new session when ours ended).

        PUT /v1/kv/nomadtf/_admission/leader?acquire=<session>"""
        if not self.alive():
            self._open()
        return bool(consul_call("taking the admission lead", self.consul.kv.put, wire.KV_ADMISSION_LEADER, self.name, acquire=self.session))

    def still_leads(self) -> bool:
        """The fence: the key is held by our session now (a consistent read).

        GET /v1/kv/nomadtf/_admission/leader?consistent"""
        _, item = consul_call("checking the admission lead", self.consul.kv.get, wire.KV_ADMISSION_LEADER, consistency="consistent")
        return bool(self.session) and bool(item) and item.get("Session") == self.session

    def wait_for_change(self, index: int, wait_s: float = LEAD_WAIT_S) -> int:
        """Block until the lead changes (or `wait_s`).  GET .../leader?index=&wait="""
        new_index, _ = consul_call(
            "waiting on the admission lead", self.consul.kv.get, wire.KV_ADMISSION_LEADER, index=index or None, wait=f"{int(wait_s)}s"
        )
        return int(new_index or 0)

    def publish(self, key: str, value: str) -> None:
        """Write a key only the controller writes (the board), while it leads.

        PUT /v1/kv/<key>"""
        consul_call("publishing the admission board", self.consul.kv.put, key, value)

    def close(self) -> None:
        """Give the lead up at once (a standby takes it without waiting out the lock-delay).

        PUT /v1/kv/nomadtf/_admission/leader?release= ; PUT /v1/session/destroy/:id"""
        self._stop.set()
        session, self.session = self.session, ""
        if session:
            try:
                # Released first: a released lock has no lock-delay, a destroyed session's has.
                self.consul.kv.put(wire.KV_ADMISSION_LEADER, "", release=session)
                self.consul.session.destroy(session)
            except Exception:  # noqa: BLE001 - it ends with its TTL anyway
                pass

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
