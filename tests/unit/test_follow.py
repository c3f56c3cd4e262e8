"""What the tasks' children run (their Python and TensorFlow, published when each child first
starts): `run` says each distinct line once, whatever the number of tasks, and `status` groups
the tasks by it."""

from __future__ import annotations

from nomadtf.follow import Follower, describe_runs, runs_of

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
