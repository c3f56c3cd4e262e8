"""The allocation's restart budget on disk: at most recovery.restart_attempts recoveries in
any recovery.restart_interval (policy.RestartBudget), recorded in the task directory, which
Nomad keeps across restarts of the task. A supervisor that Nomad restarts (its predecessor
was killed or gave up) finds the record, counts its own start as a recovery, and spends from
what its predecessors spent: one budget, not one per process.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from nomadtf import wire
from nomadtf.job.spec import JobSpec
from nomadtf.runtime import policy

log = logging.getLogger("nomadtf.task")


class AllocationBudget:
    """Usage:
    budget = AllocationBudget(spec, task_dir)
    if budget.restarted_by_nomad and not budget.spend(): give up   # else budget.save()
    if not budget.spend(): give up                                  # before each recovery
    """

    def __init__(self, spec: JobSpec, task_dir: Path):
        self.path = task_dir / wire.RECOVERIES_FILE
        self.restarted_by_nomad = self.path.exists()  # a predecessor in this allocation ran
        recorded = self.path.read_text() if self.restarted_by_nomad else None
        self.budget = policy.RestartBudget.from_json(spec.recovery.restart_attempts, spec.recovery.restart_interval_s, recorded)

    @property
    def window_s(self) -> float:
        return self.budget.window_s

    def spend(self) -> bool:
        """One recovery, recorded at once; False when it is over the budget."""
        within = self.budget.spend(time.time())
        self.save()
        return within

    def save(self) -> None:
        """Write the record (what tells a restarted supervisor it is one); a task directory
        that cannot be written costs only the memory of past recoveries."""
        try:
            self.path.write_text(self.budget.to_json())
        except OSError as exc:
            log.warning("could not record the restart budget in %s: %s", self.path, exc)
