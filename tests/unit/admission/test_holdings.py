"""What runs hold now, read from Nomad's allocations (typed views, nomadtf/job/answers.py):
the quota's per-namespace batch holdings (bookkeeping.batch_held) and the running jobs the
start forecast waits on (forecast.Forecast). Pure: no Consul call is made for runs that
declare no steps."""

from __future__ import annotations

from dataclasses import replace

from nomadtf import wire
from nomadtf.admission import bookkeeping, suspension
from nomadtf.admission.forecast import Forecast
from nomadtf.admission.order import QueuedRun
from nomadtf.job.answers import Job
from tests.unit.admission.test_fit import alloc, ask, group, node

NOW = 1_800_000_000.0


def test_batch_held_counts_running_batch_allocations_per_namespace():
    allocs = [
        alloc("n1", 1000, 500, namespace="team-a"),
        alloc("n2", 2000, 700, namespace="team-a", gpus=1),
        alloc("n1", 500, 100, namespace="team-b"),
        alloc("n1", 4000, 4000, namespace="team-b", status="complete"),  # gave its room back
        alloc("n2", 3000, 3000, namespace="team-b", job_type="service"),  # long-lived: outside the queue
    ]
    held = bookkeeping.batch_held(allocs)
    assert set(held) == {"team-a", "team-b"}
    assert (held["team-a"].cpu, held["team-a"].memory) == (3000, 1200)
    assert sum(held["team-a"].devices.values()) == 1
    assert (held["team-b"].cpu, held["team-b"].memory) == (500, 100)


def test_batch_held_is_empty_without_allocations():
    assert bookkeeping.batch_held([]) == {}


def running_job(job_id: str, duration_s: float) -> Job:
    return Job.from_api({"ID": job_id, "Namespace": "default",
                         "Meta": {suspension.META_ADMISSION: suspension.SUSPENDED, wire.META_DURATION: str(duration_s)},
                         "TaskGroups": [{"Name": "g", "Count": 1}, {"Name": suspension.PLACEHOLDER_GROUP, "Count": 0}]})  # fmt: skip


def queued(job_id: str, needs_cpu: int) -> QueuedRun:
    return QueuedRun("team-a", job_id, f"{job_id}-run", 50, 1, NOW, 1, {"g": 1}, 30.0, ask(group("g", cpu=needs_cpu), job_id=job_id))


def test_the_forecast_starts_a_queued_run_when_the_running_job_holding_its_room_ends():
    started = NOW - 40
    holder = alloc("n1", 3000, 1000, job="holder")
    holder = replace(holder, create_time=int(started * 1e9))
    jobs = {("default", "holder"): running_job("holder", 100)}
    forecast = Forecast(None)  # type: ignore[arg-type]  (no steps declared: no progress read)
    forecast.update(NOW, jobs, [holder], [node("n1", cpu=4000, memory=8000)], [queued("next", 2000)], [])
    start = forecast.starts[wire.queue_ticket("team-a", "next", "next-run")]
    assert start is not None and abs(start - (started + 100)) < 1e-3
    assert forecast.requests == 0


def test_the_forecast_starts_a_run_that_fits_beside_the_holder_now():
    holder = alloc("n1", 1000, 1000, job="holder")
    jobs = {("default", "holder"): running_job("holder", 100)}
    forecast = Forecast(None)  # type: ignore[arg-type]
    forecast.update(NOW, jobs, [holder], [node("n1", cpu=4000, memory=8000)], [queued("next", 2000)], [])
    assert forecast.starts[wire.queue_ticket("team-a", "next", "next-run")] == NOW


def test_a_complete_allocation_holds_nothing_for_the_forecast():
    done = alloc("n1", 3000, 1000, job="holder", status="complete")
    forecast = Forecast(None)  # type: ignore[arg-type]
    forecast.update(NOW, {}, [done], [node("n1", cpu=4000, memory=8000)], [queued("next", 2000)], [])
    assert forecast.starts[wire.queue_ticket("team-a", "next", "next-run")] == NOW
