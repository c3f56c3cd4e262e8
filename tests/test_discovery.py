"""Index claims and the job generation against the real Consul of the local stack."""

from __future__ import annotations

import pytest

from nomadtf.discovery import ConsulDiscovery
from tests.helpers import unique

pytestmark = pytest.mark.stack


@pytest.fixture
def job_id(stack):
    name = unique("disc")
    yield name
    ConsulDiscovery(name).delete_job_keys()


def _claimant(job_id: str) -> ConsulDiscovery:
    d = ConsulDiscovery(job_id)
    d.open_session("test")
    return d


def test_a_repeated_alloc_index_still_gives_unique_indexes(job_id):
    first, second, third = (_claimant(job_id) for _ in range(3))
    try:
        # Both say NOMAD_ALLOC_INDEX=0 (a canary or an overlapping reschedule).
        assert first.claim_slot("worker", 2, "alloc-a", 0, "i1") == 0
        assert second.claim_slot("worker", 2, "alloc-b", 0, "i1") == 1
        assert third.claim_slot("worker", 2, "alloc-c", 0, "i1") is None
        slots = first.slots()
        assert {k: v.alloc_id for k, v in slots.items()} == {("worker", 0): "alloc-a", ("worker", 1): "alloc-b"}
    finally:
        for d in (first, second, third):
            d.close()


def test_a_restarted_task_takes_back_its_own_slot_and_a_dead_one_frees_it(job_id):
    before = _claimant(job_id)
    assert before.claim_slot("ps", 1, "alloc-a", 0, "i1") == 0
    # Same allocation, new process (the old session is still alive, as after kill -9).
    after = _claimant(job_id)
    try:
        assert after.claim_slot("ps", 1, "alloc-a", 0, "i2") == 0
        assert after.slots()[("ps", 0)].incarnation == "i2"
        after.close()  # session destroyed -> the lock key is deleted
        other = _claimant(job_id)
        assert other.claim_slot("ps", 1, "alloc-z", 0, "i1") == 0
        other.close()
    finally:
        before.close()


def test_generation_moves_once_per_fingerprint(job_id):
    a, b = ConsulDiscovery(job_id), ConsulDiscovery(job_id)
    g1 = a.bump_generation("F1")
    assert b.bump_generation("F1") == g1  # the second task sees the first one's bump
    g2 = b.bump_generation("F2")
    assert g2["generation"] == g1["generation"] + 1
    assert a.generation()[0]["fingerprint"] == "F2"


def test_job_state_and_progress_round_trip(job_id):
    d = ConsulDiscovery(job_id)
    assert d.job_state() is None
    d.set_job_state("succeeded")
    d.publish_progress({"step": 7, "metrics": {"loss": 0.5}})
    assert d.job_state() == "succeeded"
    assert d.progress()["step"] == 7
