"""Who this task is and who its peers are: the index claim, the cluster as Consul (or
the template-rendered file) sees it, and the watches that turn changes into loop events. Every call here is one non-blocking step; waiting is
the event loop's job, so a SIGTERM is handled at once, in any phase.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nomadtf import roles, tfconfig, wire
from nomadtf.discovery import ConsulDiscovery, Slot
from nomadtf.errors import NomadtfError
from nomadtf.runtime.loop import CATALOG, CLUSTER_FILE, CLUSTER_KV, Event
from nomadtf.runtime.policy import SlotState, slot_state
from nomadtf.spec import JobSpec
from nomadtf.tfconfig import Member

log = logging.getLogger("nomadtf.task")

WATCH_WAIT_S = 30.0  # a blocking query's wait; answered at once on a change
WATCH_RETRY_S = 1.0  # after a failed query (Consul restarting)
WRITES = frozenset({"created", "modified", "moved", "closed", "deleted"})  # watchdog's event types


# ---- watches -------------------------------------------------------------------------------


class Watch:
    """One Consul blocking query turned into loop events, on its own thread, for ever.
    An index that goes backwards means Consul restarted: start over from 0."""

    def __init__(self, kind: str, query: Callable[[int, float], int], post: Callable[[Event], None]):
        self.kind = kind
        self.query = query
        self.post = post
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def start(self) -> Watch:
        self.thread.start()
        return self

    def _run(self) -> None:
        index = 0
        while not self.stop.is_set():
            try:
                new_index = self.query(index, WATCH_WAIT_S)
            except NomadtfError:
                index = 0
                self.stop.wait(WATCH_RETRY_S)
                continue
            if new_index != index:
                self.post(Event(self.kind, new_index))
            index = new_index if new_index >= index else 0


class FileWatch:
    """A loop event whenever `path` is (re)written (reconfigure=template): Nomad's
    consul-template renders the cluster file a few milliseconds after the catalog changes,
    often after our own catalog watch fired, and nothing else would tell us. watchdog uses
    inotify on Linux (a blocking read on its own thread: no polling). The directory is
    watched, not the file: consul-template replaces the file by a rename."""

    def __init__(self, path: Path, kind: str, post: Callable[[Event], None]):
        from watchdog.events import FileSystemEventHandler  # only in template mode
        from watchdog.observers import Observer

        target = str(path)

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                # Written, replaced or removed; never our own reads (opened, closed_no_write).
                if event.event_type in WRITES and target in (event.src_path, event.dest_path):
                    post(Event(kind))

        path.parent.mkdir(parents=True, exist_ok=True)
        self.observer = Observer()
        self.observer.daemon = True
        self.observer.schedule(_Handler(), str(path.parent), recursive=False)

    def start(self) -> FileWatch:
        self.observer.start()
        return self

    def close(self) -> None:
        self.observer.stop()


# ---- membership ----------------------------------------------------------------------------


@dataclass
class Identity:
    role: str
    alloc_id: str
    alloc_index: int
    incarnation: str
    index: int = -1


class Membership:
    def __init__(self, spec: JobSpec, identity: Identity, discovery: ConsulDiscovery, cluster_file: Path):
        self.spec = spec
        self.me = identity
        self.discovery = discovery
        self.cluster_file = cluster_file
        self.watches: list[Watch] = []
        self.file_watch: FileWatch | None = None

    # the roles whose registrations matter to us
    @property
    def watched_roles(self) -> tuple[str, ...]:
        return tuple(r for r in tfconfig.RENDEZVOUS_ROLES if self.spec.counts.get(r))

    @property
    def wait_for(self) -> tuple[str, ...]:
        return roles.rendezvous_roles(self.spec.strategy, self.me.role)

    def open(self) -> None:
        self.discovery.open_session(wire.session_name(self.spec.name, self.me.role, self.me.alloc_id))

    def start_watches(self, post: Callable[[Event], None]) -> None:
        # One blocking query per role we may depend on (each wakes only on its own service),
        # and one on the run's cluster keys.
        self.watches = [
            *(Watch(CATALOG, lambda i, w, role=role: self.discovery.wait_for_service_change(role, i, w), post).start()
              for role in self.watched_roles),
            Watch(CLUSTER_KV, self.discovery.wait_for_cluster_kv_change, post).start(),
        ]
        if self.spec.discovery.reconfigure == "template":
            self.file_watch = FileWatch(self.cluster_file, CLUSTER_FILE, post).start()

    def close(self) -> None:
        for watch in self.watches:
            watch.stop.set()
        if self.file_watch is not None:
            self.file_watch.close()
        self.discovery.close()

    # ---- index claim ------------------------------------------------------------------------

    def try_claim(self) -> bool:
        """One attempt at a unique index; True once we hold one."""
        count = self.spec.counts.get(self.me.role, 1)
        index = self.discovery.claim_slot(self.me.role, count, self.me.alloc_id, self.me.alloc_index, self.me.incarnation)
        if index is None:
            return False
        if index != self.me.alloc_index:
            log.warning("NOMAD_ALLOC_INDEX=%d is held by another allocation; using index %d", self.me.alloc_index, index)
        self.me.index = index
        log.info("holding %s[%d] (alloc %s, incarnation %s)", self.me.role, index, self.me.alloc_id[:8], self.me.incarnation)
        return True

    def slot_state(self, slots: dict[tuple[str, int], Slot]) -> SlotState:
        """Whether we hold our index, lost it (claim it back) or another allocation took it."""
        slot = slots.get((self.me.role, self.me.index))
        if slot is None:
            return slot_state(None, None, self.me.alloc_id, self.discovery.session)
        return slot_state(slot.alloc_id, slot.session, self.me.alloc_id, self.discovery.session)

    def holder(self, slots: dict[tuple[str, int], Slot]) -> str:
        slot = slots.get((self.me.role, self.me.index))
        return slot.alloc_id if slot else ""

    def reclaim(self) -> bool:
        """After Consul forgot us (a dev agent restarted): a new session, our index again."""
        log.warning("our slot %s[%d] is gone (Consul restarted?); claiming it again", self.me.role, self.me.index)
        self.discovery.reopen_session()
        self.me.alloc_index = self.me.index
        return self.try_claim()

    def announce_incarnation(self, incarnation: str) -> None:
        self.me.incarnation = incarnation
        self.discovery.update_incarnation(self.me.role, self.me.index, self.me.alloc_id, incarnation)

    # ---- the cluster ------------------------------------------------------------------------

    def members(self, slots: dict[tuple[str, int], Slot] | None = None) -> list[Member]:
        slots = self.discovery.slots() if slots is None else slots
        if self.spec.discovery.reconfigure == "template":
            return members_from_template(self.cluster_file, slots, self.spec.counts)
        return self.discovery.members(self.spec.counts, slots)

    def may_be_complete(self) -> bool:
        """False when our catalog watches hold fewer passing tasks of a role we wait for than
        it counts: the cluster cannot be complete, and a look would only cost requests.
        Costs none itself. (Template mode reads a file: always worth a look.)"""
        if self.spec.discovery.reconfigure == "template":
            return True
        for role in self.wait_for:
            seen = self.discovery.watched_instances(role)
            if seen is not None and len(seen) < self.spec.counts.get(role, 0):
                return False
        return True

    def missing(self, members: list[Member]) -> list[str]:
        return tfconfig.missing_members(self.spec.counts, members, self.wait_for)


def members_from_template(path: Path, slots: dict[tuple[str, int], Slot], counts: dict[str, int]) -> list[Member]:
    """The file Nomad's template block renders from the Consul catalog (reconfigure=template)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    members = []
    for group in data.get("members", []):
        by_alloc = {}
        for inst in group.get("instances", []):
            by_alloc[wire.parse_tags(inst.get("tags", [])).get(wire.TAG_ALLOC, "")] = inst["address"]
        for (role, index), slot in slots.items():
            if role == group["role"] and slot.alloc_id in by_alloc and index < counts.get(role, 0):
                members.append(Member(role, index, by_alloc[slot.alloc_id], f"{slot.alloc_id}/{slot.incarnation}"))
    return sorted(members)


def describe(members: list[Member]) -> str:
    return ", ".join(f"{m.role}[{m.index}]={m.address}" for m in sorted(members))


