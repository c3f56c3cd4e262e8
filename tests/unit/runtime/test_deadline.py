"""The task's time limits (nomadtf.runtime.deadline, pure)."""

from __future__ import annotations

import dataclasses

import pytest

from nomadtf.job import outcome
from nomadtf.job.spec import JobSpec
from nomadtf.job.validate import normalize
from nomadtf.runtime import deadline

ROLES = {"chief": {"count": 1}, "worker": {"count": 2}, "ps": {"count": 1}}


def _spec(submitted_at: float | None = 1000.0, deadline_s: str = "10m", **changes) -> JobSpec:
    normalized = normalize({"name": "j", "entrypoint": {"script": "t.py"}, "roles": ROLES, "recovery": {"deadline": deadline_s}, **changes})
    run = {"id": "r1", "submitted_at": submitted_at} if submitted_at is not None else None
    return JobSpec.from_normalized({**normalized, "run": run} if run else normalized)


def test_the_deadline_counts_from_the_submission_not_from_our_start():
    spec = _spec(submitted_at=1000.0, deadline_s="10m")
    assert deadline.seconds_left(spec, now=1000.0) == 600.0
    assert deadline.seconds_left(spec, now=1500.0) == 100.0
    assert deadline.seconds_left(spec, now=9999.0) == 0.0  # passed: at once, never negative
    assert deadline.seconds_left(_spec(submitted_at=None), now=1000.0) is None  # nothing to count from


@pytest.mark.parametrize(("admitted_at", "counts_from"), [
    (b"1500.250", 1500.25), ("1500", 1500.0),  # admitted 500 s after the submission: the queue's time is not counted
    (None, 1000.0), (b"", 1000.0), (b"soon", 1000.0), (b"\xff", 1000.0),  # no controller, or junk: from the submission
    (b"900", 1000.0), (b"1e12", 1000.0), (b"nan", 1000.0), (b"inf", 1000.0),  # before it, or absurdly late: not a time of this run
])  # fmt: skip
def test_a_run_the_admission_controller_queued_counts_its_deadline_from_its_admission(admitted_at, counts_from):
    spec = deadline.counting_from_admission(_spec(submitted_at=1000.0, deadline_s="10m"), admitted_at)
    assert spec.submitted_at == counts_from
    assert deadline.seconds_left(spec, now=counts_from + 100) == 500.0
    assert deadline.counting_from_admission(_spec(submitted_at=None), b"1500").submitted_at is None


def test_a_decision_is_retried_until_the_deadline_and_at_least_a_minute():
    spec = _spec(submitted_at=1000.0, deadline_s="10m")
    assert deadline.decision_retry_s(spec, now=1100.0) == 500.0
    assert deadline.decision_retry_s(spec, now=1590.0) == deadline.MIN_DECISION_RETRY_S
    assert deadline.decision_retry_s(_spec(submitted_at=None, deadline_s="2h"), now=5.0) == 7200.0


def test_the_deadlines_failure_is_the_deciding_tasks_and_reads_as_timed_out():
    spec = _spec()
    assert deadline.deciding_task(spec) == ("chief", 0)
    why = deadline.passed_why(spec)
    assert why == f"{outcome.DEADLINE_WHY} (600s after submission or admission)"
    assert outcome.DEADLINE_WHY in why  # what nomadtf.job.outcome reads as timed out


def test_under_all_workers_the_first_worker_answers_and_with_no_task_left_none_does():
    spec = _spec(strategy="multi_worker_mirrored", roles={"worker": {"count": 2}}, success="all_workers")
    assert deadline.deciding_task(spec) == ("worker", 0)
    # `nomadtf scale` to no worker: nobody decides (each task then answers for itself).
    assert deadline.deciding_task(dataclasses.replace(spec, counts={"worker": 0})) is None


@pytest.mark.parametrize("value, seconds", [(None, 120.0), ("5", 5.0), ("0", 1.0), ("soon", 120.0)])
def test_the_server_retry_budget_comes_from_the_jobs_env(value, seconds):
    environ = {} if value is None else {"NOMADTF_SERVER_RETRY_S": value}
    assert deadline.server_retry_s(environ) == seconds
