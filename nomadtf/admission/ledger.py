"""What each namespace used and what happened to its runs, by day: the ledger the admission
controller keeps as runs start and end, so that it outlives Nomad's garbage collection
(`nomadtf usage`). Pure.

Per namespace and UTC day: CPU core-hours (1 core = 1000 MHz of Nomad's CPU), memory
GiB-hours and GPU-hours its batch allocations held (integrated step by step from what they
hold), the runs admitted, preempted and refused, how the runs that ended ended (succeeded,
failed, stopped) and the hours the admitted runs waited in the queue. One Consul key per
month (`nomadtf/_admission/ledger/<YYYY-MM>`), rewritten whole by the leader.

Usage:
    ledger = Ledger.load(raw)                     # this month's key
    ledger.held(held_by_namespace, seconds, now)  # each step
    ledger.count("team-a", "admitted", now); ledger.add("team-a", "queued_s", 42.0, now)
    rows = totals([Ledger.load(raw) for raw in months], since=..., namespace=None)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nomadtf.job.capacity import Resources

COUNTS = ("admitted", "preempted", "refused", "succeeded", "failed", "stopped")
AMOUNTS = ("cpu_core_s", "memory_gib_s", "gpu_s", "queued_s")
FIELDS = COUNTS + AMOUNTS


def month_of(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def day_of(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


@dataclass
class Ledger:
    month: str
    days: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # namespace -> day -> field -> value

    def _entry(self, namespace: str, now: float) -> dict[str, float]:
        return self.days.setdefault(namespace, {}).setdefault(day_of(now), {})

    def held(self, held: Mapping[str, Resources], seconds: float, now: float) -> None:
        """What each namespace held for the last `seconds` (booked on `now`'s day)."""
        if seconds <= 0 or month_of(now) != self.month:
            return
        for namespace, amount in held.items():
            entry = self._entry(namespace, now)
            entry["cpu_core_s"] = entry.get("cpu_core_s", 0.0) + amount.cpu / 1000 * seconds
            entry["memory_gib_s"] = entry.get("memory_gib_s", 0.0) + amount.memory / 1024 * seconds
            entry["gpu_s"] = entry.get("gpu_s", 0.0) + sum(amount.devices.values()) * seconds

    def count(self, namespace: str, what: str, now: float) -> None:
        self.add(namespace, what, 1, now)

    def add(self, namespace: str, what: str, amount: float, now: float) -> None:
        if what not in FIELDS or month_of(now) != self.month:
            return
        entry = self._entry(namespace, now)
        entry[what] = entry.get(what, 0) + amount

    def dump(self) -> str:
        return json.dumps({"month": self.month, "days": self.days}, sort_keys=True)

    @classmethod
    def load(cls, raw: str | bytes | None, month: str) -> Ledger:
        """The month's ledger as saved; an empty one for what is missing or unreadable (a
        field that is not a finite number of 0 or more is dropped)."""
        try:
            saved = json.loads(raw or "{}")
            days = {}
            for namespace, by_day in (saved.get("days") or {}).items():
                days[str(namespace)] = {
                    str(day): {k: float(v) for k, v in entry.items() if k in FIELDS and _number(v)}
                    for day, entry in by_day.items()
                }
        except (ValueError, TypeError, AttributeError):
            return cls(month)
        return cls(month, days)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class Row:
    """One namespace's totals over a window."""

    namespace: str
    cpu_core_hours: float
    memory_gib_hours: float
    gpu_hours: float
    queued_hours: float
    admitted: int
    succeeded: int
    failed: int
    stopped: int
    preempted: int
    refused: int


def totals(ledgers: Iterable[Ledger], since: float, namespace: str | None = None) -> list[Row]:
    """Each namespace's sums over the days from `since`'s day on (whole UTC days)."""
    first = day_of(since)
    sums: dict[str, dict[str, float]] = {}
    for ledger in ledgers:
        for ns, by_day in ledger.days.items():
            if namespace is not None and ns != namespace:
                continue
            for day, entry in by_day.items():
                if day < first:
                    continue
                into = sums.setdefault(ns, {})
                for key, value in entry.items():
                    into[key] = into.get(key, 0.0) + value
    return [
        Row(ns, s.get("cpu_core_s", 0) / 3600, s.get("memory_gib_s", 0) / 3600, s.get("gpu_s", 0) / 3600, s.get("queued_s", 0) / 3600,
            *(int(s.get(k, 0)) for k in ("admitted", "succeeded", "failed", "stopped", "preempted", "refused")))  # fmt: skip
        for ns, s in sorted(sums.items())
    ]


def months_between(since: float, now: float) -> list[str]:
    """Every month from `since`'s to `now`'s."""
    out, (year, month) = [], map(int, month_of(since).split("-"))
    last = month_of(now)
    while True:
        name = f"{year:04d}-{month:02d}"
        out.append(name)
        if name >= last:
            return out
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
