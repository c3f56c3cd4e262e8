"""What a task does before its phase machine (nomadtf.runtime.startup): each check ends the
task with the right exit code, and only a mistake no restart fixes is recorded as the job's
failure. Consul is played by a stand-in for Membership here."""

from __future__ import annotations

from nomadtf.job.spec import JobSpec
from nomadtf.job.validate import normalize
from nomadtf.runtime import startup
from nomadtf.runtime.alloc import AllocInfo
from nomadtf.runtime.budget import AllocationBudget
from nomadtf.runtime.starter import ChildStarter


class Membership:
    def __init__(self, state: str | None = None):
        self.state = state
        self.failures: list[tuple[int, str]] = []
        self.sessions = 0
        self.discovery = None

    def recorded_state(self):
        return self.state

    def record_failure(self, code, why):
        self.failures.append((code, why))

    def open_session(self):
        self.sessions += 1


def _start(tmp_path, role="worker", state=None, restart_attempts=1, task="task"):
    """One start of a task whose code is looked for in tmp_path, its task directory `task` there."""
    task_dir = tmp_path / f"{task}-{role}"
    task_dir.mkdir(exist_ok=True)
    spec = JobSpec.from_normalized(normalize({
        "name": "j", "strategy": "multi_worker_mirrored", "entrypoint": {"script": "train.py", "workdir": str(tmp_path)},
        "roles": {"worker": {"count": 1}, "evaluator": {"count": 1}, "tensorboard": {"count": 1}}, "recovery": {"restart_attempts": restart_attempts},
    }))
    alloc = AllocInfo("j", "alloc-1", 0, tf_port=1, health_port=2, task_dir=task_dir, secrets_dir=task_dir)
    membership = Membership(state)
    budget = AllocationBudget(spec, task_dir)
    starter = ChildStarter(role, alloc, task_dir / "p.json", lambda pid, code: None)
    code = startup.before_claim(spec, role, alloc, membership, budget, starter, lambda: False)  # type: ignore[arg-type]
    return code, membership


def test_a_task_with_its_code_in_place_goes_on_to_claim(tmp_path):
    (tmp_path / "train.py").write_text("")
    code, membership = _start(tmp_path)
    assert code is None and membership.sessions == 1 and membership.failures == []
    assert (tmp_path / "task-worker" / "nomadtf-recoveries.json").exists()  # tells a restarted supervisor it is one


def test_a_run_that_already_ended_starts_nothing(tmp_path):
    (tmp_path / "train.py").write_text("")
    assert _start(tmp_path, state="succeeded", task="a")[0] == 0
    code, membership = _start(tmp_path, state="failed: worker[0] exited 2, a permanent exit code", task="b")
    assert code == 1 and membership.sessions == 0


def test_a_restart_by_nomad_spends_the_budget_and_a_spent_one_ends_the_task(tmp_path):
    (tmp_path / "train.py").write_text("")
    assert _start(tmp_path, restart_attempts=1)[0] is None  # the first start
    assert _start(tmp_path, restart_attempts=1)[0] is None  # Nomad restarted it: one recovery, within 1
    code, membership = _start(tmp_path, restart_attempts=1)  # and again: over the budget
    assert code == 1 and membership.sessions == 0 and membership.failures == []  # Nomad's reschedule decides


def test_a_missing_script_fails_the_job_but_a_side_role_only_itself(tmp_path):
    code, membership = _start(tmp_path)
    assert code == 1 and membership.failures == [(1, f"its code: entrypoint.script train.py not found in {tmp_path} (entrypoint.workdir)")]
    code, membership = _start(tmp_path, role="evaluator")  # each role its own task directory
    assert code == 1 and membership.failures == []  # a side role's failure is its own
    assert _start(tmp_path, role="tensorboard")[0] is None  # TensorBoard runs no script of the job's
