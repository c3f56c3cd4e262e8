"""The leader's start estimates for the queued runs (estimate.py does the planning): what
runs now and when it ends, from Nomad's allocations, the runs' Meta (`nomadtf.steps`,
`nomadtf.duration`) and their progress records; refreshed every ESTIMATE_S.

Usage:
    forecast = Forecast(consul_client)
    forecast.update(now, jobs, allocs, nodes, queued_in_order, in_flight_keys)   # each step
    forecast.starts.get(ticket)      # unix time, or None
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import consul

from nomadtf import wire
from nomadtf.admission import estimate, fit, suspension
from nomadtf.admission.order import QueuedRun
from nomadtf.admission.preemption import progress_numbers
from nomadtf.errors import ServerError
from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, Job, Node

ESTIMATE_S = 3.0
MAX_META_NUMBER = 1e12  # steps or seconds: beyond it, nothing a run could mean
MAX_PLANNED = 50  # the first runs in line get an estimate; further back, none


def _number(meta: Mapping[str, Any], key: str) -> float | None:
    """A positive, finite number from the job's Meta (the team's own to write), else None."""
    try:
        value = float(meta[key])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return value if 0 < value < MAX_META_NUMBER else None


class Forecast:
    def __init__(self, client: consul.Consul):
        self.consul = client
        self.starts: dict[str, float | None] = {}  # ticket -> estimated start
        self.rates: dict[tuple[str, str, str], tuple[tuple[int, float], tuple[int, float]]] = {}  # run -> (first, last) report
        self.requests = 0
        self._at = 0.0

    def update(self, now: float, jobs: Mapping[tuple[str, str], Job], allocs: list[Allocation], nodes: list[Node],
               queued: Iterable[QueuedRun], in_flight: Iterable[tuple[str, str]]) -> None:  # fmt: skip
        """GET .../progress per running nomadtf run that declares its steps"""
        if now - self._at < ESTIMATE_S:
            return
        self._at = now
        rooms = fit.node_rooms([n for n in nodes if n.usable], allocs)
        free = capacity.total(capacity.Resources(max(r.cpu, 0), max(r.memory, 0), {k: max(v, 0) for k, v in r.devices.items()}) for r in rooms)
        held: dict[tuple[str, str], list[Allocation]] = {}
        for alloc in allocs:
            if alloc.holds_resources:
                held.setdefault(alloc.key, []).append(alloc)
        holding = [estimate.Holding(capacity.total(a.resources for a in own), self._end(key, jobs.get(key), own))
                   for key, own in held.items()]  # fmt: skip
        waiting = []
        for run in list(queued)[:MAX_PLANNED]:
            assert run.ask is not None
            job = jobs.get(run.key)
            ticket = wire.queue_ticket(run.namespace, run.job_id, run.run_id)
            if run.key in in_flight:  # admitted, not placed yet: it holds its room from now
                holding.append(estimate.Holding(run.ask.needs, self._end(run.key, job, [])))
                continue
            waiting.append(estimate.Planned(ticket, run.ask.needs, _number(job.meta if job else {}, wire.META_DURATION)))
        self.starts = {str(k): v for k, v in estimate.plan(free, holding, waiting, now).items()}
        live = {(ns, job_id, j.run_id) for (ns, job_id), j in jobs.items()}
        self.rates = {k: v for k, v in self.rates.items() if k in live}

    def _end(self, key: tuple[str, str], job: Job | None, own: list[Allocation]) -> float | None:
        """When a running job ends (None: not known): a nomadtf run's step rate against its
        declared steps, or its declared duration from its first allocation's creation."""
        if job is None or suspension.state(job.document) not in (suspension.ADMITTED, suspension.ADMITTING):
            return None
        meta, run_id = job.meta, job.run_id
        steps = _number(meta, wire.META_STEPS)
        first = last = None
        if steps:
            report = self._progress(key, run_id)
            if report is not None:
                first, _ = self.rates.get((*key, run_id), (report, report))
                self.rates[(*key, run_id)] = (first, report)
                last = report
        started = min((a.create_time / 1e9 for a in own), default=None) or time.time()
        return estimate.end_of(int(steps) if steps else None, first, last, started, _number(meta, wire.META_DURATION))

    def _progress(self, key: tuple[str, str], run_id: str) -> tuple[int, float] | None:
        """(step, unix time) of the run's latest progress record.  GET .../progress"""
        from nomadtf.servers.consul import ConsulDiscovery

        try:
            record = ConsulDiscovery(key[1], key[0], client=self.consul, run_id=run_id).progress()
        except (ServerError, ValueError):
            return None
        self.requests += 1
        step, _, at = progress_numbers(record)
        return (step, at) if step is not None and at is not None else None
