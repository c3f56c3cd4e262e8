"""What a task does once, before its phase machine starts: say what it was given (GPUs),
end at once when the run has already ended, count a start after Nomad restarted the task
against the allocation's restart budget, reuse or build the job's Python environment, open
its Consul session, and check that the code it is to run is there. Each step either lets
the task go on to claim its index or ends it with an exit code; a mistake no restart fixes
(an environment that cannot be built, a script that is not there) is recorded as the job's
failure first, so that `nomadtf run` reports it and nothing retries it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from nomadtf import roles
from nomadtf.job.spec import JobSpec
from nomadtf.runtime import jobenv, launch, policy
from nomadtf.runtime.alloc import AllocInfo
from nomadtf.runtime.budget import AllocationBudget
from nomadtf.runtime.membership import Membership
from nomadtf.runtime.policy import Act
from nomadtf.runtime.starter import ChildStarter
from nomadtf.venvs import EnvBuildError, EnvBuildStopped

log = logging.getLogger("nomadtf.task")


def before_claim(
    spec: JobSpec, role: str, alloc: AllocInfo, membership: Membership, budget: AllocationBudget, starter: ChildStarter,
    should_stop: Callable[[], bool],
) -> int | None:
    """None: claim an index; else the task's exit code.

    GET .../cluster/state ; PUT .../environment/<role>/<i> ; PUT /v1/session/create ;
    PUT .../cluster/state (a failure)
    """
    log.info("job %s (namespace %s), alloc %s, %s strategy", spec.name, spec.namespace, alloc.alloc_id[:8], spec.strategy)
    gpus = launch.assigned_gpus(dict(os.environ))
    if spec.gpus.get(role):
        log.info("GPUs assigned by Nomad: %s", ", ".join(gpus) or "none (no device plugin granted any)")
    else:
        log.info("GPUs: none requested; CUDA_VISIBLE_DEVICES is empty for our code")
    ended = ended_before_start(membership.recorded_state(), role, alloc.alloc_index, "before we started")
    if ended is not None:
        return ended
    if budget.restarted_by_nomad and not budget.spend():
        # Nomad restarted this task (our supervisor died or gave up): that restart is a
        # recovery too. With the budget spent, the allocation fails at once and Nomad's
        # reschedule policy decides (recovery.restart_attempts is one budget, not two).
        log.error("the restart budget of this allocation is spent (%d in %.0fs); not starting our code again",
                  spec.recovery.restart_attempts, budget.window_s)
        return 1
    if not budget.restarted_by_nomad:
        budget.save()  # what tells a restarted supervisor it is one
    if spec.environment is not None:
        # Before the rendezvous (whose timeout counts from then on).
        try:
            starter.job_env = jobenv.reuse_or_build(spec, role, alloc.alloc_index, alloc.task_dir, membership.discovery, should_stop)
        except EnvBuildStopped:
            log.info("asked to stop while preparing the environment")
            return 0
        except EnvBuildError as exc:
            log.error("%s", exc)
            membership.record_failure(1, f"its Python environment: {exc}")
            return 1
    membership.open_session()
    why = starter.missing_script(spec)
    if why is not None:
        log.error("%s", why)
        if not roles.is_soft(role):  # a side role only fails itself
            membership.record_failure(1, why)  # before the claim: the index Nomad gave
        return 1
    return None


def ended_before_start(state: str | None, role: str, index: int, when: str) -> int | None:
    """The exit code when the job ended before our child could start, else None."""
    act = policy.on_start(state, role, index)
    if act is Act.EXIT_FAILED:
        log.error("the job failed here %s (%s); not starting", when, state)
        return 1
    if act is Act.EXIT_OK:
        log.info("the job ended %s (%s); nothing to do", when, state)
        return 0
    return None
