"""The supervisor's pure decisions: who restarts, how exits are classed, the debounce."""

from __future__ import annotations

import pytest

from nomadtf.cluster import Member
from nomadtf.errors import TaskError
from nomadtf.task import AllocInfo, Settled, completes_job, exit_class, fingerprint, must_restart


def ps_cluster(**changes):
    members = {
        ("chief", 0): Member("chief", 0, "10.0.0.1:100", "a/1"),
        ("worker", 0): Member("worker", 0, "10.0.0.2:100", "b/1"),
        ("worker", 1): Member("worker", 1, "10.0.0.3:100", "c/1"),
        ("ps", 0): Member("ps", 0, "10.0.0.4:100", "d/1"),
    }
    for key, member in changes.items():
        role, index = key.rsplit("_", 1)
        members[(role, int(index))] = member
    return sorted(members.values())


def test_chief_restarts_when_a_worker_moves_but_not_when_it_restarts_in_place():
    old = ps_cluster()
    moved = ps_cluster(worker_1=Member("worker", 1, "10.0.0.9:200", "e/1"))
    in_place = ps_cluster(worker_1=Member("worker", 1, "10.0.0.3:100", "c/2"))
    assert must_restart("parameter_server", "chief", 0, old, moved)
    assert not must_restart("parameter_server", "chief", 0, old, in_place)


def test_chief_restarts_when_a_parameter_server_loses_its_state():
    old = ps_cluster()
    ps_restarted = ps_cluster(ps_0=Member("ps", 0, "10.0.0.4:100", "d/2"))
    assert must_restart("parameter_server", "chief", 0, old, ps_restarted)


@pytest.mark.parametrize("role", ["worker", "ps", "evaluator"])
def test_bare_servers_and_the_evaluator_never_restart_for_a_peer(role):
    old = ps_cluster()
    new = ps_cluster(ps_0=Member("ps", 0, "10.0.0.8:300", "f/1"), worker_0=Member("worker", 0, "10.0.0.7:1", "g/1"))
    assert not must_restart("parameter_server", role, 0, old, new)


def test_mirrored_workers_restart_together_except_for_their_own_change():
    old = [Member("worker", 0, "h:1", "a/1"), Member("worker", 1, "h:2", "b/1")]
    peer_crashed = [Member("worker", 0, "h:1", "a/1"), Member("worker", 1, "h:2", "b/2")]
    assert must_restart("multi_worker_mirrored", "worker", 0, old, peer_crashed)
    assert not must_restart("multi_worker_mirrored", "worker", 1, old, peer_crashed)
    assert not must_restart("multi_worker_mirrored", "worker", 0, old, list(old))


def test_legacy_user_code_restarts_for_a_moved_peer():
    old = [Member("worker", 0, "h:1", "a/1"), Member("ps", 0, "h:3", "c/1")]
    moved = [Member("worker", 0, "h:1", "a/1"), Member("ps", 0, "h:9", "d/1")]
    assert must_restart("legacy_server", "worker", 0, old, moved)
    assert not must_restart("legacy_server", "ps", 0, old, moved)


@pytest.mark.parametrize(
    ("code", "kind"),
    [(0, "ok"), (1, "permanent"), (2, "permanent"), (3, "retryable"), (137, "retryable"), (-9, "retryable"), (-15, "retryable")],
)
def test_exit_classes(code, kind):
    assert exit_class(code, [1, 2]) == kind


def test_who_completes_the_job():
    assert completes_job("parameter_server", "chief", 0, {"chief": 1, "worker": 2, "ps": 1})
    assert not completes_job("parameter_server", "worker", 0, {"chief": 1, "worker": 2, "ps": 1})
    assert completes_job("multi_worker_mirrored", "worker", 0, {"worker": 2})
    assert not completes_job("multi_worker_mirrored", "worker", 1, {"worker": 2})
    assert completes_job("multi_worker_mirrored", "chief", 0, {"chief": 1, "worker": 2})
    assert not completes_job("multi_worker_mirrored", "worker", 0, {"chief": 1, "worker": 2})


def test_fingerprint_ignores_order_and_sees_incarnations():
    a = ps_cluster()
    assert fingerprint(a) == fingerprint(list(reversed(a)))
    assert fingerprint(a) != fingerprint(ps_cluster(ps_0=Member("ps", 0, "10.0.0.4:100", "d/2")))


def test_debounce_waits_for_a_change_to_hold():
    settled = Settled(1.5)
    assert not settled.observe("x", 0.0)
    assert not settled.observe("x", 1.0)
    assert not settled.observe("y", 1.2)  # flapped: the clock starts again
    assert not settled.observe("y", 2.0)
    assert settled.observe("y", 2.8)


def test_alloc_info_needs_nomads_environment():
    with pytest.raises(TaskError, match="NOMAD_JOB_ID is not set"):
        AllocInfo.from_environ({})
    info = AllocInfo.from_environ(
        {"NOMAD_JOB_ID": "j", "NOMAD_ALLOC_ID": "a", "NOMAD_ALLOC_INDEX": "2", "NOMAD_PORT_tf": "1", "NOMAD_PORT_health": "2"}
    )
    assert info.alloc_index == 2 and info.tf_port == 1
