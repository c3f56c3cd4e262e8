"""The admission queue's records and its one ordering rule. Pure.

One queue for the whole cluster (capacity is the cluster's, not a namespace's). The rule:
higher job priority first (job.json `priority`, Nomad's 1–100, default 50); among equal
priorities, first come first served by the moment the run entered the queue (the Consul
CreateIndex of its entry, one counter for the cluster, so no two clocks are compared).
Namespaces play no part: team-a's run at priority 60 goes before team-b's at 50, and two
runs at 50 go in the order they arrived, whichever namespace they are in. Only the run at
the head is admitted (strict order: a large run at the head is never overtaken by smaller
ones that would fit, so it cannot starve); a running job is never preempted.

Usage:
    entries = [Entry.from_kv(item) for item in items]
    head = ordered(entries)[0]
    place, of = position(entries, key)    # (2, 5): second of five
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One queued run as its Consul key holds it. Every submitter may read the queue, so
    an entry names no job and no run: its `ticket` is a digest of namespace/job/run
    (wire.queue_ticket) that only the run's own submitter (and the admission service,
    through the run's own record) can match.

    `attended`: a submitter follows it and admits it itself (its key is held by that
    submitter's session and goes when it dies); an unattended entry (`--detach`, or left on
    Ctrl-C) waits for the admission service.
    """

    namespace: str
    ticket: str
    priority: int
    enqueued_at: float  # unix time, for display only (order is `order`)
    needs: dict[str, Any] = field(default_factory=dict)  # capacity.Resources as a dict
    attended: bool = True
    gang_timeout_s: float = 30.0
    key: str = ""  # the Consul key (set when read back)
    order: int = 0  # the key's CreateIndex (set when read back)
    session: str = ""  # the session holding the key, "" when none

    def value(self) -> str:
        """What the Consul key holds (everything but what Consul itself says: key, order, session)."""
        data = asdict(self)
        for name in ("key", "order", "session"):
            data.pop(name)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_kv(cls, item: Mapping[str, Any]) -> Entry:
        """From one item of GET /v1/kv/<prefix>?recurse."""
        data = json.loads(item.get("Value") or b"{}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known, key=item["Key"], order=int(item.get("CreateIndex", 0)), session=item.get("Session") or "")


@dataclass(frozen=True)
class QueuedRun:
    """The run behind a ticket (wire.kv_queued_run), readable by its namespace's submitters
    and the admission service only. `job` (the body of POST /v1/jobs) is kept for a run left
    unattended, for the service to register; `note` says why the service dropped one."""

    namespace: str
    job_id: str
    run_id: str
    ticket: str
    enqueued_at: float
    attended: bool = True
    job: dict[str, Any] | None = None
    note: str = ""

    def value(self) -> str:
        data = asdict(self)
        if data["job"] is None:
            data.pop("job")
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_kv(cls, item: Mapping[str, Any]) -> QueuedRun:
        data = json.loads(item.get("Value") or b"{}")
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def sort_key(entry: Entry) -> tuple[int, int, str]:
    return (-entry.priority, entry.order, entry.key)


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """The queue in admission order (see the module's rule)."""
    return sorted(entries, key=sort_key)


def position(entries: Iterable[Entry], key: str) -> tuple[int, int]:
    """(place, length): 1 is the head; (0, length) when `key` is not in the queue."""
    queue = ordered(entries)
    for place, entry in enumerate(queue, start=1):
        if entry.key == key:
            return place, len(queue)
    return 0, len(queue)


def find(entries: Iterable[Entry], key: str) -> Entry | None:
    return next((e for e in entries if e.key == key), None)
