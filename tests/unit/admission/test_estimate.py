"""When each queued run may start (nomadtf/admission/estimate.py). Pure."""

from __future__ import annotations

import pytest

from nomadtf.admission.estimate import Holding, Planned, end_of, plan
from nomadtf.job.capacity import Resources

NOW = 1_000.0


def cpu(mhz: int) -> Resources:
    return Resources(mhz, 100)


def test_a_running_run_ends_at_its_reported_rate_or_after_its_declared_duration():
    # 100 steps in 50 s: 2 steps/s; 400 left -> 200 s after the last report.
    assert end_of(500, (0, 900.0), (100, 950.0), started=None, duration_s=None) == pytest.approx(1150.0)
    assert end_of(500, (0, 900.0), (600, 950.0), started=None, duration_s=None) == 950.0  # past its steps: ending now
    assert end_of(None, (0, 900.0), (100, 950.0), started=800.0, duration_s=600.0) == 1400.0
    assert end_of(500, (100, 950.0), (100, 950.0), started=800.0, duration_s=None) is None  # no rate yet, no duration
    assert end_of(None, None, None, started=None, duration_s=60.0) is None


def test_a_queued_run_starts_when_what_it_needs_comes_back():
    free = cpu(1000)
    holding = [Holding(cpu(3000), NOW + 100), Holding(cpu(2000), NOW + 300)]
    starts = plan(free, holding, [Planned("a", cpu(3500), 60.0), Planned("b", cpu(500), 60.0)], NOW)
    assert starts["a"] == NOW + 100  # 1000 + 3000 free then
    assert starts["b"] == NOW  # fits at once beside what runs (backfill)


def test_a_later_run_never_delays_one_ahead_of_it():
    free = cpu(0)
    holding = [Holding(cpu(4000), NOW + 100)]
    # a takes 3000 from 100 for 200 s; b (2000) would fit at 100 only by delaying a: it waits
    # for a's end; c (1000) fits beside a from 100.
    starts = plan(free, holding, [Planned("a", cpu(3000), 200.0), Planned("b", cpu(2000), 50.0), Planned("c", cpu(1000), 50.0)], NOW)
    assert starts == {"a": NOW + 100, "b": NOW + 300, "c": NOW + 100}


def test_what_cannot_be_told_gets_no_estimate():
    free = cpu(0)
    holding = [Holding(cpu(4000), None)]  # a job that says nothing of its end
    assert plan(free, holding, [Planned("a", cpu(1000), 60.0)], NOW) == {"a": None}
    # A run ahead without a duration holds its room for good: the one behind it that needs it has no estimate.
    starts = plan(Resources(4000, 1000), [], [Planned("a", cpu(3000), None), Planned("b", cpu(3000), 60.0), Planned("c", cpu(1000), 60.0)], NOW)
    assert starts == {"a": NOW, "b": None, "c": NOW}


def test_gpus_are_planned_too():
    free = Resources(8000, 8000, {"nvidia/gpu/Tesla-V100": 0})
    holding = [Holding(Resources(1000, 100, {"nvidia/gpu/Tesla-V100": 2}), NOW + 50)]
    starts = plan(free, holding, [Planned("g", Resources(1000, 100, {"nvidia/gpu": 1}), 10.0)], NOW)
    assert starts["g"] == NOW + 50
