"""Each namespace's remembered usage (nomadtf/admission/usage.py): decay by the half-life,
the dominant share, and what the next leader reads back. Pure."""

from __future__ import annotations

import pytest

from nomadtf.admission.usage import Usage, dominant_share
from nomadtf.job.capacity import Resources

HOUR = 3600.0
CLUSTER = Resources(10_000, 20_000, {"nvidia/gpu/Tesla-V100": 4})


def held_for(usage: Usage, held: dict, seconds: float, start: float, step: float = 5.0) -> float:
    t = start
    while t < start + seconds:
        t += step
        usage.advance(held, t)
    return t


def test_holding_a_fixed_share_for_long_approaches_that_share():
    usage = Usage(HOUR, at=1.0)
    held_for(usage, {"a": Resources(5_000, 2_000)}, 20 * HOUR, 1.0, step=60.0)
    assert usage.average_share("a", CLUSTER) == pytest.approx(0.5, rel=1e-3)  # CPU dominates (memory 10 %)
    assert usage.average_share("b", CLUSTER) == 0.0


def test_gpus_can_be_the_dominant_resource():
    usage = Usage(HOUR, at=1.0)
    held_for(usage, {"a": Resources(100, 100, {"nvidia/gpu/Tesla-V100": 3})}, 20 * HOUR, 1.0, step=60.0)
    assert usage.average_share("a", CLUSTER) == pytest.approx(0.75, rel=1e-3)


def test_usage_halves_with_every_half_life_once_the_namespace_stops():
    usage = Usage(HOUR, at=1.0)
    end = held_for(usage, {"a": Resources(10_000)}, HOUR, 1.0)
    after_run = usage.average_share("a", CLUSTER)
    # One hour of the whole cluster, remembered with a one-hour half-life: half of the
    # memory's integral (1 - 2^-1), in the unit of the whole memory.
    assert after_run == pytest.approx(0.5, rel=1e-3)
    usage.advance({}, end + HOUR)
    assert usage.average_share("a", CLUSTER) == pytest.approx(after_run / 2, rel=1e-6)
    usage.advance({}, end + 40 * HOUR)
    assert "a" not in usage.decayed  # forgotten entirely


def test_the_result_does_not_depend_on_how_often_it_is_advanced():
    coarse, fine = Usage(HOUR, at=1.0), Usage(HOUR, at=1.0)
    held_for(coarse, {"a": Resources(3_000)}, 1800, 1.0, step=300.0)
    held_for(fine, {"a": Resources(3_000)}, 1800, 1.0, step=1.0)
    assert coarse.average_share("a", CLUSTER) == pytest.approx(fine.average_share("a", CLUSTER), rel=1e-9)


def test_what_a_leader_saved_the_next_one_reads_and_junk_is_a_fresh_memory():
    usage = Usage(HOUR, at=1.0)
    held_for(usage, {"a": Resources(2_000)}, 600, 1.0)
    back = Usage.load(usage.dump(), HOUR, now=usage.at + 1)
    assert back.decayed == usage.decayed and back.at == usage.at
    for junk in (None, b"", b"not json", b'{"decayed": {"a": {"cpu": "x"}}}', b'{"decayed": [1]}', b"[]"):
        fresh = Usage.load(junk, HOUR, now=50.0)
        assert fresh.decayed == {} and fresh.at == 50.0, junk
    negative = Usage.load(b'{"at": 10, "decayed": {"a": {"cpu": -5, "memory": 3}}}', HOUR, now=50.0)
    assert negative.decayed == {"a": {"memory": 3.0}}
    future = Usage.load(b'{"at": 1e12, "decayed": {}}', HOUR, now=50.0)
    assert future.at == 50.0  # a clock ahead is not trusted


def test_dominant_share_ignores_what_the_cluster_does_not_have():
    assert dominant_share({"cpu": 5, "gpu": 2}, {"cpu": 10, "gpu": 0}) == 0.5
    assert dominant_share({}, {}) == 0.0
