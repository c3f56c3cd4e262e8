"""The admission controller's metrics, in Prometheus's text format (prometheus-client), on
each replica's `metrics` port (`admission serve --metrics-port`; `deploy` gives it one and
registers it as the Nomad service `nomadtf-admission`).

| metric | type | labels |
|---|---|---|
| nomadtf_admission_leader | gauge | 1 on the replica that leads |
| nomadtf_admission_queued_runs | gauge | namespace |
| nomadtf_admission_admissions_total | counter | namespace |
| nomadtf_admission_refusals_total | counter | namespace |
| nomadtf_admission_give_backs_total | counter | namespace (not placed whole within the gang timeout) |
| nomadtf_admission_preemptions_total | counter | namespace (of the run preempted) |
| nomadtf_admission_wait_seconds | histogram | namespace (time in the queue, at admission) |
| nomadtf_admission_quota_used | gauge | namespace, resource (cpu MHz, memory MB, gpu) |
| nomadtf_admission_quota_nominal | gauge | namespace, resource (listed namespaces with a nominal quota) |
| nomadtf_admission_usage_share | gauge | namespace (remembered dominant share, 0–1) |

A registry of its own per controller (a test may run several in one process).

Usage:
    metrics = Metrics()
    metrics.serve(port, address)           # a daemon thread
    metrics.admitted("team-a", waited_s)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from nomadtf.admission import usage
from nomadtf.admission.policy import Policy
from nomadtf.job.capacity import Resources

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 86400)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._known: dict[int, set[tuple[str, ...]]] = {}  # gauge -> the label values it was set for
        r = self.registry
        self.leader = Gauge("nomadtf_admission_leader", "1 on the replica that leads admission", registry=r)
        self.queued = Gauge("nomadtf_admission_queued_runs", "Runs waiting in the queue", ["namespace"], registry=r)
        self.admissions = Counter("nomadtf_admission_admissions", "Runs admitted", ["namespace"], registry=r)
        self.refusals = Counter("nomadtf_admission_refusals", "Runs refused (they can never fit)", ["namespace"], registry=r)
        self.give_backs = Counter("nomadtf_admission_give_backs", "Admitted runs given back: not placed whole in time", ["namespace"], registry=r)
        self.preemptions = Counter("nomadtf_admission_preemptions", "Runs preempted: suspended whole and queued again", ["namespace"], registry=r)
        self.wait = Histogram("nomadtf_admission_wait_seconds", "Time in the queue, at admission", ["namespace"], buckets=WAIT_BUCKETS, registry=r)
        self.quota_used = Gauge("nomadtf_admission_quota_used", "What a namespace's batch work holds and its admitted runs wait for",
                                ["namespace", "resource"], registry=r)  # fmt: skip
        self.quota_nominal = Gauge("nomadtf_admission_quota_nominal", "A namespace's nominal quota", ["namespace", "resource"], registry=r)
        self.usage_share = Gauge("nomadtf_admission_usage_share", "A namespace's remembered dominant share of the cluster", ["namespace"],
                                 registry=r)  # fmt: skip

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        prometheus_client.disable_created_metrics()  # no *_created series beside each counter
        start_http_server(port, address, registry=self.registry)

    def leading(self, leads: bool) -> None:
        self.leader.set(1.0 if leads else 0.0)

    def admitted(self, namespace: str, waited_s: float) -> None:
        self.admissions.labels(namespace).inc()
        self.wait.labels(namespace).observe(max(0.0, waited_s))

    def refused(self, namespace: str) -> None:
        self.refusals.labels(namespace).inc()

    def preempted(self, namespace: str) -> None:
        self.preemptions.labels(namespace).inc()

    def gave_back(self, namespace: str) -> None:
        self.give_backs.labels(namespace).inc()

    def observe(self, queued: Iterable[str], committed: Mapping[str, Resources], policy: Policy, shares: Mapping[str, float]) -> None:
        """The gauges, as of this step: queued runs per namespace (`queued`: one namespace per
        run), quota use, nominal quotas, remembered shares. A namespace gone is set to 0."""
        counts: dict[str, int] = {}
        for namespace in queued:
            counts[namespace] = counts.get(namespace, 0) + 1
        self._set(self.queued, {(ns,): float(n) for ns, n in counts.items()})
        used = {(ns, dim): value for ns, held in committed.items() for dim, value in usage.dimensions(held).items()}
        self._set(self.quota_used, used)
        nominal = {}
        for namespace, share in policy.namespaces.items():
            if share.nominal is None:
                continue
            for dim, value in (("cpu", share.nominal.cpu), ("memory", share.nominal.memory)):
                if value is not None:
                    nominal[(namespace, dim)] = float(value)
            for name, count in share.nominal.devices.items():
                nominal[(namespace, name)] = float(count)
        self._set(self.quota_nominal, nominal)
        self._set(self.usage_share, {(ns,): value for ns, value in shares.items()})

    def _set(self, gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
        """Every labelled child to its value; one set before and not listed now to 0 (a scrape
        then sees the namespace's queue empty rather than a stale count)."""
        known = self._known.setdefault(id(gauge), set())
        for labels in known - set(values):
            gauge.labels(*labels).set(0.0)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        known |= set(values)
