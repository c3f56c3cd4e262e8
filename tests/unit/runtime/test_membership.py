"""Membership's decisions over what Consul says (nomadtf.runtime.membership), with a stand-in
for ConsulDiscovery that answers from memory: when a change of peers counts, what our slot
says about us, role counts after `nomadtf scale`, and the retries of the writes a decision
depends on. The same calls against the real Consul run in tests/stack/test_task.py."""

from __future__ import annotations

import logging
import time

import pytest

from nomadtf.errors import ConsulError, ServerError
from nomadtf.job.spec import JobSpec
from nomadtf.job.validate import normalize
from nomadtf.runtime.membership import Membership, Settled
from nomadtf.runtime.policy import SlotState, fingerprint
from nomadtf.runtime.recording import Identity
from nomadtf.servers.consul import Slot
from nomadtf.tfconfig import Member

SPEC = JobSpec.from_normalized({
    **normalize({"name": "j", "entrypoint": {"script": "t.py"}, "discovery": {"debounce": "2s"},
                 "roles": {"chief": {"count": 1}, "worker": {"count": 2}, "ps": {"count": 1}}}),
    "run": {"id": "r1", "submitted_at": time.time()},
})
CLUSTER = [Member("chief", 0, "h:1", "a/1"), Member("ps", 0, "h:2", "b/1"), Member("worker", 0, "h:3", "c/1"), Member("worker", 1, "h:4", "d/1")]


class Discovery:
    """What Membership asks of ConsulDiscovery, answered from memory."""

    def __init__(self):
        self.generation_value: dict = {}
        self.cluster = list(CLUSTER)
        self.slot_map: dict = {}
        self.scaled: dict = {}
        self.session = "s-1"
        self.consul = None
        self.states: list[str] = []
        self.failures = 0  # the next writes that fail as Consul away would
        self.reopened = 0
        self.queries: list[str] = []

    def generation(self):
        return dict(self.generation_value), 7

    def bump_generation(self, fp):
        if self.generation_value.get("fingerprint") != fp:
            self.generation_value = {"generation": self.generation_value.get("generation", 0) + 1, "fingerprint": fp}
        return dict(self.generation_value)

    def members(self, counts, slots):
        return list(self.cluster)

    def slots(self):
        return dict(self.slot_map)

    def counts(self):
        return dict(self.scaled)

    def claim_slot(self, role, count, alloc_id, preferred, incarnation):
        self.slot_map[(role, preferred)] = Slot(alloc_id, incarnation, self.session)
        return preferred

    def reopen_session(self):
        self.reopened += 1
        self.session = f"s-{self.reopened + 1}"

    def set_job_state(self, state):
        if self.failures:
            self.failures -= 1
            raise ConsulError("Consul answered 500")
        self.states.append(state)

    def open_generation(self):
        return self.generation_value.get("generation", 0), 7

    def wait_for_generation_change(self, index, wait_s):
        self.queries.append("generation")
        time.sleep(0.05)
        return index + 1

    def wait_for_service_change(self, role, index, wait_s):
        self.queries.append(f"service {role}")
        time.sleep(0.05)
        return index

    def wait_for_cluster_kv_change(self, index, wait_s):
        self.queries.append("cluster/")
        time.sleep(0.05)
        return index

    def close(self):
        pass


def _membership(role="worker", index=1, should_stop=lambda: False) -> tuple[Membership, Discovery]:
    discovery = Discovery()
    me = Identity(role, "alloc-me", index, "inc-1")
    return Membership(SPEC, me, discovery, cluster_file=None, should_stop=should_stop), discovery  # type: ignore[arg-type]


def test_a_change_of_peers_counts_once_it_has_held_for_the_debounce(caplog):
    membership, discovery = _membership()
    discovery.generation_value = {"generation": 1, "fingerprint": fingerprint(CLUSTER)}
    assert membership.settle(CLUSTER, now=100.0) == Settled(1, True)  # nothing changed: no write
    moved = [*CLUSTER[:3], Member("worker", 1, "h:9", "e/1")]
    with caplog.at_level(logging.INFO, logger="nomadtf.task"):
        assert membership.settle(moved, now=100.0) == Settled(0, False, look_again_at=102.0)
        assert membership.settle(moved, now=101.0).look_again_at == 102.0  # still holding: no new generation
        assert discovery.generation_value["generation"] == 1
        assert membership.settle(moved, now=102.0) == Settled(2, True)
    assert discovery.generation_value["fingerprint"] == fingerprint(moved)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("peers changed" in line for line in lines) == 1
    assert any(line.startswith("cluster changed: generation 2") for line in lines)


def test_a_missing_peer_stops_the_clock_and_its_return_starts_it_again():
    membership, discovery = _membership()
    discovery.generation_value = {"generation": 1, "fingerprint": fingerprint(CLUSTER)}
    moved = [*CLUSTER[:3], Member("worker", 1, "h:9", "e/1")]
    assert membership.settle(moved, now=100.0).look_again_at == 102.0
    assert membership.settle(CLUSTER[:3], now=101.0) is None  # worker[1] away: nothing to decide
    assert membership.settle(moved, now=102.5).look_again_at == 104.5  # back: the whole wait again


def test_our_slot_held_lost_or_taken():
    membership, discovery = _membership()
    assert membership.try_claim() and membership.me.index == 1
    assert membership.held_members(read_again=False) == CLUSTER
    # Consul forgot our session (it restarted): a new session, our index claimed back.
    discovery.session = "s-forgotten"
    assert membership.held_members(read_again=False) is SlotState.LOST
    assert discovery.reopened == 1 and discovery.slot_map[("worker", 1)].session == discovery.session
    discovery.session = "s-forgotten-again"
    assert membership.held_members(read_again=True) == CLUSTER  # rendezvous: the cluster at once
    # A replacement of ours holds the index now.
    discovery.slot_map[("worker", 1)] = Slot("alloc-replacement", "x", "s-other")
    assert membership.held_members(read_again=True) is SlotState.TAKEN


def test_scaled_counts_replace_the_submitted_ones_and_a_role_at_zero_stays_there():
    membership, discovery = _membership()
    assert membership.rescale() is SPEC  # never scaled: the spec as it came
    discovery.scaled = {"worker": 3, "ps": 2}
    assert membership.rescale().counts == {"chief": 1, "worker": 3, "ps": 2}
    assert membership.spec.counts["worker"] == 3  # what `missing` counts from now on
    assert membership.missing(CLUSTER) == ["worker[2]", "ps[1]"]
    discovery.scaled = {}
    assert membership.rescale().counts == SPEC.counts  # back to the submitted counts


def test_a_failure_is_recorded_against_our_index_or_before_the_claim_nomads():
    membership, discovery = _membership(index=1)
    membership.record_failure(1, "its code: entrypoint.script t.py not found")
    membership.try_claim()
    membership.me.index = 0  # the claim gave us another index than Nomad's
    membership.record_failure(3, "a permanent exit code")
    assert discovery.states == [
        "failed: worker[1] exited 1, its code: entrypoint.script t.py not found",
        "failed: worker[0] exited 3, a permanent exit code",
    ]


def test_a_decision_is_retried_while_consul_is_away(caplog):
    membership, discovery = _membership()
    discovery.failures = 2
    with caplog.at_level(logging.WARNING, logger="nomadtf.task"):
        membership.record("succeeded", "marking the job succeeded")
    assert discovery.states == ["succeeded"]
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "retrying marking the job succeeded (attempt 2)", "retrying marking the job succeeded (attempt 3)"]


def test_a_stop_signal_ends_the_retries_at_once():
    membership, discovery = _membership(should_stop=lambda: True)
    discovery.failures = 100
    started = time.monotonic()
    with pytest.raises(ServerError):
        membership.record("succeeded", "marking the job succeeded")
    assert time.monotonic() - started < 1.0 and discovery.failures == 99


def test_we_wait_for_the_roles_our_strategy_names():
    worker, _ = _membership("worker")
    assert set(worker.awaited_roles) == {"chief", "ps", "worker"}
    tensorboard, _ = _membership("tensorboard", 0)
    assert tensorboard.awaited_roles == ()


def _watched(membership: Membership) -> set[str]:
    """What the running watches ask Consul (each has answered at least once)."""
    discovery = membership.discovery
    discovery.queries.clear()
    time.sleep(0.2)
    return set(discovery.queries)


def test_while_the_cluster_forms_a_task_waits_on_the_generation_alone_until_it_is_the_last():
    membership, discovery = _membership()
    events = []
    membership.start_watches(events.append)
    try:
        assert membership.forming
        assert _watched(membership) == {"generation"}  # another task's arrival wakes nobody
        assert events and all(e.kind == "cluster-kv" for e in events)  # every answer is a look
        slots = {(r, i): Slot(f"a-{r}{i}", "x", "s", n) for n, (r, i) in enumerate((("chief", 0), ("ps", 0), ("worker", 0)))}
        membership.me.index = 1
        membership.watch_closely_if_needed(slots)  # worker[1] (we) has not claimed yet
        assert membership.forming and _watched(membership) == {"generation"}
        slots[("worker", 1)] = Slot("alloc-me", "x", "s", 1)
        membership.watch_closely_if_needed(slots)  # every slot is claimed, but ours not last: the last arrival watches
        assert membership.forming and _watched(membership) == {"generation"}
        slots[("worker", 1)] = Slot("alloc-me", "x", "s", 9)
        membership.watch_closely_if_needed(slots)  # ours is the last claim: we watch their checks
        assert not membership.forming
        assert _watched(membership) == {"service chief", "service worker", "service ps", "cluster/"}
    finally:
        membership.close()


def test_a_task_that_joins_a_formed_cluster_watches_everything_at_once():
    membership, discovery = _membership()
    discovery.generation_value = {"generation": 3, "fingerprint": fingerprint(CLUSTER)}
    membership.start_watches(lambda event: None)
    try:
        assert not membership.forming
        assert _watched(membership) == {"service chief", "service worker", "service ps", "cluster/"}
    finally:
        membership.close()


def test_tensorboard_waits_for_nobody_and_never_moves_the_generation():
    membership, discovery = _membership(role="tensorboard", index=0)
    discovery.generation_value = {"generation": 2, "fingerprint": "old"}
    assert membership.bump(CLUSTER[:2]) == 2  # a cluster still forming is not a generation
    assert membership.settle(CLUSTER[:2], now=100.0) == Settled(2, False)
    assert discovery.generation_value == {"generation": 2, "fingerprint": "old"}


def test_a_task_that_waited_long_with_every_slot_claimed_watches_too(monkeypatch):
    membership, discovery = _membership()
    membership.start_watches(lambda event: None)
    try:
        membership.me.index = 1
        slots = {(r, i): Slot(f"a-{r}{i}", "x", "s", n) for n, (r, i) in enumerate((("worker", 1), ("chief", 0), ("ps", 0), ("worker", 0)))}
        membership.watch_closely_if_needed(slots)
        assert membership.forming  # worker[0] claimed last: it watches
        membership.all_claimed_since -= 59.0
        membership.watch_closely_if_needed(slots)
        assert membership.forming  # not yet two waits since every slot was claimed
        membership.watch_closely_if_needed({k: v for k, v in slots.items() if k != ("worker", 0)})
        assert membership.all_claimed_since is None  # a slot went: the clock starts again when it is back
        membership.watch_closely_if_needed(slots)
        membership.all_claimed_since -= 61.0  # the last arrival died: nobody wrote the generation for two waits
        membership.watch_closely_if_needed(slots)
        assert not membership.forming
    finally:
        membership.close()


def test_a_task_that_finds_a_peer_missing_after_the_cluster_formed_watches_everything():
    membership, discovery = _membership()
    membership.start_watches(lambda event: None)
    try:
        assert membership.forming
        discovery.generation_value = {"generation": 1, "fingerprint": "formed"}  # the last arrival wrote it
        membership.watch_closely_if_needed({})  # a peer's check failed since: we must see it come back
        assert not membership.forming
        assert _watched(membership) == {"service chief", "service worker", "service ps", "cluster/"}
    finally:
        membership.close()
