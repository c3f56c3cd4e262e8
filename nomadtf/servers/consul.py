"""Consul (through py-consul): who is in the cluster, which index each task holds, and
the job's shared state. Every name used here comes from `nomadtf.wire`; how Consul is
reached, its errors mapped and the task's session renewed are `consulhttp.py`'s.

Watches are Consul blocking queries (`index` + `wait`), never a sleep loop. Calls that a
failure path depends on (bump the generation, set the job state, update our incarnation)
retry with bounded backoff through `retrying`, so a Consul restart does not kill a task.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import consul

from nomadtf import wire
from nomadtf.errors import ServerError
from nomadtf.servers.consulhttp import TaskSession, consul_call, consul_client
from nomadtf.tfconfig import RENDEZVOUS_ROLES, Member

T = TypeVar("T")


@dataclass(frozen=True)
class Slot:
    alloc_id: str
    incarnation: str
    session: str | None
    claimed_at: int = 0  # Consul's index of the claim (its key's ModifyIndex): claims in order


def read_cluster_profile(client: consul.Consul | None = None) -> str | None:
    """The cluster profile's text as its operator wrote it (profile.py); None when there is none.

    GET /v1/kv/nomadtf/_cluster/profile
    """
    _, item = consul_call("reading the cluster profile", (client or consul_client()).kv.get, wire.KV_CLUSTER_PROFILE)
    return item["Value"].decode() if item and item.get("Value") else None


def write_cluster_profile(text: str, client: consul.Consul | None = None) -> None:
    """PUT /v1/kv/nomadtf/_cluster/profile (an operator's token: key write there)"""
    consul_call("writing the cluster profile", (client or consul_client()).kv.put, wire.KV_CLUSTER_PROFILE, text)


def _instances(entries: list[dict[str, Any]]) -> dict[str, str]:
    """alloc id -> "host:port" of a service's health entries (its tasks' registrations). Pure."""
    out = {}
    for entry in entries:
        svc = entry["Service"]
        alloc = wire.parse_tags(svc.get("Tags", [])).get(wire.TAG_ALLOC)
        if alloc:
            address = svc.get("Address") or entry["Node"]["Address"]
            out[alloc] = f"{address}:{svc['Port']}"
    return out


class RunKeys(TaskSession):
    """A run's keys in Consul's KV store (`nomadtf/<ns>/<job>/<run>/`): read (all of a step's
    reads in one, `one_read`), written, watched with blocking queries, deleted."""

    def __init__(self, job_id: str, namespace: str, client: consul.Consul, run_id: str):
        super().__init__(client)
        self.job_id = job_id
        self.namespace = namespace
        self.run_id = run_id
        self._kv = (namespace, job_id)
        # key -> item of one read of the run's cluster/ keys, inside `one_read` only
        self._view: dict[str, dict[str, Any]] | None = None

    # ---- the session (consulhttp.TaskSession) ---------------------------------------------

    def reopen_session(self) -> str:
        """After a Consul restart: drop the old id, take a new one (same renewer thread)."""
        self._view = None  # our slots go with the old session
        self._destroy_session()
        return self.open_session(self._session_name)

    # ---- one read for a whole step ----------------------------------------------------------

    @contextlib.contextmanager
    def one_read(self) -> Iterator[None]:
        """Inside, the run's state, counts, slots and generation come from one recursive read
        of its `cluster/` keys instead of four; a write inside drops what was read (the next
        read asks Consul again), and so does leaving.

        GET /v1/kv/nomadtf/<ns>/<job>/<run>/cluster/?recurse
        """
        _, items = consul_call("reading the cluster keys", self.consul.kv.get, wire.kv_cluster_prefix(*self._kv, self.run_id), recurse=True)
        self._view = {item["Key"]: item for item in items or []}
        try:
            yield
        finally:
            self._view = None

    def _read(self, what: str, key: str) -> dict[str, Any] | None:
        if self._view is not None:
            return self._view.get(key)
        _, item = consul_call(what, self.consul.kv.get, key)
        return item

    def _read_prefix(self, what: str, prefix: str) -> list[dict[str, Any]]:
        if self._view is not None:
            return [item for key, item in sorted(self._view.items()) if key.startswith(prefix)]
        _, items = consul_call(what, self.consul.kv.get, prefix, recurse=True)
        return items or []

    def _write(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self._view = None
        return consul_call(what, fn, *args, **kwargs)

    # ---- watches ------------------------------------------------------------------------------

    def wait_for_cluster_kv_change(self, index: int, wait_s: float) -> int:
        """Block until a key that decides changes (slots, generation, state), or `wait_s` passes.
        Progress lives outside this prefix, so it wakes nobody.

        GET /v1/kv/nomadtf/<ns>/<job>/<run>/cluster/?recurse&keys&index=&wait=
        """
        return self._wait_for_kv("a blocking KV query", wire.kv_cluster_prefix(*self._kv, self.run_id), index, wait_s,
                                 recurse=True, keys=True)

    def wait_for_generation_change(self, index: int, wait_s: float) -> int:
        """Block until the run's generation key is written, or `wait_s` passes: all a task
        waits on while its cluster forms. The key is written once, when the cluster is
        complete, so another task's arrival wakes nobody (a query per role and one on the
        whole prefix woke every waiting task on every arrival: N x N answers). The key must
        exist (`open_generation`): on a missing key Consul answers any write to the KV store.

        GET /v1/kv/nomadtf/<ns>/<job>/<run>/cluster/generation?index=&wait=
        """
        return self._wait_for_kv("a blocking query on the generation", wire.kv_generation(*self._kv, self.run_id), index, wait_s)

    def _wait_for_kv(self, what: str, key: str, index: int, wait_s: float, **options: Any) -> int:
        """One Consul blocking KV query; the index it answered with."""
        new_index, _ = consul_call(what, self.consul.kv.get, key, index=index or None, wait=f"{max(1, int(wait_s))}s", **options)
        return int(new_index)

    # ---- the job's sessions, its admission, its keys' end --------------------------------------

    def sessions(self) -> list[dict[str, Any]]:
        """This job's live sessions (by name).  GET /v1/session/list"""
        _, items = consul_call("listing sessions", self.consul.session.list)
        return [s for s in items if s.get("Name", "").startswith(f"nomadtf {self.job_id} ")]

    def admitted_at(self) -> bytes | None:
        """When the admission controller admitted this run (None: not queued, or unreadable:
        the deadline then counts from the submission, as without a controller).

        GET /v1/kv/nomadtf/<ns>/<job>/<run>/admitted_at"""
        try:
            _, item = consul_call("reading when the run was admitted", self.consul.kv.get, wire.kv_admitted_at(*self._kv, self.run_id))
        except ServerError:
            return None
        return (item or {}).get("Value")

    def delete_run_keys(self) -> None:
        """This run's keys, all of them (a run sent back to the admission queue starts afresh).

        DELETE /v1/kv/nomadtf/<ns>/<job>/<run>/?recurse"""
        consul_call("deleting the run's keys", self.consul.kv.delete, wire.kv_prefix(*self._kv, self.run_id), recurse=True)

    def delete_job_keys(self, keep_run: str = "") -> None:
        """Every run's keys but `keep_run`'s (a new run keeps its own: its tasks may have
        written already).  DELETE /v1/kv/nomadtf/<ns>/<job>/?recurse (`stop --purge`), or
        GET .../?keys&separator=/ and DELETE .../<run>/?recurse per other run"""
        prefix = wire.kv_job_prefix(*self._kv)
        if not keep_run:
            consul_call("deleting job keys", self.consul.kv.delete, prefix, recurse=True)
            return
        _, keys = consul_call("listing the job's runs", self.consul.kv.get, prefix, keys=True, separator="/")
        for key in keys or []:
            if key != f"{prefix}{keep_run}/":
                consul_call("deleting an earlier run's keys", self.consul.kv.delete, key, recurse=key.endswith("/"))


class ConsulDiscovery(RunKeys):
    """One run's cluster in Consul, as its tasks, `run`, `status` and the controller see it:
    the roles' passing registrations, the slots, the generation, the state, the progress."""

    def __init__(
        self, job_id: str, namespace: str = wire.DEFAULT_NAMESPACE, client: consul.Consul | None = None, run_id: str = ""
    ):
        super().__init__(job_id, namespace, client or consul_client(), run_id)
        # role -> its passing instances as its running watch last saw them (watch threads
        # replace a whole entry at once; readers copy it)
        self._watched: dict[str, dict[str, str]] = {}

    # ---- catalog ------------------------------------------------------------------------

    def service_name(self, role: str) -> str:
        return wire.service_name(self.namespace, self.job_id, role)

    def wait_for_service_change(self, role: str, index: int, wait_s: float) -> int:
        """Block until the role's passing registrations change, or `wait_s` passes; what the
        query answered is kept, and `passing_instances` gives it without asking again.

        A blocking query on one service wakes only on that service's changes: a query on
        every health check (`/v1/health/state/any`, even filtered) would wake on every check
        of every job in the cluster, and each wake costs a step.

        GET /v1/health/service/<service>?passing=1&index=&wait=
        """
        try:
            new_index, entries = consul_call(
                f"a blocking query on service {self.service_name(role)}",
                self.consul.health.service,
                self.service_name(role),
                passing=True,
                index=index or None,
                wait=f"{max(1, int(wait_s))}s",
            )
        except ServerError:
            self._watched.pop(role, None)  # no longer known to be current: ask each time
            raise
        self._watched[role] = _instances(entries)
        return int(new_index)

    def watched_instances(self, role: str) -> dict[str, str] | None:
        """What the role's running watch last answered (no request); None without one."""
        watched = self._watched.get(role)
        return None if watched is None else dict(watched)

    def passing_instances(self, role: str) -> dict[str, str]:
        """alloc id -> "host:port" of the role's registrations whose checks all pass.

        What the role's watch last answered, while it runs (it wakes us on every change);
        otherwise GET /v1/health/service/<service>?passing=1
        """
        watched = self.watched_instances(role)
        if watched is not None:
            return watched
        _, entries = consul_call(f"service {self.service_name(role)}", self.consul.health.service, self.service_name(role), passing=True)
        return _instances(entries)

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

    def slots(self) -> dict[tuple[str, int], Slot]:
        """GET /v1/kv/nomadtf/<ns>/<job>/<run>/cluster/slots/?recurse"""
        items = self._read_prefix("reading slots", wire.kv_slots_prefix(*self._kv, self.run_id))
        out = {}
        for item in items:
            if not item.get("Session"):
                continue  # a lock nobody holds any more
            _, role, index = item["Key"].rsplit("/", 2)
            value = json.loads(item["Value"] or b"{}")
            out[(role, int(index))] = Slot(value.get("alloc", ""), value.get("incarnation", ""), item["Session"], int(item.get("ModifyIndex", 0)))
        return out

    def claim_slot(self, role: str, count: int, alloc_id: str, preferred: int, incarnation: str) -> int | None:
        """One non-blocking attempt: the slot our allocation already holds (a restarted
        supervisor takes its own index back first), else `preferred` if free, else the
        lowest free one. None when every slot is held by another live task.

        NOMAD_ALLOC_INDEX may repeat across reschedules and canaries, so it is only a
        preference: the Consul lock on .../slots/<role>/<i> makes the index unique.

        GET .../slots/?recurse ; PUT .../slots/<role>/<i>?acquire=<session>
        """
        held = self.slots()
        ours = [i for (r, i), slot in held.items() if r == role and slot.alloc_id == alloc_id and i < count]
        order = ours + ([preferred] if 0 <= preferred < count else []) + list(range(count))
        value = json.dumps({"alloc": alloc_id, "incarnation": incarnation})
        for index in dict.fromkeys(order):
            slot = held.get((role, index))
            if slot and slot.alloc_id != alloc_id:
                continue
            if slot and slot.session != self.session:
                # Our own allocation restarted (same alloc id): its old session is dead weight.
                self._write("freeing our old slot", self.consul.session.destroy, slot.session)
            if self._write("claiming a slot", self.consul.kv.put, wire.kv_slot(*self._kv, role, index, self.run_id), value, acquire=self.session):
                return index
        return None

    def update_incarnation(self, role: str, index: int, alloc_id: str, incarnation: str) -> None:
        """Tell peers our TensorFlow process restarted (a PS that restarts loses its variables).

        PUT .../slots/<role>/<i>?acquire=<session>
        """
        value = json.dumps({"alloc": alloc_id, "incarnation": incarnation})
        self._write("updating our slot", self.consul.kv.put, wire.kv_slot(*self._kv, role, index, self.run_id), value, acquire=self.session)

    # ---- job state ------------------------------------------------------------------------

    def job_state(self) -> str | None:
        """"succeeded", "failed: <why>" or None.  GET .../cluster/state"""
        item = self._read("reading job state", wire.kv_state(*self._kv, self.run_id))
        return item["Value"].decode() if item and item.get("Value") else None

    def set_job_state(self, state: str) -> None:
        """Write the run's state, then wake the tasks still waiting for their cluster to form
        (they watch the generation key alone): they end at once, not at their next look.

        PUT .../cluster/state ; GET, PUT .../cluster/generation?cas=<index>
        """
        self._write("writing job state", self.consul.kv.put, wire.kv_state(*self._kv, self.run_id), state)
        self.touch_generation()

    def mark_done(self, role: str, index: int) -> set[tuple[str, int]]:
        """Record that our code finished (success = all_workers); every slot finished so far.

        PUT .../cluster/done/<role>/<i> ; GET .../cluster/done/?recurse
        """
        prefix = wire.kv_done_prefix(*self._kv, self.run_id)
        self._write("recording that we finished", self.consul.kv.put, f"{prefix}{role}/{index}", "done")
        _, items = consul_call("reading who finished", self.consul.kv.get, prefix, recurse=True)
        done = set()
        for item in items or []:
            role_, _, index_ = item["Key"][len(prefix):].partition("/")
            if index_.isdigit():
                done.add((role_, int(index_)))
        return done

    def counts(self) -> dict[str, int]:
        """Role counts `nomadtf scale` set for this run ({} when never scaled).  GET .../cluster/counts"""
        item = self._read("reading role counts", wire.kv_counts(*self._kv, self.run_id))
        return {str(k): int(v) for k, v in json.loads(item["Value"]).items()} if item and item.get("Value") else {}

    def set_counts(self, counts: dict[str, int]) -> None:
        """Write the role counts (merged with what an earlier scale set), then wake the tasks
        still waiting for their cluster to form: the cluster they wait for changed.

        PUT .../cluster/counts ; GET, PUT .../cluster/generation?cas=<index>
        """
        merged = {**self.counts(), **counts}
        self._write("writing role counts", self.consul.kv.put, wire.kv_counts(*self._kv, self.run_id), json.dumps(merged, sort_keys=True))
        self.touch_generation()

    def generation(self) -> tuple[dict[str, Any], int]:
        """(value, modify index) of the generation key; ({}, 0) before the first one.

        GET .../cluster/generation
        """
        item = self._read("reading the generation", wire.kv_generation(*self._kv, self.run_id))
        if not item:
            return {}, 0
        return json.loads(item["Value"] or b"{}"), int(item["ModifyIndex"])

    def open_generation(self) -> tuple[int, int]:
        """(the run's generation number, the key's modify index), the key created at 0 by
        the first task that asks (check-and-set: never over a generation already written).

        PUT .../cluster/generation?cas=0 ; GET .../cluster/generation
        """
        key = wire.kv_generation(*self._kv, self.run_id)
        self._write("creating the generation key", self.consul.kv.put, key, json.dumps({"generation": 0}), cas=0)
        value, modify_index = self.generation()
        return int(value.get("generation", 0)), modify_index

    def touch_generation(self) -> None:
        """Write the generation key again, its generation unchanged, to wake the tasks that
        wait on it while their cluster forms (Consul does not wake a query for a write of the
        same value, hence the time). Check-and-set: a generation written meanwhile woke them.

        GET .../cluster/generation ; PUT .../cluster/generation?cas=<index>
        """
        current, modify_index = self.generation()
        if modify_index:
            self._write("waking the tasks that wait", self.consul.kv.put, wire.kv_generation(*self._kv, self.run_id),
                        json.dumps({**current, "touched": time.time()}), cas=modify_index)

    def bump_generation(self, fingerprint: str) -> dict[str, Any]:
        """Move the whole job to a new generation for `fingerprint`, exactly once.

        Every task that sees the same change tries; check-and-set lets one win and the
        others read the winner's value.  PUT .../cluster/generation?cas=<index>
        """
        for _attempt in range(10):
            current, modify_index = self.generation()
            if current.get("fingerprint") == fingerprint:
                return current
            new = {"generation": int(current.get("generation", 0)) + 1, "fingerprint": fingerprint, "time": time.time()}
            key = wire.kv_generation(*self._kv, self.run_id)
            if self._write("bumping the generation", self.consul.kv.put, key, json.dumps(new), cas=modify_index):
                return new
        return self.generation()[0]

    def publish_progress(self, progress: dict[str, Any]) -> None:
        """PUT .../progress (outside the watched prefix)"""
        consul_call("publishing progress", self.consul.kv.put, wire.kv_progress(*self._kv, self.run_id), json.dumps(progress, sort_keys=True))

    def progress(self) -> dict[str, Any] | None:
        """GET .../progress"""
        _, item = consul_call("reading progress", self.consul.kv.get, wire.kv_progress(*self._kv, self.run_id))
        return json.loads(item["Value"]) if item and item.get("Value") else None

    def publish_environment(self, role: str, index: int, status: dict[str, Any]) -> None:
        """PUT .../environment/<role>/<index> (outside the watched prefix)"""
        key = wire.kv_environment(self.namespace, self.job_id, role, index, self.run_id)
        consul_call("publishing the environment's state", self.consul.kv.put, key, json.dumps(status, sort_keys=True))

    def environments(self) -> dict[tuple[str, int], dict[str, Any]]:
        """Every task's environment state.  GET .../environment/?recurse"""
        prefix = wire.kv_environment_prefix(*self._kv, self.run_id)
        _, items = consul_call("reading the environments' state", self.consul.kv.get, prefix, recurse=True)
        out = {}
        for item in items or []:
            role, _, index = item["Key"][len(prefix):].partition("/")
            if index.isdigit() and item.get("Value"):
                out[(role, int(index))] = json.loads(item["Value"])
        return out
