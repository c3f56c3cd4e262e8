"""Consul: who is in the cluster, which index each task holds, and the job's shared state.

Names (stable, documented in the README):
    service  <job>-<role>                    registered by Nomad from the job's service
                                             block, tags nomadtf, role=<role>, alloc=<id>
    KV       nomadtf/<job>/slots/<role>/<i>  which allocation holds index i (session-locked)
    KV       nomadtf/<job>/generation        {"generation": n, "fingerprint": ...}
    KV       nomadtf/<job>/state             "succeeded" once the chief's code exited 0
    KV       nomadtf/<job>/progress          {"step": n, "metrics": {...}, "time": t}

Watches use Consul blocking queries (`index` + `wait`), never a sleep loop.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import consul
import requests

from nomadtf.cluster import RENDEZVOUS_ROLES, Member
from nomadtf.errors import ConsulError, UnreachableError

SESSION_TTL_S = 15


@dataclass(frozen=True)
class Slot:
    alloc_id: str
    incarnation: str
    session: str | None


def _call(what: str, fn, *args, **kwargs):
    """Run a py-consul call; map its failures to ours (one place)."""
    try:
        return fn(*args, **kwargs)
    except (requests.ConnectionError, requests.Timeout, consul.Timeout) as exc:
        raise UnreachableError(f"cannot reach Consul ({what}): {exc.__class__.__name__}") from exc
    except consul.ConsulException as exc:
        raise ConsulError(f"Consul refused {what}: {exc}") from exc


class ConsulDiscovery:
    def __init__(self, job_id: str, client: consul.Consul | None = None):
        self.job_id = job_id
        self.consul = client or consul.Consul()  # CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN
        self.prefix = f"nomadtf/{job_id}/"
        self.session: str | None = None
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    # ---- catalog ------------------------------------------------------------------------

    def service_name(self, role: str) -> str:
        return f"{self.job_id}-{role}"

    def wait_for_change(self, index: int, wait_s: float) -> int:
        """Block until any check of this job's services changes, or `wait_s` passes.

        GET /v1/health/state/any?index=&wait=&filter=ServiceName matches "^<job>-"
        """
        expr = f'ServiceName matches "^{self.job_id}-"'
        new_index, _ = _call(
            "a blocking health query",
            self.consul.health.state,
            "any",
            index=index or None,
            wait=f"{max(1, int(wait_s))}s",
            filter_expr=expr,
        )
        return int(new_index)

    def wait_for_kv_change(self, index: int, wait_s: float) -> int:
        """Block until any key under nomadtf/<job>/ changes, or `wait_s` passes.

        GET /v1/kv/nomadtf/<job>/?recurse&keys&index=&wait=
        """
        new_index, _ = _call(
            "a blocking KV query",
            self.consul.kv.get,
            self.prefix,
            index=index or None,
            wait=f"{max(1, int(wait_s))}s",
            recurse=True,
            keys=True,
        )
        return int(new_index)

    def passing_instances(self, role: str) -> dict[str, str]:
        """alloc id -> "host:port" of the role's registrations whose checks all pass.

        GET /v1/health/service/<job>-<role>?passing=1
        """
        _, entries = _call(f"service {self.service_name(role)}", self.consul.health.service, self.service_name(role), passing=True)
        out = {}
        for entry in entries:
            svc = entry["Service"]
            tags = dict(t.split("=", 1) for t in svc.get("Tags", []) if "=" in t)
            alloc = tags.get("alloc")
            if alloc:
                address = svc.get("Address") or entry["Node"]["Address"]
                out[alloc] = f"{address}:{svc['Port']}"
        return out

    def members(self, counts: dict[str, int], slots: dict[tuple[str, int], Slot] | None = None) -> list[Member]:
        """Every task that holds a slot and whose registration passes its checks."""
        members = []
        slots = self.slots() if slots is None else slots
        for role in RENDEZVOUS_ROLES:
            if not counts.get(role):
                continue
            addresses = self.passing_instances(role)
            for index in range(counts[role]):
                slot = slots.get((role, index))
                if slot and slot.alloc_id in addresses:
                    members.append(Member(role, index, addresses[slot.alloc_id], f"{slot.alloc_id}/{slot.incarnation}"))
        return members

    # ---- slots: a stable, unique index per task -------------------------------------------

    def open_session(self, name: str) -> str:
        """A session that dies with this process: renewed every few seconds, deleted on exit,
        expires (and frees our slot) when we stop renewing it.

        PUT /v1/session/create
        """
        self.session = _call(
            "creating a session",
            self.consul.session.create,
            name=name,
            ttl=SESSION_TTL_S,
            behavior="delete",
            lock_delay=0,
        )
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="consul-session", daemon=True)
        self._renewer.start()
        return self.session

    def _renew_loop(self) -> None:
        while not self._stop.wait(SESSION_TTL_S / 3):
            try:
                self.consul.session.renew(self.session)  # PUT /v1/session/renew/:id
            except Exception:  # noqa: BLE001 - Consul restarting; the next renewal retries
                continue

    def close(self) -> None:
        self._stop.set()
        if self.session:
            try:
                self.consul.session.destroy(self.session)  # PUT /v1/session/destroy/:id
            except Exception:  # noqa: BLE001 - best effort; the TTL frees it anyway
                pass
            self.session = None

    def slots(self) -> dict[tuple[str, int], Slot]:
        """GET /v1/kv/nomadtf/<job>/slots/?recurse"""
        _, items = _call("reading slots", self.consul.kv.get, self.prefix + "slots/", recurse=True)
        out = {}
        for item in items or []:
            if not item.get("Session"):
                continue  # a lock nobody holds any more
            _, role, index = item["Key"].rsplit("/", 2)
            value = json.loads(item["Value"] or b"{}")
            out[(role, int(index))] = Slot(value.get("alloc", ""), value.get("incarnation", ""), item["Session"])
        return out

    def claim_slot(self, role: str, count: int, alloc_id: str, preferred: int, incarnation: str) -> int | None:
        """Take index `preferred` if free (or already ours), else the lowest free one.

        NOMAD_ALLOC_INDEX may repeat across reschedules and canaries, so it is only a
        preference: the Consul lock on nomadtf/<job>/slots/<role>/<i> makes the index unique.
        Returns None when every slot is held by a live task.

        PUT /v1/kv/nomadtf/<job>/slots/<role>/<i>?acquire=<session>
        """
        order = ([preferred] if 0 <= preferred < count else []) + [i for i in range(count) if i != preferred]
        held = self.slots()
        value = json.dumps({"alloc": alloc_id, "incarnation": incarnation})
        for index in order:
            slot = held.get((role, index))
            if slot and slot.alloc_id != alloc_id:
                continue
            if slot and slot.session != self.session:
                # Our own allocation restarted (same alloc id): its old session is dead weight.
                _call("freeing our old slot", self.consul.session.destroy, slot.session)
            key = f"{self.prefix}slots/{role}/{index}"
            if _call("claiming a slot", self.consul.kv.put, key, value, acquire=self.session):
                return index
        return None

    def update_incarnation(self, role: str, index: int, alloc_id: str, incarnation: str) -> None:
        """Tell peers our TensorFlow process restarted (a PS that restarts loses its variables)."""
        key = f"{self.prefix}slots/{role}/{index}"
        value = json.dumps({"alloc": alloc_id, "incarnation": incarnation})
        _call("updating our slot", self.consul.kv.put, key, value, acquire=self.session)

    # ---- job state ------------------------------------------------------------------------

    def job_state(self) -> str | None:
        _, item = _call("reading job state", self.consul.kv.get, self.prefix + "state")
        return item["Value"].decode() if item and item.get("Value") else None

    def set_job_state(self, state: str) -> None:
        _call("writing job state", self.consul.kv.put, self.prefix + "state", state)

    def generation(self) -> tuple[dict[str, Any], int]:
        """(value, modify index) of the generation key; ({}, 0) before the first one."""
        _, item = _call("reading the generation", self.consul.kv.get, self.prefix + "generation")
        if not item:
            return {}, 0
        return json.loads(item["Value"] or b"{}"), int(item["ModifyIndex"])

    def bump_generation(self, fingerprint: str) -> dict[str, Any]:
        """Move the whole job to a new generation for `fingerprint`, exactly once.

        Every task that sees the same change tries; check-and-set lets one win and the
        others read the winner's value.  PUT /v1/kv/nomadtf/<job>/generation?cas=<index>
        """
        for _attempt in range(10):
            current, modify_index = self.generation()
            if current.get("fingerprint") == fingerprint:
                return current
            new = {"generation": int(current.get("generation", 0)) + 1, "fingerprint": fingerprint, "time": time.time()}
            if _call("bumping the generation", self.consul.kv.put, self.prefix + "generation", json.dumps(new), cas=modify_index):
                return new
        return self.generation()[0]

    def publish_progress(self, progress: dict[str, Any]) -> None:
        _call("publishing progress", self.consul.kv.put, self.prefix + "progress", json.dumps(progress, sort_keys=True))

    def progress(self) -> dict[str, Any] | None:
        _, item = _call("reading progress", self.consul.kv.get, self.prefix + "progress")
        return json.loads(item["Value"]) if item and item.get("Value") else None

    def delete_job_keys(self) -> None:
        """DELETE /v1/kv/nomadtf/<job>/?recurse (used by `nomadtf stop --purge`)."""
        _call("deleting job keys", self.consul.kv.delete, self.prefix, recurse=True)
