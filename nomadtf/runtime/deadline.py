"""The task's time limits. Pure.

- recovery.deadline counts from the run's submission, or from its admission where an
  admission controller queued it (`counting_from_admission`: time in the queue does not
  count), whoever follows the job or not: when it passes, the job fails as a whole, recorded
  against the task whose exit decides it.
- A decision (the run's outcome) is retried while Consul is away until that deadline, and
  at least a minute: it is never dropped early.
- A login or a session is retried for the server retry budget (job.json `env`
  NOMADTF_SERVER_RETRY_S), after which the task says which address it could not reach.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from nomadtf import roles, wire
from nomadtf.job.outcome import DEADLINE_WHY
from nomadtf.job.spec import JobSpec

MIN_DECISION_RETRY_S = 60.0


def counting_from_admission(spec: JobSpec, admitted_at: object) -> JobSpec:
    """`spec` with its deadline counted from `admitted_at` (the value of wire.kv_admitted_at,
    as bytes or text) when that is a time after the submission; unchanged otherwise (no
    controller admitted it, or the value is not a time: a submitter may write its own run's
    keys, and so only ever move its own run's deadline)."""
    try:
        when = float(admitted_at.decode() if isinstance(admitted_at, bytes) else str(admitted_at))
    except (TypeError, ValueError, UnicodeDecodeError):
        return spec
    if spec.submitted_at is None or not spec.submitted_at < when < spec.submitted_at + 10 * 365 * 86400:
        return spec
    return dataclasses.replace(spec, submitted_at=when)


def seconds_left(spec: JobSpec, now: float) -> float | None:
    """Wall-clock seconds until recovery.deadline passes (0 once it has); None for a job
    rendered without a submission time (nothing to count from)."""
    if spec.submitted_at is None:
        return None
    return max(0.0, spec.submitted_at + spec.recovery.deadline_s - now)


def decision_retry_s(spec: JobSpec, now: float) -> float:
    """How long recording a decision may be retried: until recovery.deadline, at least 60 s."""
    if spec.submitted_at is None:
        return max(MIN_DECISION_RETRY_S, spec.recovery.deadline_s)
    return max(MIN_DECISION_RETRY_S, spec.submitted_at + spec.recovery.deadline_s - now)


def deciding_task(spec: JobSpec) -> tuple[str, int] | None:
    """The (role, index) whose exit decides the job (a deadline's failure is recorded
    against it); None when no task does (then each task answers for itself)."""
    return next(
        ((role, i) for role, n in spec.counts.items() for i in range(n)
         if roles.completes_job(spec.strategy, role, i, spec.counts, spec.success)),
        None,
    )


def passed_why(spec: JobSpec) -> str:
    """The reason recorded when the deadline passes (nomadtf.job.outcome reads it as timed out)."""
    return f"{DEADLINE_WHY} ({spec.recovery.deadline_s:.0f}s after submission or admission)"


def server_retry_s(environ: Mapping[str, str] = os.environ) -> float:
    """How long a task retries a Consul or Vault it cannot reach (NOMADTF_SERVER_RETRY_S;
    120 s by default, at least 1 s)."""
    try:
        return max(1.0, float(environ.get(wire.ENV_SERVER_RETRY_S, wire.DEFAULT_SERVER_RETRY_S)))
    except ValueError:
        return wire.DEFAULT_SERVER_RETRY_S
