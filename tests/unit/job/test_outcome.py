"""The one outcome model (nomadtf/job/outcome.py): what a run's job, allocations and recorded
state mean. Pure; the same decisions are made on the real stack in tests/stack/test_outcomes.py."""

from __future__ import annotations

from nomadtf.job import outcome
from nomadtf.job.answers import Allocation, Job
from nomadtf.job.outcome import UNKNOWN, decide

RUN = "r1"


def _job_json(status: str = "running", stop: bool = False, run: str = RUN) -> dict:
    groups = [{"Name": "chief", "Count": 1}, {"Name": "worker", "Count": 1}, {"Name": "evaluator", "Count": 1}]
    return {"ID": "j", "Status": status, "Stop": stop, "Meta": {"nomadtf.run": run}, "TaskGroups": groups}


def _job(status: str = "running", stop: bool = False, run: str = RUN) -> Job:
    return Job.from_api(_job_json(status, stop, run))


def _alloc_json(slot: str, status: str, create: int = 1) -> dict:
    return {"ID": f"{slot}-{create}", "Name": f"j.{slot}", "ClientStatus": status, "CreateIndex": create}


def _alloc(slot: str, status: str, create: int = 1) -> Allocation:
    return Allocation.from_api(_alloc_json(slot, status, create))


DONE = [_alloc("chief[0]", "complete"), _alloc("worker[0]", "complete"), _alloc("evaluator[0]", "complete")]


def test_every_allocation_complete_is_not_success_without_the_record():
    """A stopped job's tasks exit 0 on SIGTERM and Nomad marks them complete."""
    assert decide(_job("dead", stop=True), DONE, None, RUN, 2) == outcome.RunOutcome(outcome.STOPPED, "stopped from outside (nomadtf stop, nomad job stop, another run with --replace)")
    lost = decide(_job("dead"), DONE, None, RUN, 2)
    assert lost is not None and lost.kind == outcome.LOST and lost.exit_code == 6


def test_the_record_decides_success_once_every_task_has_stopped():
    running = [_alloc("chief[0]", "complete"), _alloc("worker[0]", "running")]
    assert decide(_job(), running, "succeeded", RUN, 2) is None
    assert decide(_job(), DONE, "succeeded", RUN, 2) == outcome.RunOutcome(outcome.SUCCEEDED)
    assert decide(_job("dead", stop=True), DONE, "succeeded", RUN, 2).exit_code == 0  # a stop after the end changes nothing


def test_a_recorded_failure_and_the_deadline():
    failed = decide(_job(), DONE, "failed: chief[0] exited 3, a permanent exit code", RUN, 2)
    assert (failed.kind, failed.reason, failed.exit_code) == ("failed", "chief[0] exited 3, a permanent exit code", 1)
    late = decide(_job(), DONE, f"failed: chief[0] exited 1, {outcome.DEADLINE_WHY} (60s after submission or admission)", RUN, 2)
    assert late.kind == outcome.TIMED_OUT and late.exit_code == 5


def test_another_run_of_the_same_name_or_a_purge_stops_this_one():
    replaced = decide(_job(run="r2"), DONE, None, RUN, 2)
    assert replaced.kind == outcome.STOPPED and "r2" in replaced.reason and replaced.exit_code == 4
    assert decide(None, DONE, None, RUN, 2).kind == outcome.STOPPED


def test_side_roles_never_decide_the_outcome():
    allocs = [_alloc("chief[0]", "running"), _alloc("worker[0]", "running")]
    allocs += [_alloc("evaluator[0]", "failed", n) for n in range(2, 6)]
    assert decide(_job(), allocs, None, RUN, 0) is None
    allocs.append(_alloc("worker[0]", "failed", 9))
    assert decide(_job(), allocs, None, RUN, 0).kind == outcome.FAILED


def test_a_lost_allocation_spends_no_reschedule_attempt():
    """A node that went down: Nomad replaces its allocations whatever the reschedule policy."""
    lost, replacement = _alloc("worker[0]", "lost", 1), _alloc("worker[0]", "running", 2)
    assert decide(_job(), [lost, replacement], None, RUN, 0) is None
    assert decide(_job(), [_alloc("worker[0]", "failed", 1), replacement], None, RUN, 0).kind == outcome.FAILED


def test_an_unreadable_record_decides_nothing_it_might_contradict():
    assert decide(_job("dead"), DONE, UNKNOWN, RUN, 2) is None
    assert decide(_job("dead", stop=True), DONE, UNKNOWN, RUN, 2).kind == outcome.STOPPED


# Nomad v1.6.1's docker driver's events: the registry's refusal, and the stack's (no registry reachable).
DENIED = ("Failed to pull `nomadtf:no-such`: API error (404): pull access denied for nomadtf, repository does not exist "
          "or may require 'docker login': denied: requested access to the resource is denied")
UNREACHABLE = ('Failed to pull `nomadtf:no-such`: API error (500): Get "https://registry-1.docker.io/v2/": dial tcp: '
               "lookup registry-1.docker.io on 10.255.255.53:53: no such host")


def _pulling(slot: str, *messages: str, create: int = 1) -> Allocation:
    alloc = _alloc_json(slot, "pending", create)
    alloc["NodeName"] = "client-1"
    events = [{"Type": "Driver", "Time": 1, "DisplayMessage": "Downloading image"}]
    events += [{"Type": "Driver Failure", "Time": 2 + n, "DriverError": m, "DisplayMessage": m} for n, m in enumerate(messages)]
    alloc["TaskStates"] = {slot.split("[")[0]: {"Events": events}}
    return Allocation.from_api(alloc)


def _docker_job(gpu_image: str = "", gpu_roles: tuple[str, ...] = ()) -> Job:
    job = _job_json()
    for group in job["TaskGroups"]:
        gpus = group["Name"] in gpu_roles
        task = {"Config": {"image": gpu_image if gpus and gpu_image else "nomadtf:no-such"}, "Resources": {"Devices": [{"Name": "nvidia/gpu"}] if gpus else None}}
        group["Tasks"] = [task]
    return Job.from_api(job)


def test_an_image_the_registry_does_not_have_fails_the_run_at_once_naming_the_field_and_the_fix():
    allocs = [_alloc("chief[0]", "running"), _pulling("worker[0]", DENIED, create=2)]
    result = decide(_docker_job(), allocs, None, RUN, 2)
    assert result.kind == outcome.FAILED and result.exit_code == 1
    assert result.reason == (
        "worker[0]: driver.image nomadtf:no-such could not be pulled on client client-1: API error (404): pull access denied "
        "for nomadtf, repository does not exist or may require 'docker login': denied: requested access to the resource is "
        "denied; build it (`nomadtf dev image build`) or push it where the clients pull from"
    )


def test_another_pull_failure_fails_the_run_once_nomad_s_restart_could_not_pull_either():
    once = [_alloc("chief[0]", "running"), _pulling("worker[0]", UNREACHABLE)]
    assert decide(_docker_job(), once, None, RUN, 2) is None  # a registry away for a moment: Nomad retries
    twice = [_alloc("chief[0]", "running"), _pulling("worker[0]", UNREACHABLE, UNREACHABLE)]
    assert "could not be pulled on client client-1: API error (500)" in decide(_docker_job(), twice, None, RUN, 2).reason
    # A side role's image decides nothing (its failures are warnings), a recorded outcome comes first.
    side = [_alloc("chief[0]", "running"), _pulling("evaluator[0]", DENIED)]
    assert decide(_docker_job(), side, None, RUN, 2) is None
    assert decide(_docker_job(), twice, "succeeded", RUN, 2) is None  # ... and still ending


def test_the_field_is_gpu_image_for_a_gpu_role_on_an_image_of_its_own():
    allocs = [_pulling("worker[0]", DENIED.replace("nomadtf:no-such", "nomadtf:gpu"))]
    assert "worker[0]: driver.gpu_image nomadtf:gpu could not" in decide(_docker_job("nomadtf:gpu", ("worker",)), allocs, None, RUN, 2).reason
    # gpu_image not set: the GPU role runs driver.image, as every other role.
    assert "worker[0]: driver.image nomadtf:no-such could not" in decide(_docker_job("", ("worker",)), [_pulling("worker[0]", DENIED)], None, RUN, 2).reason
