"""The ledger of what each namespace used and what became of its runs (nomadtf/admission/ledger.py). Pure."""

from __future__ import annotations

import calendar

import pytest

from nomadtf.admission.ledger import Ledger, months_between, totals
from nomadtf.job.capacity import Resources

DEC_6 = calendar.timegm((2026, 12, 6, 10, 0, 0))
HOUR = 3600.0


def test_what_a_namespace_holds_is_booked_in_core_gib_and_gpu_seconds_on_its_day():
    ledger = Ledger("2026-12")
    ledger.held({"a": Resources(2000, 4096, {"nvidia/gpu/Tesla-V100": 2}), "b": Resources(500, 512)}, HOUR, DEC_6)
    (a, b) = totals([ledger], since=DEC_6 - 86400)
    assert (a.namespace, a.cpu_core_hours, a.memory_gib_hours, a.gpu_hours) == ("a", 2.0, 4.0, 2.0)
    assert (b.cpu_core_hours, b.memory_gib_hours, b.gpu_hours) == (0.5, 0.5, 0.0)


def test_events_count_and_queued_time_adds_up_and_a_window_starts_at_its_first_day():
    ledger = Ledger("2026-12")
    for day in (1, 5, 6):
        now = calendar.timegm((2026, 12, day, 12, 0, 0))
        ledger.count("a", "admitted", now)
        ledger.add("a", "queued_s", 1800, now)
    ledger.count("a", "succeeded", DEC_6)
    ledger.count("a", "preempted", DEC_6)
    ledger.count("a", "no-such-field", DEC_6)  # ignored
    (row,) = totals([ledger], since=calendar.timegm((2026, 12, 5, 23, 59, 0)))  # from Dec 5 on, whole days
    assert (row.admitted, row.queued_hours, row.succeeded, row.preempted, row.failed) == (2, 1.0, 1, 1, 0)
    assert totals([ledger], since=DEC_6, namespace="b") == []


def test_another_month_s_events_are_not_booked_into_this_month_s_key():
    ledger = Ledger("2026-11")
    ledger.count("a", "admitted", DEC_6)
    ledger.held({"a": Resources(1000)}, HOUR, DEC_6)
    assert ledger.days == {}


def test_what_was_saved_is_read_back_and_junk_is_dropped():
    ledger = Ledger("2026-12")
    ledger.count("a", "admitted", DEC_6)
    assert Ledger.load(ledger.dump(), "2026-12").days == ledger.days
    odd = Ledger.load(b'{"days": {"a": {"2026-12-06": {"admitted": -1, "failed": "x", "succeeded": 2, "evil": 9, "gpu_s": Infinity}}}}', "2026-12")
    assert odd.days == {"a": {"2026-12-06": {"succeeded": 2.0}}}
    for junk in (None, b"", b"[]", b"not json", b'{"days": [1]}'):
        assert Ledger.load(junk, "2026-12").days == {}, junk


@pytest.mark.parametrize(("since", "months"), [
    ((2026, 12, 1), ["2026-12"]), ((2026, 10, 30), ["2026-10", "2026-11", "2026-12"]), ((2025, 12, 31), ["2025-12", "2026-01", "2026-02",
    "2026-03", "2026-04", "2026-05", "2026-06", "2026-07", "2026-08", "2026-09", "2026-10", "2026-11", "2026-12"]),
])  # fmt: skip
def test_a_window_reads_every_month_it_covers(since, months):
    assert months_between(calendar.timegm((*since, 0, 0, 0)), DEC_6) == months
