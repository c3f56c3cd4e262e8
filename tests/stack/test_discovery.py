"""Index claims and the job generation against the real Consul of the local stack."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from nomadtf.devstack import stack as stack_mod
from nomadtf.servers.consul import ConsulDiscovery
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


def test_a_restarted_supervisor_takes_back_its_own_index_before_its_preference(job_id):
    first = _claimant(job_id)
    try:
        # alloc-a was told NOMAD_ALLOC_INDEX=0 but index 0 was taken, so it holds 1.
        holder = _claimant(job_id)
        assert holder.claim_slot("worker", 2, "alloc-x", 0, "i1") == 0
        assert first.claim_slot("worker", 2, "alloc-a", 0, "i1") == 1
        holder.close()  # index 0 is free now
        again = _claimant(job_id)  # alloc-a's supervisor restarts (kill -9: old session still alive)
        try:
            assert again.claim_slot("worker", 2, "alloc-a", 0, "i2") == 1  # its own index, not the free 0
        finally:
            again.close()
    finally:
        first.close()


def test_reopening_a_session_keeps_one_renewer_thread(job_id):
    d = _claimant(job_id)
    try:
        first = d.session
        for _ in range(3):
            d.reopen_session()  # what a task does after a Consul restart
        assert d.session != first
        assert d.renewer_threads() == 1
        assert sum(t.name == "consul-session" and t.is_alive() for t in threading.enumerate()) == 1
    finally:
        d.close()
    assert d.renewer_threads() == 0


def test_progress_writes_wake_no_watcher_but_state_does(job_id):
    d = ConsulDiscovery(job_id)
    d.set_job_state("running")
    index = d.wait_for_cluster_kv_change(0, 1)
    woke: list[float] = []

    def watch():
        start = time.monotonic()
        d.wait_for_cluster_kv_change(index, 3)
        woke.append(time.monotonic() - start)

    t = threading.Thread(target=watch)
    t.start()
    for step in range(5):
        d.publish_progress({"step": step})
    t.join()
    assert woke[0] >= 2.5, f"a progress write woke the cluster watch after {woke[0]:.2f}s"
    t = threading.Thread(target=watch)
    woke.clear()
    t.start()
    time.sleep(0.3)
    d.set_job_state("succeeded")
    t.join()
    assert woke[0] < 2.0


def test_namespaces_keep_same_named_jobs_apart(job_id):
    a, b = ConsulDiscovery(job_id, "team-a"), ConsulDiscovery(job_id, "team-b")
    try:
        a.set_job_state("succeeded")
        assert b.job_state() is None
        assert a.service_name("chief") != b.service_name("chief") != ConsulDiscovery(job_id).service_name("chief")
    finally:
        a.delete_job_keys()
        b.delete_job_keys()


def test_one_read_serves_a_whole_step_and_a_write_inside_drops_it(job_id):
    """Inside `one_read`, state, counts, slots and generation cost no request; after a write
    inside it, reads ask Consul again and see the write."""
    d = _claimant(job_id)
    try:
        assert d.claim_slot("worker", 2, "alloc-a", 0, "i1") == 0
        d.set_job_state("running-for-the-test")
        d.bump_generation("fp-1")
        reads = []
        real_get = d.consul.kv.get

        def counting_get(*args, **kwargs):
            reads.append(args[0])
            return real_get(*args, **kwargs)

        d.consul.kv.get = counting_get
        with d.one_read():
            assert len(reads) == 1 and reads[0].endswith("/cluster/")
            assert d.job_state() == "running-for-the-test"
            assert d.generation()[0]["fingerprint"] == "fp-1"
            assert {k: v.alloc_id for k, v in d.slots().items()} == {("worker", 0): "alloc-a"}
            assert d.counts() == {}
            assert len(reads) == 1
            ConsulDiscovery(job_id).set_job_state("changed-by-a-peer")
            assert d.job_state() == "running-for-the-test"  # the step's one view
            d.bump_generation("fp-2")  # a write: the view is gone
            assert d.job_state() == "changed-by-a-peer"
            assert d.generation()[0]["fingerprint"] == "fp-2"
        calls = len(reads)
        d.job_state()
        assert len(reads) == calls + 1  # outside: every read asks
    finally:
        d.close()


def test_a_service_watch_answers_the_members_read_and_wakes_only_on_its_service(job_id):
    """The per-role watch keeps what it saw: members come from it, without another request;
    another service's registration does not wake it."""
    d = _claimant(job_id)
    consul = f"http://{stack_mod.CONSUL_ADDR}"
    own, other = d.service_name("worker"), f"{job_id}-unrelated"
    try:
        index = d.wait_for_service_change("worker", 0, 1)
        assert d.passing_instances("worker") == {}
        woke = {}

        def watch():
            started = time.monotonic()
            woke["index"] = d.wait_for_service_change("worker", index, 5)
            woke["after"] = time.monotonic() - started

        thread = threading.Thread(target=watch)
        thread.start()
        time.sleep(0.3)
        requests.put(f"{consul}/v1/agent/service/register", json={"Name": other, "ID": other, "Port": 1}, timeout=5).raise_for_status()
        time.sleep(1.0)
        assert thread.is_alive(), "another service's registration woke the worker watch"
        requests.put(f"{consul}/v1/agent/service/register", timeout=5, json={
            "Name": own, "ID": own, "Address": "127.0.0.9", "Port": 4242, "Tags": ["alloc=alloc-a"]}).raise_for_status()
        thread.join(10)
        assert woke["after"] < 4.5, "the worker watch slept through its own service's registration"
        d.consul.health.service = None  # any further request for it would fail
        assert d.passing_instances("worker") == {"alloc-a": "127.0.0.9:4242"}
    finally:
        for service in (own, other):
            requests.put(f"{consul}/v1/agent/service/deregister/{service}", timeout=5)
        d.close()
