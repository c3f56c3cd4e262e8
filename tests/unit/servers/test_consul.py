"""Bounded retries for the Consul writes a failure path depends on (discovery.retrying)."""

from __future__ import annotations

import time
import types

import consul
import pytest
import requests

from nomadtf.errors import SpecError, UnreachableError
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.servers.consulhttp import retrying


def _flaky(failures: int):
    calls = []

    def call():
        calls.append(time.monotonic())
        if len(calls) <= failures:
            raise UnreachableError("cannot reach Consul (writing job state): ConnectionError")
        return "done"

    return call, calls


def _run(retryer, call):
    for attempt in retryer:
        with attempt:
            return call()


def test_a_consul_outage_in_a_failure_path_is_retried_until_it_passes():
    call, calls = _flaky(3)
    assert _run(retrying(deadline_s=30), call) == "done"
    assert len(calls) == 4


def test_retries_are_bounded_and_reraise_the_last_error():
    call, calls = _flaky(10_000)
    started = time.monotonic()
    with pytest.raises(UnreachableError):
        _run(retrying(deadline_s=1.0), call)
    assert time.monotonic() - started < 4
    assert len(calls) >= 2


def test_a_stop_signal_ends_the_retries_at_once():
    call, calls = _flaky(10_000)
    with pytest.raises(UnreachableError):
        _run(retrying(deadline_s=60, give_up=lambda: len(calls) >= 2), call)
    assert len(calls) == 2


def test_only_server_errors_are_retried():
    calls = []

    def call():
        calls.append(1)
        raise SpecError("not a Consul problem")

    with pytest.raises(SpecError):
        _run(retrying(deadline_s=30), call)
    assert len(calls) == 1


def test_an_unreachable_consul_is_one_clear_error():
    import consul

    d = ConsulDiscovery("j", client=consul.Consul(host="127.0.0.1", port=1))
    with pytest.raises(UnreachableError, match=r"cannot reach Consul \(writing job state\)"):
        d.set_job_state("succeeded")


class _Sessions:
    """py-consul's session API as a Consul that answers with `outcome` (None: renewed)."""

    def __init__(self, outcome: Exception | None):
        self.outcome = outcome

    def renew(self, session_id):
        if self.outcome is not None:
            raise self.outcome
        return {"ID": session_id}


def _discovery(outcome: Exception | None) -> ConsulDiscovery:
    d = ConsulDiscovery("job", client=types.SimpleNamespace(session=_Sessions(outcome)))
    d.session, d.renewed_at = "s1", 0.0
    return d


def test_a_renewal_consul_accepts_moves_the_time_the_fence_counts_from():
    d = _discovery(None)
    before = time.monotonic()
    assert d.renew_session() is True
    assert before <= d.renewed_at <= time.monotonic()


def test_a_session_consul_no_longer_has_is_said_and_the_time_stays():
    d = _discovery(consul.NotFound("Session id 's1' not found"))
    assert d.renew_session() is False
    assert d.renewed_at == 0.0


def test_a_consul_that_cannot_be_reached_is_an_error_and_the_time_stays():
    d = _discovery(requests.ConnectionError("refused"))
    with pytest.raises(UnreachableError):
        d.renew_session()
    assert d.renewed_at == 0.0
