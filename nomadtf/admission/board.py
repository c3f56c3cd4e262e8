"""The queue as the controller's leader publishes it, for submitters to read. Pure.

One Consul key (wire.KV_ADMISSION_BOARD) that only the controller may write and every
submitter may read: who leads, and every waiting run in admission order with its place,
what it needs and what of that the cluster lacks now. A run is named by its ticket (a
digest of namespace/job/run, wire.queue_ticket): its own submitter finds it, nobody else
learns another team's job names. Runs the controller could not read are listed under
`skipped` with the reason (their submitter can fix them; nobody else is held up), and its
last admissions and refusals under `recent`, both by ticket too.

Parsing never raises: what cannot be read is left out, so no value written by anyone can
crash a reader.

Usage:
    text = Board(leader, time.time(), lines, skipped).value()
    board = Board.parse(raw)               # raw: the key's bytes, or None
    board.line_of(ticket)                  # BoardLine or None
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from nomadtf.job.capacity import Resources

MAX_LINES = 1000  # ~270 bytes a line: well under Consul's 512 KiB value; `length` still counts every run


def _resources(data: Any) -> Resources:
    if not isinstance(data, dict):
        return Resources()
    devices = data.get("devices") if isinstance(data.get("devices"), dict) else {}
    return Resources(int(data.get("cpu") or 0), int(data.get("memory") or 0), {str(k): int(v) for k, v in devices.items()})


def resources_dict(resources: Resources) -> dict[str, Any]:
    return {"cpu": resources.cpu, "memory": resources.memory, "devices": dict(resources.devices)}


def _each(items: Any, read: Any) -> list[Any]:
    """`read` of every item of a list, leaving out what cannot be read (anything else: [])."""
    if not isinstance(items, list):
        return []
    out = []
    for item in items:
        value = _quietly(lambda item=item: read(item))
        if value is not None:
            out.append(value)
    return out


def _quietly(read: Any) -> Any:
    try:
        return read()
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None


def _number(value: Any, default: float) -> float:
    """A finite number, or `default`."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if math.isfinite(number) and abs(number) < 1e15 else default


@dataclass(frozen=True)
class BoardLine:
    ticket: str
    namespace: str
    priority: int
    place: int
    since: float
    needs: Resources
    short: Resources | None = None  # what the cluster lacks now (None: it fits, being admitted)
    note: str = ""  # "admitting", "waits for the runs ahead", "does not fit now", ...
    starts_at: float | None = None  # the controller's estimate of its start (unix time; admission/estimate.py)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["needs"] = resources_dict(self.needs)
        data["short"] = None if self.short is None else resources_dict(self.short)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoardLine:
        short = data.get("short")
        return cls(
            str(data["ticket"]), str(data["namespace"]), int(data["priority"]), int(data["place"]), _number(data.get("since"), 0.0),
            _resources(data.get("needs")), None if short is None else _resources(short), str(data.get("note") or "")[:300],
            None if data.get("starts_at") is None else _number(data.get("starts_at"), 0.0) or None,
        )  # fmt: skip


@dataclass(frozen=True)
class Skipped:
    """A run the controller could not read (its Meta), by ticket: named only to who may see it."""

    namespace: str
    ticket: str
    why: str


@dataclass(frozen=True)
class Happened:
    """One of the controller's last admissions, refusals, give-backs, by ticket."""

    namespace: str
    ticket: str
    what: str  # "05:07:19 admitted after 65s in the queue"


@dataclass(frozen=True)
class Board:
    leader: str = ""
    at: float = 0.0
    lines: tuple[BoardLine, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    length: int = 0
    free: Resources | None = None  # the usable nodes' free capacity when published
    recent: tuple[Happened, ...] = field(default_factory=tuple)  # the last admissions and refusals
    policy: str = ""  # the digest of the sharing policy in force (policy.Policy.digest)

    def value(self) -> str:
        return json.dumps(
            {
                "leader": self.leader, "at": self.at, "length": self.length or len(self.lines),
                "lines": [line.as_dict() for line in self.lines[:MAX_LINES]],
                "skipped": [asdict(s) for s in self.skipped[:100]],
                "free": None if self.free is None else resources_dict(self.free),
                "recent": [asdict(h) for h in self.recent[-20:]],
                "policy": self.policy,
            },
            sort_keys=True,
        )  # fmt: skip

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Board:
        try:
            data = json.loads(raw or "{}")
        except ValueError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        lines = _each(data.get("lines"), BoardLine.from_dict)
        skipped = _each(data.get("skipped"), lambda item: Skipped(str(item["namespace"]), str(item["ticket"]), str(item["why"])[:300]))
        recent = tuple(_each(data.get("recent"), lambda item: Happened(str(item["namespace"]), str(item["ticket"]), str(item["what"])[:300])))
        at, length = _number(data.get("at"), 0.0), int(_number(data.get("length"), float(len(lines))))
        free = _quietly(lambda: _resources(data["free"])) if isinstance(data.get("free"), dict) else None
        policy = str(data.get("policy") or "")[:64]
        return cls(str(data.get("leader") or "")[:200], at, tuple(lines), tuple(skipped), length, free, recent, policy)

    def line_of(self, ticket: str) -> BoardLine | None:
        return next((line for line in self.lines if line.ticket == ticket), None)

    def age_s(self) -> float:
        return time.time() - self.at if self.at else float("inf")
