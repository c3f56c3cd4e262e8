"""The admission queue's one ordering rule and its records (queue.py)."""

from __future__ import annotations

import json
import re

from nomadtf import queue, wire
from nomadtf.queue import Entry


def entry(namespace, name, priority=50, order=1):
    ticket = wire.queue_ticket(namespace, name, "r1")
    return Entry(namespace, ticket, priority, 0.0, key=wire.kv_queue_entry(namespace, ticket), order=order)


def test_higher_priority_first_then_first_come_whatever_the_namespace():
    early_a = entry("team-a", "x", 50, order=10)
    late_b = entry("team-b", "y", 50, order=20)
    urgent_b = entry("team-b", "z", 90, order=30)
    low_a = entry("team-a", "w", 10, order=5)
    assert queue.ordered([late_b, low_a, early_a, urgent_b]) == [urgent_b, early_a, late_b, low_a]
    assert queue.position([late_b, low_a, early_a, urgent_b], early_a.key) == (2, 4)
    assert queue.position([late_b], early_a.key) == (0, 1)


def test_an_entry_names_no_job_and_no_run():
    ticket = wire.queue_ticket("team-a", "secret-project", "3f2a9c1e")
    item = Entry("team-a", ticket, 60, 1700000000.0, needs={"cpu": 3380, "memory": 1800, "devices": {}})
    stored = {"Key": wire.kv_queue_entry("team-a", ticket), "Value": item.value().encode(), "CreateIndex": 42, "Session": "s-1"}
    assert "secret-project" not in stored["Key"] + item.value() and "3f2a9c1e" not in stored["Key"] + item.value()
    back = Entry.from_kv(stored)
    assert (back.priority, back.order, back.session, back.needs["cpu"], back.attended) == (60, 42, "s-1", 3380, True)
    assert back.key.startswith(wire.kv_queue_prefix("team-a"))
    assert set(json.loads(item.value())) == {"namespace", "ticket", "priority", "enqueued_at", "needs", "attended", "gang_timeout_s"}


def test_tickets_keep_runs_apart():
    assert wire.queue_ticket("ml", "team-x", "r") != wire.queue_ticket("ml-team", "x", "r")
    assert wire.queue_ticket("a", "b", "r1") != wire.queue_ticket("a", "b", "r2")
    # The admission keys live where no namespace's job prefix can reach them.
    segment = wire.KV_ADMISSION.split("/")[1]
    assert segment == "_admission" and not re.fullmatch(wire.NAMESPACE_PATTERN, segment)
