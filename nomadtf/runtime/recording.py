"""The writes a task's decisions depend on, each retried with bounded backoff
(consulhttp.retrying) and given up early only on a stop signal: the run's outcome until
recovery.deadline (at least a minute), our session for the server retry budget
(deadline.py), our new incarnation for a minute. `Membership` (membership.py) builds the
cluster on these.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from nomadtf import wire
from nomadtf.errors import CannotRecord, ServerError
from nomadtf.job.outcome import failed_state
from nomadtf.job.spec import JobSpec
from nomadtf.runtime import deadline
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.servers.consulhttp import retrying

log = logging.getLogger("nomadtf.task")


def new_incarnation() -> str:
    """A new id for our TensorFlow process's state: peers that depend on it see it change."""
    return uuid.uuid4().hex[:12]


@dataclass
class Identity:
    role: str
    alloc_id: str
    alloc_index: int
    incarnation: str
    index: int = -1  # the index we hold; -1 until claimed

    @property
    def recorded_index(self) -> int:
        """The index a failure is recorded against: ours once claimed, Nomad's before."""
        return self.index if self.index >= 0 else self.alloc_index


class Recording:
    """Usage: the base of Membership (one thread: the supervisor's loop)."""

    def __init__(self, spec: JobSpec, identity: Identity, discovery: ConsulDiscovery, should_stop: Callable[[], bool] = lambda: False):
        self.spec = spec
        self.me = identity
        self.discovery = discovery
        self.should_stop = should_stop  # a retry gives up once it says so (a stop signal)
        # Called with the state once this task has recorded the run's outcome (the archive
        # and notify: childcare._on_recorded). It must not raise.
        self.on_recorded: Callable[[str], None] = lambda state: None

    def open_session(self) -> None:
        """Our Consul session, retried for the server retry budget; a Consul still away after
        it is a failure Consul cannot hold: CannotRecord (exit 78) names the address.

        PUT /v1/session/create
        """
        name = wire.session_name(self.spec.name, self.me.role, self.me.alloc_id)
        self.consul_or_give_up(lambda: self.discovery.open_session(name), "opening a Consul session")

    def consul_or_give_up(self, call, what: str):
        """A start-up step that needs Consul, retried for the server retry budget; a Consul
        still away after it is a failure Consul cannot hold: CannotRecord (exit 78) names
        the address."""
        budget = deadline.server_retry_s()
        try:
            return self.retry(call, what, budget)
        except ServerError as exc:
            raise CannotRecord(
                f"{exc}; tried Consul at {self.consul_address()} for {budget:.0f}s: check discovery.consul_address "
                "(CONSUL_HTTP_ADDR), its scheme (https for a TLS-only port) and discovery.consul_ca_file"
            ) from None

    def announce_restart(self) -> None:
        """A new incarnation in our slot, so that peers that depend on our state restart too;
        retried for a minute.

        PUT .../cluster/slots/<role>/<i>?acquire=<session>
        """
        incarnation = new_incarnation()

        def announce() -> None:
            self.me.incarnation = incarnation
            self.discovery.update_incarnation(self.me.role, self.me.index, self.me.alloc_id, incarnation)

        self.retry(announce, "telling peers we restarted")

    # ---- the run's outcome ------------------------------------------------------------------

    def recorded_state(self) -> str | None:
        """The run's recorded state ("succeeded", "failed: <why>", None), retried for 10 s;
        None also when Consul stays away that long. GET .../cluster/state"""
        try:
            return self.retry(self.discovery.job_state, "reading the job state", deadline_s=10.0)
        except ServerError:
            return None

    def record(self, state: str, what: str, deadline_s: float | None = None) -> None:
        """Record the run's outcome. A decision is never dropped: while Consul is away it is
        retried until the job's deadline (at least a minute), and only then given up.

        PUT .../cluster/state
        """
        budget = deadline_s or deadline.decision_retry_s(self.spec, time.time())
        self.retry(lambda: self.discovery.set_job_state(state), what, budget)
        self.on_recorded(state)

    def record_failure(self, code: int, why: str) -> None:
        """Mark the job failed by our task (`failed: <role>[<i>] exited <code>, <why>`). PUT .../cluster/state"""
        self.record(failed_state(self.me.role, self.me.recorded_index, code, why), "marking the job failed")

    def mark_done(self) -> set[tuple[str, int]]:
        """Record that our code finished (success = all_workers); every task finished so far.
        Retried until the job's deadline.

        PUT .../cluster/done/<role>/<i> ; GET .../cluster/done/?recurse
        """
        return self.retry(lambda: self.discovery.mark_done(self.me.role, self.me.index), "recording that we finished",
                          deadline.decision_retry_s(self.spec, time.time()))

    def retry(self, call, what: str, deadline_s: float = 60.0):
        """`call()`, retried on a Consul error with bounded backoff for `deadline_s`."""
        for attempt in retrying(deadline_s, give_up=self.should_stop):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    log.warning("Consul at %s: retrying %s (attempt %d)", self.consul_address(), what, attempt.retry_state.attempt_number)
                return call()
        raise AssertionError("unreachable")  # tenacity re-raises the last error

    def consul_address(self) -> str:
        http = getattr(self.discovery.consul, "http", None)
        return str(getattr(http, "base_uri", "")) or os.environ.get("CONSUL_HTTP_ADDR", "127.0.0.1:8500")
