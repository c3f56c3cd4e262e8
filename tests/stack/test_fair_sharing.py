"""Fair sharing on the real single-node stack, with the admission controller `nomadtf dev up`
deploys and the operator's sharing policy (`nomadtf admission policy`): the order is fair
between teams, small runs start beside a large one that waits (backfill) until it has
waited past the operator's bound (its reservation), and quotas with borrowing limits hold a
team to its share without holding up the others (docs/guide/queueing.md).

Every job asks a share of the node's CPU read from Nomad, as tests/stack/test_queueing.py's.
The policy is the cluster's: each test that sets one clears it again.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import requests

from nomadtf import wire
from nomadtf.admission import policy as policies
from nomadtf.admission import suspension
from nomadtf.client.queued import read_board
from tests.docs_commands import shown_argvs
from tests.helpers import REPO, nomad, nomadtf, probe_job, unique, wait_until, write_job
from tests.stack.test_queueing import (
    cluster_cpu,
    ensure_namespace,
    job_of,
    popen_run,
    scale_events,
    wait_queued,
)

pytestmark = pytest.mark.stack

TEAM_A, TEAM_B = "team-a", "team-b"


def sized_job(name: str, share: float, namespace: str, **context) -> dict:
    """A probe job whose three tasks together ask `share` of the cluster's CPU."""
    cpu = cluster_cpu()
    spec = probe_job(name, namespace=namespace, context=context)
    spec["roles"]["chief"]["cpu"] = int(cpu * share) - 100
    spec["roles"]["worker"]["cpu"] = spec["roles"]["ps"]["cpu"] = 50
    for role in spec["roles"].values():
        role["memory"] = 300
    return spec


def submit(tmp_path: Path, name: str, share: float, namespace: str, **context) -> None:
    out = nomadtf("run", str(write_job(tmp_path, sized_job(name, share, namespace, **context))), "--detach", timeout=120)
    assert out.returncode == 0, out.stderr


def started_at(name: str, namespace: str) -> int:
    """When Nomad created the run's first allocation (0: none yet)."""
    allocs = nomad(f"job/{name}/allocations", namespace=namespace)
    return min((a["CreateTime"] for a in allocs), default=0)


def running(name: str, namespace: str) -> bool:
    allocs = nomad(f"job/{name}/allocations", namespace=namespace)
    return len(allocs) == 3 and all(a["ClientStatus"] == "running" for a in allocs)


def succeeded(name: str, namespace: str) -> bool:
    return "outcome: succeeded" in nomadtf("status", name, "--namespace", namespace, timeout=60).stdout


def line_of(name: str, namespace: str):
    job = job_of(name, namespace)
    return None if job is None else read_board().line_of(wire.queue_ticket(namespace, name, job["Meta"][wire.META_RUN]))


def note_of(name: str, namespace: str) -> str:
    line = line_of(name, namespace)
    return line.note if line is not None else ""


def set_policy(tmp_path: Path, value: dict) -> None:
    """`nomadtf admission policy set`, then until the controller's board says it applies it."""
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(value))
    out = nomadtf("admission", "policy", "set", str(path), timeout=60)
    assert out.returncode == 0, out.stderr
    digest = policies.parse(path.read_text()).digest()
    wait_until(lambda: read_board().policy == digest, 30, "the controller to apply the policy")


def _docs_policy_command(verb: str) -> list[str]:
    """docs/guide/queueing.md's `nomadtf admission policy set …` or `… clear`, as shown."""
    return next(argv for argv in shown_argvs(r"nomadtf admission policy (set examples/sharing/policy\.json|clear)") if argv[2] == verb)


def clear_policy() -> None:
    out = nomadtf("admission", "policy", "clear", timeout=60)
    assert out.returncode == 0, out.stderr
    wait_until(lambda: read_board().policy == policies.Policy().digest(), 30, "the controller to apply the defaults")


def purge_in(name: str, namespace: str) -> None:
    requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}", params={"purge": "true", "namespace": namespace}, timeout=10)


@pytest.fixture
def teams(stack):
    for namespace in (TEAM_A, TEAM_B):
        ensure_namespace(namespace)
    made: list[tuple[str, str]] = []
    yield made
    for name, namespace in made:
        purge_in(name, namespace)


def test_team_b_s_only_run_starts_second_after_team_a_queued_three(teams, tmp_path):
    """The issue's two teams: a1, a2, a3 of team-a, then b1 of team-b, all priority 50, each
    65 % of the cluster. a1 starts at once; while it runs team-a holds 65 % and team-b
    nothing, so b1 goes before a2 and a3."""
    release = tmp_path / "release-a1"
    a1, a2, a3, b1 = (unique(n) for n in ("fair-a1", "fair-a2", "fair-a3", "fair-b1"))
    teams += [(a1, TEAM_A), (a2, TEAM_A), (a3, TEAM_A), (b1, TEAM_B)]
    submit(tmp_path, a1, 0.65, TEAM_A, until_file=str(release))
    wait_until(lambda: running(a1, TEAM_A), 90, "a1 to run")
    for name in (a2, a3):
        submit(tmp_path, name, 0.65, TEAM_A, sleep=1)
        wait_queued(name, TEAM_A)
    submit(tmp_path, b1, 0.65, TEAM_B, sleep=1)
    wait_queued(b1, TEAM_B)
    places = {name: wait_until(lambda name=name, ns=ns: line_of(name, ns), 30, f"{name} on the board").place
              for name, ns in ((a2, TEAM_A), (a3, TEAM_A), (b1, TEAM_B))}  # fmt: skip
    assert [name for name in sorted(places, key=places.get)] == [b1, a2, a3], places
    release.touch()
    for name, namespace in teams:
        wait_until(lambda name=name, ns=namespace: succeeded(name, ns), 240, f"{name} to succeed", interval=1.0)
    started = {name: started_at(name, ns) for name, ns in teams}
    assert sorted(started, key=started.get) == [a1, b1, a2, a3], started


def test_a_small_run_starts_beside_a_waiting_large_one_until_the_large_one_holds_a_reservation(teams, tmp_path):
    """Another team's run holds 65 %; team-a's 70 % run waits; team-a's 20 % run queued after
    it (behind it in line: same namespace, later arrival) starts at once (backfill). Once the
    operator's bound says the large run has waited long enough, it holds a reservation: a
    second 20 % run, which would fit, waits; the large run is not overtaken and everything
    succeeds."""
    release = tmp_path / "release-blocker"
    blocker, large, small, late = (unique(n) for n in ("bf-blocker", "bf-large", "bf-small", "bf-late"))
    teams += [(blocker, TEAM_B), (large, TEAM_A), (small, TEAM_A), (late, TEAM_A)]
    try:
        submit(tmp_path, blocker, 0.65, TEAM_B, until_file=str(release))
        wait_until(lambda: running(blocker, TEAM_B), 90, "the blocker to run")
        submit(tmp_path, large, 0.70, TEAM_A, sleep=1)
        wait_queued(large, TEAM_A)
        submit(tmp_path, small, 0.20, TEAM_A, sleep=1)
        wait_until(lambda: succeeded(small, TEAM_A), 120, "the small run to start past the waiting large one and succeed", interval=1.0)
        assert suspension.state(job_of(large, TEAM_A)) == suspension.QUEUED
        assert note_of(large, TEAM_A) == "does not fit now"

        set_policy(tmp_path, {"reserve_after": "1s"})
        wait_until(lambda: "holds a reservation" in note_of(large, TEAM_A), 30, "the large run's reservation on the board")
        submit(tmp_path, late, 0.20, TEAM_A, sleep=1)
        wait_queued(late, TEAM_A)
        assert line_of(late, TEAM_A).place == 2
        # It would fit beside the blocker (as the small run did), but not beside the reservation.
        assert not wait_until_or_none(lambda: suspension.state(job_of(late, TEAM_A)) != suspension.QUEUED, 8)
        release.touch()
        for name, namespace in teams:
            wait_until(lambda name=name, ns=namespace: succeeded(name, ns), 240, f"{name} to succeed", interval=1.0)
        assert started_at(large, TEAM_A) <= started_at(late, TEAM_A)
    finally:
        release.touch()
        clear_policy()


def wait_until_or_none(check, seconds: float):
    """`check`'s first truthy answer within `seconds`, else None (for "stays so")."""
    try:
        return wait_until(check, seconds, "", interval=0.5)
    except AssertionError:
        return None


def test_a_namespace_borrows_up_to_its_limit_waits_for_its_quota_without_holding_up_others_and_beyond_it_is_refused(teams, tmp_path):
    """team-a: nominal 30 % of the CPU, borrowing limit 20 %, priorities capped at 40. Two of
    its runs (25 % + 20 %) run, the second on borrowed capacity; a third (10 %, priority 90
    written, 40 counted) waits for the quota although the cluster has room; team-b's run
    queued after it starts; a run of 60 % fails at once; when team-a's runs end its third
    starts."""
    cpu = cluster_cpu()
    release = tmp_path / "release-a"
    a1, a2, a3, big, b1 = (unique(n) for n in ("q-a1", "q-a2", "q-a3", "q-big", "q-b1"))
    teams += [(a1, TEAM_A), (a2, TEAM_A), (a3, TEAM_A), (big, TEAM_A), (b1, TEAM_B)]
    try:
        set_policy(tmp_path, {"namespaces": {TEAM_A: {"nominal": {"cpu": int(cpu * 0.30)}, "borrowing_limit": {"cpu": int(cpu * 0.20)},
                                                      "max_priority": 40}}})  # fmt: skip
        submit(tmp_path, a1, 0.25, TEAM_A, until_file=str(release))
        submit(tmp_path, a2, 0.20, TEAM_A, until_file=str(release))
        wait_until(lambda: running(a1, TEAM_A) and running(a2, TEAM_A), 90, "a1 and a2 (borrowing) to run")
        spec = sized_job(a3, 0.10, TEAM_A, sleep=1)
        spec["priority"] = 90
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach", timeout=120)
        assert out.returncode == 0, out.stderr
        wait_queued(a3, TEAM_A)
        line = line_of(a3, TEAM_A)
        assert line.note.startswith("waits for its namespace's quota (cpu ") and line.priority == 40, line
        submit(tmp_path, b1, 0.20, TEAM_B, sleep=1)
        wait_until(lambda: succeeded(b1, TEAM_B), 120, "team-b's run to start past team-a's waiting one and succeed", interval=1.0)
        assert suspension.state(job_of(a3, TEAM_A)) == suspension.QUEUED

        out = nomadtf("run", str(write_job(tmp_path, sized_job(big, 0.60, TEAM_A))), "--timeout", "2m", timeout=180)
        assert out.returncode == 1, out.stderr
        assert "it asks more than its namespace may ever hold (cpu" in out.stderr and "nominal quota plus borrowing limit" in out.stderr, out.stderr

        release.touch()
        for name in (a1, a2, a3):
            wait_until(lambda name=name: succeeded(name, TEAM_A), 240, f"{name} to succeed", interval=1.0)
        assert started_at(a3, TEAM_A) > started_at(b1, TEAM_B)
    finally:
        release.touch()
        clear_policy()


def test_the_documented_policy_is_stored_shown_applied_and_cleared(stack, tmp_path):
    """docs/guide/queueing.md's commands, as shown, on its example policy (the same JSON the
    page shows); then a policy that does not parse is refused with its fields named, and
    nothing is stored."""
    example = REPO / "examples" / "sharing" / "policy.json"
    page = (REPO / "docs" / "guide" / "queueing.md").read_text()
    shown = page.split("this one is `examples/sharing/policy.json`", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(shown) == json.loads(example.read_text())
    try:
        out = nomadtf(*_docs_policy_command("set"), timeout=60)
        assert out.returncode == 0 and "sharing policy stored: 2 namespace(s) listed" in out.stderr, out.stderr
        expected = policies.parse(example.read_text())
        shown = nomadtf("admission", "policy", "show", timeout=60)
        assert shown.returncode == 0 and json.loads(shown.stdout) == expected.to_json(), shown.stdout + shown.stderr
        assert f"digest {expected.digest()}" in shown.stderr
        wait_until(lambda: read_board().policy == expected.digest(), 30, "the controller to apply the example policy")
        status = nomadtf("admission", "status", timeout=60)
        assert f"sharing policy in force: {expected.digest()}" in status.stdout, status.stdout

        bad = tmp_path / "bad-policy.json"
        bad.write_text(json.dumps({"namespaces": {"team-a": {"nominal": {"cpu": "lots"}, "max_priority": 0}}}))
        out = nomadtf("admission", "policy", "set", str(bad), timeout=60)
        assert out.returncode == 2, out.stderr
        assert "namespaces.team-a.nominal.cpu: a whole number of 0 or more, got 'lots'" in out.stderr
        assert "namespaces.team-a.max_priority: a whole number from 1 to 100, got 0" in out.stderr
        assert json.loads(nomadtf("admission", "policy", "show", timeout=60).stdout) == expected.to_json()  # unchanged
    finally:
        out = nomadtf(*_docs_policy_command("clear"), timeout=60)
    assert out.returncode == 0 and "sharing policy cleared" in out.stderr, out.stderr
    shown = nomadtf("admission", "policy", "show", timeout=60)
    assert json.loads(shown.stdout) == policies.Policy().to_json() and "no sharing policy is stored" in shown.stderr
    wait_until(lambda: read_board().policy == policies.Policy().digest(), 30, "the controller to apply the defaults")


def scrape() -> dict[str, float]:
    """The leading replica's metrics, found as a Prometheus `nomad_sd_configs` job finds them
    (GET /v1/service/nomadtf-admission), by series: {'name{label="v",...}': value}."""
    from prometheus_client.parser import text_string_to_metric_families

    leading = []
    for registration in nomad("service/nomadtf-admission"):
        text = requests.get(f"http://{registration['Address']}:{registration['Port']}/metrics", timeout=10).text
        series = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                series[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        if series.get("nomadtf_admission_leader") == 1.0:
            leading.append(series)
    assert len(leading) == 1, f"{len(leading)} replicas say they lead"
    return leading[0]


def test_the_controller_s_metrics_count_queued_runs_admissions_waits_and_quota_use(teams, tmp_path):
    """Scraped from the replicas' metrics ports as Prometheus would: one leads; a run waiting
    behind another team's is counted in its namespace; the running one's CPU is its
    namespace's quota use beside its nominal quota; the admission and its wait are counted."""
    cpu = cluster_cpu()
    release = tmp_path / "release-blocker"
    blocker, waiting = unique("m-blocker"), unique("m-waiting")
    teams += [(blocker, TEAM_A), (waiting, TEAM_B)]
    try:
        set_policy(tmp_path, {"namespaces": {TEAM_A: {"nominal": {"cpu": int(cpu * 0.8), "gpus": 1}}}})
        before = scrape()
        admitted_b = before.get(f'nomadtf_admission_admissions_total{{namespace="{TEAM_B}"}}', 0.0)
        waits_b = before.get(f'nomadtf_admission_wait_seconds_count{{namespace="{TEAM_B}"}}', 0.0)
        submit(tmp_path, blocker, 0.65, TEAM_A, until_file=str(release))
        wait_until(lambda: running(blocker, TEAM_A), 90, "the blocker to run")
        submit(tmp_path, waiting, 0.65, TEAM_B, sleep=1)
        wait_queued(waiting, TEAM_B)
        held = sum(t["Resources"]["CPU"] for g in job_of(blocker, TEAM_A)["TaskGroups"] for t in g["Tasks"] if g["Count"])
        metrics = wait_until(lambda: (m := scrape()).get(f'nomadtf_admission_queued_runs{{namespace="{TEAM_B}"}}') == 1.0 and m, 30,
                             "team-b's waiting run in the metrics")  # fmt: skip
        assert metrics[f'nomadtf_admission_quota_used{{namespace="{TEAM_A}",resource="cpu"}}'] >= held
        assert metrics[f'nomadtf_admission_quota_nominal{{namespace="{TEAM_A}",resource="cpu"}}'] == int(cpu * 0.8)
        assert metrics[f'nomadtf_admission_quota_nominal{{namespace="{TEAM_A}",resource="nvidia/gpu"}}'] == 1
        assert 0 < metrics[f'nomadtf_admission_usage_share{{namespace="{TEAM_A}"}}'] < 1
        release.touch()
        wait_until(lambda: succeeded(waiting, TEAM_B), 120, "the waiting run to succeed", interval=1.0)
        after = wait_until(lambda: (m := scrape()).get(f'nomadtf_admission_queued_runs{{namespace="{TEAM_B}"}}') == 0.0 and m, 30,
                           "team-b's queue empty in the metrics")  # fmt: skip
        assert after[f'nomadtf_admission_admissions_total{{namespace="{TEAM_B}"}}'] == admitted_b + 1
        assert after[f'nomadtf_admission_wait_seconds_count{{namespace="{TEAM_B}"}}'] == waits_b + 1
        assert after[f'nomadtf_admission_wait_seconds_sum{{namespace="{TEAM_B}"}}'] > 0
    finally:
        release.touch()
        clear_policy()


def preemptible_job(name: str, share: float, namespace: str, model_dir: Path, priority: int, **context) -> dict:
    """tests/jobs/preemptible.py sized as sized_job, with its own model dir."""
    spec = sized_job(name, share, namespace, **context)
    spec["entrypoint"]["script"] = "preemptible.py"
    spec["model_dir"] = str(model_dir)
    spec["priority"] = priority
    return spec


def test_a_priority_90_run_preempts_a_priority_30_run_which_checkpoints_first_and_resumes(teams, tmp_path):
    """The issue's preemption: a priority-30 run (followed by `nomadtf run`) holds 65 %; a
    priority-90 run of another team needs 65 %. The low run's code is asked to checkpoint
    and does, is suspended whole and queued again; the high run starts within 40 s and
    succeeds; the low run is admitted again, resumes from its checkpoint without --resume,
    and its follower, having said what happened, exits 0. `status` shows the preemption."""
    low, high = unique("pre-low"), unique("pre-high")
    teams += [(low, TEAM_A), (high, TEAM_B)]
    model_dir = tmp_path / "model-low"
    spec_low = preemptible_job(low, 0.65, TEAM_A, model_dir, 30, steps=40, step_s=0.5, checkpoint_every=1000)
    set_policy(tmp_path, {"preemption": True})  # off unless the operator turns it on
    follower = popen_run(write_job(tmp_path, spec_low), "--timeout", "4m")
    try:
        wait_until(lambda: running(low, TEAM_A), 90, "the low-priority run to run")
        wait_until(lambda: "chief started at step 0" in _log(model_dir) and (nomadtf("status", low, "--namespace", TEAM_A).stdout.count("step ") > 0),
                   60, "the low-priority run to report steps")  # fmt: skip
        started = time.time()
        out = nomadtf("run", str(write_job(tmp_path, preemptible_job(high, 0.65, TEAM_B, tmp_path / "model-high", 90, steps=4, step_s=0.5))),
                      "--timeout", "3m", timeout=240)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert started_at(high, TEAM_B) / 1e9 - started < 40, "the high-priority run started more than 40 s after it was submitted"
        _, err = follower.communicate(timeout=240)
        assert follower.returncode == 0, err
        assert re.search(rf"preempted at step \d+ by {TEAM_B}/{high} \(priority 90\); requeued", err), err
        log = _log(model_dir)
        assert "chief asked to checkpoint" in log, log  # the code's handler ran
        saved = int(re.search(r"chief checkpoint at step (\d+)", log)[1])
        assert f"chief started at step {saved}" in log, log  # resumed from that checkpoint, no --resume
        assert "chief finished" in log
        status = nomadtf("status", low, "--namespace", TEAM_A, timeout=60).stdout
        assert re.search(rf"\d\d:\d\d:\d\d preempted at step \d+ by {TEAM_B}/{high}", status), status
    finally:
        if follower.poll() is None:
            follower.kill()
        clear_policy()


def _log(model_dir: Path) -> str:
    path = model_dir / "log"
    return path.read_text() if path.exists() else ""


def test_a_namespace_borrowing_idle_capacity_gives_it_back_by_preemption_when_the_owner_s_run_arrives(teams, tmp_path):
    """team-a's nominal quota is 30 % of the CPU, team-b's 70 %. With the cluster idle, team-a's
    65 % run borrows; team-b's 65 % run (within its nominal quota, same priority) reclaims:
    team-a's run checkpoints, is suspended, and resumes once team-b's has ended."""
    cpu = cluster_cpu()
    borrower, owner = unique("reclaim-a"), unique("reclaim-b")
    teams += [(borrower, TEAM_A), (owner, TEAM_B)]
    model_dir = tmp_path / "model-borrower"
    try:
        set_policy(tmp_path, {"preemption": True,
                              "namespaces": {TEAM_A: {"nominal": {"cpu": int(cpu * 0.30)}}, TEAM_B: {"nominal": {"cpu": int(cpu * 0.70)}}}})  # fmt: skip
        follower = popen_run(write_job(tmp_path, preemptible_job(borrower, 0.65, TEAM_A, model_dir, 50, steps=30, step_s=0.5)), "--timeout", "4m")
        wait_until(lambda: running(borrower, TEAM_A) and "chief started at step 0" in _log(model_dir), 90, "team-a's run to borrow")
        out = nomadtf("run", str(write_job(tmp_path, sized_job(owner, 0.65, TEAM_B, sleep=2))), "--timeout", "3m", timeout=240)
        assert out.returncode == 0, out.stderr
        _, err = follower.communicate(timeout=240)
        assert follower.returncode == 0, err
        assert re.search(rf"preempted at step \d+ by {TEAM_B}/{owner} \(priority 50\); requeued", err), err
        assert "chief asked to checkpoint" in _log(model_dir) and "chief finished" in _log(model_dir)
        assert started_at(owner, TEAM_B) < max(a["CreateTime"] for a in nomad(f"job/{borrower}/allocations", namespace=TEAM_A))
    finally:
        clear_policy()


def _usage_of(namespace: str) -> dict:
    out = nomadtf("usage", "--since", "1d", "--namespace", namespace, "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    return rows[0] if rows else {"admitted": 0, "succeeded": 0, "failed": 0, "cpu_core_hours": 0.0, "queued_hours": 0.0}


def test_usage_shows_what_a_namespace_used_and_how_its_runs_ended_from_the_controller_s_ledger(teams, tmp_path):
    """One run that waits behind another and succeeds, one that fails: `nomadtf usage` shows
    both admissions, one success, one failure, the CPU core-hours they held and time queued,
    from the ledger the controller keeps (in Consul, beside Nomad's GC). CSV and the table too."""
    release = tmp_path / "release-blocker"
    blocker, good, bad = unique("u-blocker"), unique("u-good"), unique("u-bad")
    teams += [(blocker, TEAM_A), (good, TEAM_B), (bad, TEAM_B)]
    before = _usage_of(TEAM_B)
    submit(tmp_path, blocker, 0.65, TEAM_A, until_file=str(release))
    wait_until(lambda: running(blocker, TEAM_A), 90, "the blocker to run")
    submit(tmp_path, good, 0.65, TEAM_B, sleep=3)
    wait_queued(good, TEAM_B)
    time.sleep(2)
    release.touch()
    wait_until(lambda: succeeded(good, TEAM_B), 120, "the queued run to succeed", interval=1.0)
    out = nomadtf("run", str(write_job(tmp_path, sized_job(bad, 0.2, TEAM_B, exit=3))), "--timeout", "2m", timeout=180)
    assert out.returncode == 1, out.stderr

    def booked() -> dict | None:
        now = _usage_of(TEAM_B)
        return now if now["succeeded"] >= before["succeeded"] + 1 and now["failed"] >= before["failed"] + 1 else None

    after = wait_until(booked, 30, "both ends in the ledger", interval=2.0)
    assert after["admitted"] == before["admitted"] + 2
    assert after["cpu_core_hours"] > before["cpu_core_hours"]
    assert after["queued_hours"] * 3600 >= before["queued_hours"] * 3600 + 2
    csv_out = nomadtf("usage", "--since", "1d", "--namespace", TEAM_B, "--csv", timeout=60).stdout.splitlines()
    assert csv_out[0].startswith("namespace,cpu_core_hours,") and csv_out[1].startswith(f"{TEAM_B},")
    table = nomadtf("usage", "--since", "1d", timeout=60).stdout
    assert "cpu core-h" in table and TEAM_B in table and TEAM_A in table


def test_queued_runs_are_told_an_estimated_start_from_the_running_run_s_step_rate_and_the_declared_durations(teams, tmp_path):
    """A run that declares 60 steps (context.steps) and reports them at 2 per second holds
    65 %; two runs of 65 % declaring `admission.duration` wait behind it. The board and
    `status` give each an estimated start; the error against when each really started is
    measured (docs/benchmarks.md) and bounded here."""
    blocker, first, second = unique("eta-running"), unique("eta-first"), unique("eta-second")
    teams += [(blocker, TEAM_A), (first, TEAM_B), (second, TEAM_B)]
    follower = popen_run(write_job(tmp_path, preemptible_job(blocker, 0.65, TEAM_A, tmp_path / "model-eta", 50, steps=60, step_s=0.5)),
                         "--timeout", "3m")  # fmt: skip
    try:
        wait_until(lambda: running(blocker, TEAM_A), 90, "the running run to run")
        for name in (first, second):
            spec = sized_job(name, 0.65, TEAM_B, sleep=3)
            spec["admission"] = {"duration": "8s"}
            out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach", timeout=120)
            assert out.returncode == 0, out.stderr
            wait_queued(name, TEAM_B)
        estimates: dict[str, float] = {}

        def estimated() -> bool:
            for name in (first, second):
                line = line_of(name, TEAM_B)
                if line is not None and line.starts_at:
                    estimates[name] = line.starts_at  # the latest estimate before it started
            return len(estimates) == 2

        wait_until(estimated, 40, "both estimates on the board", interval=1.0)
        status = nomadtf("status", first, "--namespace", TEAM_B, timeout=60).stdout
        assert re.search(r"estimated start \d\d:\d\d:\d\d \(in \d+s\)", status), status
        while not all(started_at(n, TEAM_B) for n in (first, second)):
            estimated()
            time.sleep(1.0)
        errors = {name: started_at(name, TEAM_B) / 1e9 - estimates[name] for name in (first, second)}
        print(f"estimate errors (started - estimated): first {errors[first]:+.1f}s, second {errors[second]:+.1f}s")
        assert all(abs(e) < 15 for e in errors.values()), errors
        _, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err
    finally:
        if follower.poll() is None:
            follower.kill()


def _workers(name: str, namespace: str) -> tuple[int, int]:
    """(the worker group's Count in Nomad, its running allocations)."""
    job = job_of(name, namespace) or {}
    count = next((g["Count"] for g in job.get("TaskGroups") or [] if g["Name"] == "worker"), 0)
    allocs = nomad(f"job/{name}/allocations", namespace=namespace)
    return count, sum(a["TaskGroup"] == "worker" and a["ClientStatus"] == "running" for a in allocs)


def test_an_elastic_run_starts_at_its_minimum_grows_when_capacity_frees_and_shrinks_for_a_preemption(teams, tmp_path):
    """job.json `count: {"min": 1, "max": 3}` for workers of 20 % each. Another team holds
    65 %: the elastic run is admitted at one worker, not held back for three. Once that run
    ends and nobody waits, it is asked to checkpoint and grows to three. A priority-90 run
    needing 45 % then arrives with preemption on: the elastic run is shrunk back to one
    worker (at a checkpoint), not suspended whole; both succeed."""
    cpu = cluster_cpu()
    release = tmp_path / "release-blocker"
    blocker, grows, high = unique("el-blocker"), unique("el-grows"), unique("el-high")
    teams += [(blocker, TEAM_B), (grows, TEAM_A), (high, TEAM_B)]
    model_dir = tmp_path / "model-elastic"
    spec = preemptible_job(grows, 0.2, TEAM_A, model_dir, 30, steps=150, step_s=0.5, checkpoint_every=1000)
    spec["roles"]["chief"]["cpu"] = 50
    spec["roles"]["worker"].update(cpu=int(cpu * 0.2), count={"min": 1, "max": 3})
    try:
        set_policy(tmp_path, {"preemption": True})
        submit(tmp_path, blocker, 0.65, TEAM_B, until_file=str(release))
        wait_until(lambda: running(blocker, TEAM_B), 90, "the blocker to run")
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach", timeout=120)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: _workers(grows, TEAM_A) == (1, 1), 60, "the elastic run to start at its minimum")
        assert "chief started at step 0" in wait_until(lambda: _log(model_dir) or None, 60, "the elastic run's code to start")
        release.touch()
        wait_until(lambda: _workers(grows, TEAM_A) == (3, 3), 90, "the elastic run to grow to three workers", interval=1.0)
        assert "chief asked to checkpoint" in _log(model_dir), _log(model_dir)  # it grew at a checkpoint
        events = scale_events(grows, TEAM_A)
        assert any("grown to worker=3" in (e.get("Message") or "") for e in events["worker"]), events["worker"]

        out = nomadtf("run", str(write_job(tmp_path, sized_job(high, 0.45, TEAM_B, sleep=3) | {"priority": 90})), "--timeout", "3m", timeout=240)
        assert out.returncode == 0, out.stderr
        events = scale_events(grows, TEAM_A)
        # Shrunk once (not again while its stopping workers still held the room), never suspended.
        assert sum("shrunk to worker=1" in (e.get("Message") or "") for e in events["worker"]) == 1, events["worker"]
        assert not any((e.get("Meta") or {}).get(suspension.META_ADMISSION) == "preempted" for e in events[suspension.PLACEHOLDER_GROUP])
        wait_until(lambda: succeeded(grows, TEAM_A), 240, "the elastic run to succeed", interval=2.0)
        assert "chief finished" in _log(model_dir)
    finally:
        release.touch()
        clear_policy()
