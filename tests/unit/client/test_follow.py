"""The pure pieces of follow.py: which allocations belong to the current run, which
attempts `logs` shows, how long a run took; and what the tasks' children run (their Python
and TensorFlow, published when each child first starts): `run` says each distinct line once,
whatever the number of tasks, and `status` groups the tasks by it."""

from __future__ import annotations

from nomadtf.client.follow import Follower
from nomadtf.client.readback import describe_runs, pick_allocs, run_elapsed, runs_of
from nomadtf.client.runview import of_run, versions_of_run
from nomadtf.job.answers import Allocation, Job

TF21 = "Python 3.11.2 (/opt/nomadtf/venv/bin/python3), tensorflow-cpu 2.21.0"
TF20 = "Python 3.11.2 (/opt/nomadtf/venv/bin/python3), tensorflow-cpu 2.20.0"


def _follower(statuses: dict, said: list[str]) -> Follower:
    return Follower(None, "j", None, 0, lambda view: None, said.append, recorded_state=lambda: None, environments=lambda: statuses)


def test_run_says_each_distinct_runtime_once_and_a_differing_task_again():
    statuses = {("chief", 0): {"state": "started", "runs": TF21}}
    said: list[str] = []
    follower = _follower(statuses, said)
    follower._report_environments()
    statuses.update({("worker", i): {"state": "started", "runs": TF21} for i in range(63)})
    follower._report_environments()
    assert said == [f"chief[0] runs {TF21}"]
    statuses[("ps", 0)] = {"state": "started", "runs": TF20}  # an odd one out is worth a line
    follower._report_environments()
    assert said == [f"chief[0] runs {TF21}", f"ps[0] runs {TF20}"]


def test_an_environment_s_ready_is_said_also_when_the_child_started_before_the_follower_looked():
    building = {"key": "k1", "requirements": "tensorflow-cpu==2.20.0", "python": "3.11"}
    statuses = {("chief", 0): {**building, "state": "building", "elapsed_s": 3}}
    said: list[str] = []
    follower = _follower(statuses, said)
    follower._report_environments()
    # ready and started between two looks: the record keeps both (the task adds `runs` to it).
    statuses[("chief", 0)] = {**building, "state": "ready", "reused": False, "elapsed_s": 9.0, "runs": TF20}
    follower._report_environments()
    assert said == ["chief[0] building environment k1 (tensorflow-cpu==2.20.0; Python 3.11) (3 s)",
                    "chief[0] environment k1 ready (built in 9.0 s)", f"chief[0] runs {TF20}"]  # fmt: skip


def test_status_groups_the_tasks_by_what_their_children_run():
    environments = {
        ("chief", 0): {"state": "started", "runs": TF21},
        ("worker", 0): {"state": "started", "runs": TF21},
        ("worker", 1): {"state": "started", "runs": TF21},
        ("ps", 0): {"state": "building", "key": "k"},  # not started yet: not counted
    }
    runs = runs_of(environments)
    assert runs == {TF21: [("chief", 0), ("worker", 0), ("worker", 1)]}
    assert describe_runs(TF21, runs[TF21]) == f"runs {TF21}  (chief 1, worker 2)"


def _alloc(name: str, version: int, create: int, status: str = "complete") -> Allocation:
    return Allocation(f"{name}-{create}", name=f"job.{name}", job_version=version, create_index=create, client_status=status)


def test_a_run_owns_exactly_the_versions_that_carry_its_id():
    versions = [Job.from_api({"ID": "j", **v}) for v in (
        {"Version": 3, "Meta": {"nomadtf.run": "b"}},  # `scale` made a new version of run b
        {"Version": 2, "Meta": {"nomadtf.run": "b"}},
        {"Version": 1, "Meta": {"nomadtf.run": "a"}},
        {"Version": 0, "Meta": {}},
    )]
    assert versions_of_run(versions, "b") == {2, 3}
    assert versions_of_run(versions, "a") == {1}
    assert versions_of_run(versions, "unknown") == set()


def test_allocations_of_other_runs_are_left_out():
    """Neither an earlier run's nor a later one's (a colleague's --replace) allocations count."""
    allocs = [_alloc("chief[0]", 1, 10), _alloc("chief[0]", 2, 20, "running"), _alloc("worker[0]", 3, 30)]
    assert [a.create_index for a in of_run(allocs, {2})] == [20]
    assert [a.create_index for a in of_run(allocs, {2, 3})] == [20, 30]
    assert len(of_run(allocs, None)) == 3


def test_logs_show_every_attempt_of_a_slot_oldest_first_and_follow_the_newest():
    allocs = [_alloc("chief[0]", 1, 30), _alloc("worker[0]", 1, 5), _alloc("chief[0]", 1, 10, "failed")]
    assert [a.create_index for a in pick_allocs(allocs, "chief", None)] == [10, 30]
    assert [a.create_index for a in pick_allocs(allocs, "chief", None, newest_only=True)] == [30]
    assert [a.create_index for a in pick_allocs(allocs, None, 0)] == [10, 30, 5]


def test_elapsed_runs_to_now_while_running_and_to_the_last_change_after():
    allocs = [Allocation(create_time=1_000_000_000, modify_time=9_000_000_000), Allocation(create_time=2_000_000_000, modify_time=5_000_000_000)]
    assert run_elapsed(allocs, running=False, now_ns=20_000_000_000) == 8.0
    assert run_elapsed(allocs, running=True, now_ns=20_000_000_000) == 19.0
    assert run_elapsed([], running=True, now_ns=1) == 0.0
