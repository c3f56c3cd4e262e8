"""A shared cluster on the real single-node stack: runs that do not fit now wait their turn
(and say for what), runs that can never fit fail at once, a job starts all at once or not at
all, and the queue keeps its order (docs/queueing.md).

Every job here asks a share of the node's CPU (read from Nomad, not assumed): two jobs of
65 % can never run side by side, either fits alone.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from nomadtf import capacity, wire
from nomadtf.admission import Admission, withdraw
from nomadtf.discovery import AdmissionQueue, ConsulDiscovery
from nomadtf.errors import JobStopped
from nomadtf.queue import Entry, QueuedRun
from nomadtf.run import Run
from tests.helpers import (
    allocations,
    nomad,
    nomadtf,
    probe_job,
    purge,
    submit_raw,
    unique,
    wait_until,
    write_job,
)

pytestmark = pytest.mark.stack

TEAM_A, TEAM_B = "team-a", "team-b"


def cluster_cpu() -> int:
    """The MHz Nomad may hand out on the stack's nodes (GET /v1/nodes?resources=true)."""
    nodes = capacity.node_capacities(nomad("nodes", resources="true"), {"Datacenters": ["*"]})
    return capacity.cluster_capacity(nodes).cpu


def ensure_namespace(name: str) -> None:
    requests.post(f"{os.environ['NOMAD_ADDR']}/v1/namespace", json={"Name": name}, timeout=10).raise_for_status()


def share_job(name: str, share: float, namespace: str = "default", **context) -> dict:
    """A probe job whose three tasks together ask `share` of the cluster's CPU."""
    cpu = cluster_cpu()
    spec = probe_job(name, namespace=namespace, context=context)
    spec["roles"]["chief"]["cpu"] = int(cpu * (share - 0.2))
    spec["roles"]["worker"]["cpu"] = int(cpu * 0.1)
    spec["roles"]["ps"]["cpu"] = int(cpu * 0.1)
    return spec


def queue_entries(namespace: str | None = None) -> list[dict]:
    """The admission queue's keys as Consul holds them (GET /v1/kv/...?recurse)."""
    prefix = wire.kv_queue_prefix(namespace) if namespace else wire.KV_QUEUE_PREFIX
    resp = requests.get(f"http://{os.environ['CONSUL_HTTP_ADDR']}/v1/kv/{prefix}", params={"recurse": "true"}, timeout=10)
    if resp.status_code == 404:
        return []
    resp.raise_for_status()
    return [{**item, "Value": json.loads(base64.b64decode(item["Value"] or b"e30="))} for item in resp.json()]


def run_id_in(text: str) -> str:
    match = re.search(r"run ([0-9a-f]{8})", text)
    assert match, text
    return match[1]


def queued_of(job_id: str, namespace: str = "default") -> list[QueuedRun]:
    """The job's runs in the admission queue (their records; GET /v1/kv/.../runs/<ns>/?recurse).
    Other tests on a shared stack may queue runs of their own: only this job's count."""
    return [r for r in AdmissionQueue().records(namespace) if r.job_id == job_id]


def job_exists(job_id: str, namespace: str = "default") -> bool:
    return requests.get(f"{os.environ['NOMAD_ADDR']}/v1/job/{job_id}", params={"namespace": namespace}, timeout=10).status_code == 200


def start_blocker(tmp_path: Path, share: float = 0.65) -> tuple[str, Path]:
    """A running job that holds `share` of the CPU until its release file exists."""
    name, release = unique("blocker"), tmp_path / "release-blocker"
    out = nomadtf("run", str(write_job(tmp_path, share_job(name, share, until_file=str(release)))), "--detach", timeout=120)
    assert out.returncode == 0, out.stderr
    wait_until(lambda: sum(a["ClientStatus"] == "running" for a in allocations(name)) == 3, 60, "the blocker to run")
    return name, release


def popen_run(path: Path, *args: str) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "nomadtf"
    return subprocess.Popen([str(exe), "run", str(path), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_teams_at_once_both_succeed_one_after_the_other_and_the_second_says_why_it_waited(stack, tmp_path):
    for namespace in (TEAM_A, TEAM_B):
        ensure_namespace(namespace)
    name = unique("share")
    spec = share_job(name, 0.65, sleep=3)
    del spec["namespace"]
    path = write_job(tmp_path, spec)  # the same job.json for both teams, as docs/guide/queueing.md shows
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = {
                ns: pool.submit(nomadtf, "run", str(path), "--var", f"namespace={ns}", "--timeout", "3m", timeout=240)
                for ns in (TEAM_A, TEAM_B)
            }
            results = {ns: future.result() for ns, future in futures.items()}
        for namespace, out in results.items():
            assert out.returncode == 0, (namespace, out.stderr)
        # The first admitted may have waited too (on a shared stack other jobs may hold CPU);
        # the second waited for the first, and said so.
        first, second = sorted(results, key=lambda ns: nomad(f"job/{name}", namespace=ns)["SubmitTime"])
        said = results[second].stderr
        assert "does not fit now: needs cpu" in said and f"{first}/{name} (cpu" in said, said
        assert re.search(r"place 1 of \d in the queue since \d\d:\d\d:\d\d", said), said
        assert re.search(r"admitted after \d+s in the queue", said), said
        firsts, seconds = (
            [a for a in nomad(f"job/{name}/allocations", namespace=ns)] for ns in (first, second)
        )
        # One after the other: the second's allocations were created once the first's had ended.
        assert min(a["CreateTime"] for a in seconds) >= max(a["ModifyTime"] for a in firsts) - 1e9
        for allocs in (firsts, seconds):
            # All or nothing: one registration each, its three allocations placed together.
            assert len(allocs) == 3 and len({a["JobVersion"] for a in allocs}) == 1
            assert (max(a["CreateTime"] for a in allocs) - min(a["CreateTime"] for a in allocs)) / 1e9 < 2
    finally:
        for namespace in (TEAM_A, TEAM_B):
            requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}", params={"purge": "true", "namespace": namespace}, timeout=10)


@pytest.mark.parametrize("shares, why", [((1.5,), "the largest node offers"), ((0.6, 0.6), "in all")])
def test_a_job_that_can_never_fit_fails_within_seconds_and_nothing_is_submitted(stack, tmp_path, shares, why):
    name = unique("never")
    cpu = cluster_cpu()
    spec = probe_job(name)
    for role, share in zip(("chief", "worker")[: len(shares)], shares, strict=True):
        spec["roles"][role]["cpu"] = int(cpu * share)
    started = time.monotonic()
    out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "2m")
    try:
        assert out.returncode == 1, out.stderr
        assert "cannot be placed" in out.stderr and "it can never fit" in out.stderr and why in out.stderr, out.stderr
        assert "queued" not in out.stderr
        assert time.monotonic() - started < 15
        assert not job_exists(name)
        plan = nomadtf("plan", str(write_job(tmp_path, spec)))
        assert plan.returncode == 1 and "it can never fit" in plan.stdout, plan.stdout
    finally:
        purge(name)


def test_a_queued_run_is_bounded_by_timeout_and_ctrl_c_removes_or_leaves_it(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    waiting = unique("waits")
    path = write_job(tmp_path, share_job(waiting, 0.65))
    try:
        started = time.monotonic()
        timed_out = nomadtf("run", str(path), "--timeout", "4s", timeout=60)
        assert timed_out.returncode == 3, timed_out.stderr
        assert "in the queue (--timeout)" in timed_out.stderr and "removed it from the queue, nothing was submitted" in timed_out.stderr
        assert time.monotonic() - started < 20 and not job_exists(waiting)
        ticket = wire.queue_ticket("default", waiting, run_id_in(timed_out.stderr))
        assert not [e for e in queue_entries("default") if e["Key"].endswith(ticket)]

        for choice in ("remove", "leave"):
            before = {e["Key"] for e in queue_entries("default")}
            proc = popen_run(path, "--on-interrupt", choice)
            wait_until(lambda before=before: {e["Key"] for e in queue_entries("default")} - before, 30, "the run to be queued")
            (key,) = {e["Key"] for e in queue_entries("default")} - before
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 130, err
            left = [e for e in queue_entries("default") if e["Key"] == key]
            if choice == "remove":
                assert "from the queue; nothing was submitted" in err and not left, err
            else:
                assert "in the queue, unattended" in err, err
                assert len(left) == 1 and not left[0].get("Session") and left[0]["Value"]["attended"] is False
                shown = nomadtf("status", waiting)
                assert shown.returncode == 0 and "queued: run" in shown.stdout and "for the admission service" in shown.stdout, shown
                # What it waits for: its needs, and what of them the blocker leaves it short of.
                needs = sum(r["cpu"] for r in share_job(waiting, 0.65)["roles"].values())
                assert f"needs cpu {needs} MHz, memory 1800 MB" in shown.stdout, shown.stdout
                assert re.search(r"; short of cpu \d+ MHz now \(for the admission service\)", shown.stdout), shown.stdout
                stopped = nomadtf("stop", waiting)
                assert stopped.returncode == 0 and "from the queue" in stopped.stdout, stopped.stdout + stopped.stderr
                assert not [e for e in queue_entries("default") if e["Key"] == key]
            assert not job_exists(waiting)
    finally:
        release.touch()
        purge(blocker)
        purge(waiting)


class _WithdrawnBeforeTheLock(AdmissionQueue):
    """The real queue in Consul, with `nomadtf stop` taking the job's runs out of it just
    before an admitter takes the lock: the window between its look at the queue and the
    lock, which must not crash it."""

    def __init__(self, job_id: str):
        super().__init__()
        self.job_id = job_id

    def acquire_lock(self, session: str, holder: str) -> bool:
        withdraw(self, "default", self.job_id)
        return super().acquire_lock(session, holder)


def test_a_run_withdrawn_just_before_the_lock_is_stopped_never_registered_and_the_service_skips_it(stack, tmp_path):
    name = unique("withdrawn")
    run = Run.from_job_file(write_job(tmp_path, probe_job(name)), [])
    kv = _WithdrawnBeforeTheLock(name)
    try:
        # A submitter: told it was removed (exit 4, JobStopped), nothing registered.
        with pytest.raises(JobStopped, match=r"was removed from the queue \(nomadtf stop"):
            run.submit(admission=Admission(run.api, kv, timeout_s=60))
        assert not job_exists(name) and not queued_of(name)
        # The admission service's step for an unattended run: skipped, no exception, nothing registered.
        ticket = wire.queue_ticket("default", name, "r1")
        kv.enqueue(Entry("default", ticket, 50, time.time(), attended=False), None)
        kv.put_record(QueuedRun("default", name, "r1", ticket, time.time(), attended=False, job=run.job))
        (entry,) = [e for e in kv.entries()[1] if e.ticket == ticket]
        holder = ConsulDiscovery(wire.ADMISSION_SERVICE_JOB, "default", client=kv.consul)
        try:
            session = holder.open_session("nomadtf-admission test")
            assert Admission(run.api, kv).admit_unattended(kv.record("default", ticket), entry, session, holder) is False
        finally:
            holder.close()
        assert not job_exists(name) and not queued_of(name)
        assert not [e for e in queue_entries("default") if e["Key"].endswith(ticket)]
    finally:
        purge(name)


def test_a_followed_queued_run_removed_by_stop_or_replace_exits_stopped(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    name = unique("dropped")
    path = write_job(tmp_path, share_job(name, 0.65, sleep=1))
    try:
        for how in ("stop", "replace"):
            before = {e["Key"] for e in queue_entries("default")}
            follower = popen_run(path, "--timeout", "2m")
            wait_until(lambda before=before: {e["Key"] for e in queue_entries("default")} - before, 30, "the run to be queued")
            if how == "stop":
                stopped = nomadtf("stop", name)
                assert stopped.returncode == 0 and f"removed {name} run" in stopped.stdout, stopped.stdout + stopped.stderr
            else:  # a new run with --replace takes the queued one's place (and waits itself)
                replacing = popen_run(path, "--replace", "--timeout", "2m")
            # The head waits on Nomad's allocations, not the queue: it hears at its next look
            # (admission.CAPACITY_WAIT_S, 30 s at most).
            _, err = follower.communicate(timeout=30 + 20)
            assert follower.returncode == 4, err
            assert "was removed from the queue (nomadtf stop, or a run with --replace); nothing was submitted" in err, err
            assert not job_exists(name)
        assert len(queued_of(name)) == 1  # only the replacing run's
        release.touch()
        _, err = replacing.communicate(timeout=120)
        assert replacing.returncode == 0, err
        assert "out of the queue (--replace)" in err, err
        assert len(nomad(f"job/{name}/versions")["Versions"]) == 1 and not queued_of(name)
    finally:
        release.touch()
        purge(blocker)
        purge(name)


def test_two_runs_of_one_job_queued_together_one_runs_the_other_is_refused(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    name = unique("twice")
    path = write_job(tmp_path, share_job(name, 0.65, sleep=1))
    procs = []
    try:
        for count in (1, 2):
            procs.append(popen_run(path, "--timeout", "2m"))
            wait_until(lambda count=count: len(queued_of(name)) == count, 30, "the run to be queued")
        release.touch()
        results = [proc.communicate(timeout=120) + (proc.returncode,) for proc in procs]
        assert sorted(code for _, _, code in results) == [0, 1], results
        (refused,) = [err for _, err, code in results if code == 1]
        assert f"another submission of {name} in namespace default registered first" in refused, refused
        assert "this run was not submitted" in refused
        assert len(nomad(f"job/{name}/versions")["Versions"]) == 1 and not queued_of(name)
    finally:
        release.touch()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        purge(blocker)
        purge(name)


def _plain_job(job_id: str, cpu: int, seconds: int) -> dict:
    """A job nomadtf did not start: raw_exec sleep, as another team's `nomad job run` would."""
    task = {"Name": "sleep", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": [str(seconds)]},
            "Resources": {"CPU": cpu, "MemoryMB": 64}}  # fmt: skip
    group = {"Name": "sleep", "Count": 1, "Tasks": [task], "RestartPolicy": {"Attempts": 0, "Mode": "fail"}}
    return {"Job": {"ID": job_id, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [group]}}


def test_capacity_taken_between_plan_and_placement_is_given_back_and_the_run_requeues_then_succeeds(stack, tmp_path):
    cpu = cluster_cpu()
    name, thief = unique("gang"), unique("thief")
    spec = probe_job(name, context={"sleep": 1}, admission={"gang_timeout": "3s"})
    spec["roles"]["chief"]["cpu"] = spec["roles"]["worker"]["cpu"] = int(cpu * 0.3)
    spec["roles"]["ps"]["cpu"] = 100
    stolen: list[float] = []

    def steal() -> None:
        """Between the plan that fits and the registration: a plain job takes all but 45 %
        of the CPU (and is placed before ours), as a job nomadtf did not start may. What is
        left holds the chief and the ps, not the worker too."""
        if stolen:
            return
        held = capacity.usage(nomad("allocations", namespace="*", resources="true", task_states="false"))
        free = cpu - capacity.total(held.values()).cpu
        submit_raw(_plain_job(thief, free - int(cpu * 0.45), 12))
        wait_until(lambda: [a for a in allocations(thief) if a["ClientStatus"] in ("pending", "running")], 30, "the thief to be placed")
        stolen.append(time.time())

    events: list[str] = []
    run = Run.from_job_file(write_job(tmp_path, spec), [])
    admission = Admission(run.api, on_event=events.append, on_status=lambda status: events.append(status.describe()), after_plan=steal, timeout_s=120)
    try:
        submitted = run.submit(admission=admission)
        outcome = run.follow(submitted, 120, on_view=lambda view: None, on_event=events.append)
        assert outcome.view.roles["chief"].complete == 1
        assert stolen and any("stayed placed in part for 3s (admission.gang_timeout)" in e for e in events), events
        allocs = allocations(name)
        first = min(a["JobVersion"] for a in allocs)
        partial = [a for a in allocs if a["JobVersion"] == first]
        assert partial and len(partial) < 3  # placed in part ...
        for alloc in partial:  # ... and given back within the gang timeout (plus the stop itself)
            assert alloc["DesiredStatus"] == "stop"
            assert (alloc["ModifyTime"] - alloc["CreateTime"]) / 1e9 < 3 + 8, alloc
        final = [a for a in allocs if a["JobVersion"] != first]
        assert len(final) == 3 and all(a["ClientStatus"] == "complete" for a in final)
        # The second attempt started once the thief had let go, not beside it.
        thief_end = max(a["ModifyTime"] for a in allocations(thief))
        assert min(a["CreateTime"] for a in final) >= thief_end - 1e9
    finally:
        purge(name)
        purge(thief)


def test_runs_queued_behind_a_running_job_start_in_priority_order(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    names = {priority: unique(f"prio{priority}") for priority in (30, 90, 60)}
    procs = {}
    try:
        for priority, name in names.items():  # arrival order: 30, 90, 60
            before = len(queue_entries())
            spec = share_job(name, 0.65, sleep=1)
            spec["priority"] = priority
            procs[priority] = popen_run(write_job(tmp_path, spec), "--timeout", "3m")
            wait_until(lambda before=before: len(queue_entries()) > before, 30, f"run of priority {priority} to be queued")
        release.touch()
        for priority, proc in procs.items():
            _, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, (priority, err)
        started = {priority: min(a["CreateTime"] for a in allocations(name)) for priority, name in names.items()}
        assert sorted(started, key=started.get) == [90, 60, 30], started
    finally:
        release.touch()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        purge(blocker)
        for name in names.values():
            purge(name)


# ---- nobody has to watch: the admission service ------------------------------------------


def _leader() -> str:
    out = nomadtf("admission", "status")
    assert out.returncode == 0, out.stderr
    match = re.search(r"^leader: (.*)$", out.stdout, re.M)
    return "" if match[1].startswith("none") else match[1]


def _serve() -> subprocess.Popen:
    exe = Path(sys.executable).parent / "nomadtf"
    return subprocess.Popen([str(exe), "admission", "serve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_succeeded(name: str, timeout: float) -> str:
    def done() -> str:
        out = nomadtf("status", name)
        return out.stdout if "outcome: succeeded" in out.stdout else ""

    return wait_until(done, timeout, f"{name} to succeed", interval=1.0)


def test_a_detached_queued_run_is_admitted_by_the_service_also_when_its_leader_dies(stack, tmp_path):
    replicas = [_serve(), _serve()]
    blocker, release = start_blocker(tmp_path)
    name = unique("unattended")
    try:
        leader = wait_until(_leader, 30, "a replica to lead")
        started = time.monotonic()
        out = nomadtf("run", str(write_job(tmp_path, share_job(name, 0.65, sleep=1))), "--detach", timeout=60)
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - started < 15 and "the admission service submits it in its turn" in out.stderr, out.stderr
        assert "queued: run" in nomadtf("status", name).stdout and not job_exists(name)
        # The leader's host dies (SIGKILL: no goodbye, its session lapses), nobody follows
        # the run, then the capacity comes back: the standby takes the lead and admits it.
        (dying,) = [p for p in replicas if f"pid {p.pid}" in leader]
        dying.kill()
        release.touch()
        status = _wait_succeeded(name, 120)
        assert re.search(r"run [0-9a-f]{8}", status)
        versions = nomad(f"job/{name}/versions")["Versions"]
        assert len(versions) == 1, versions  # registered once
        assert wait_until(_leader, 10, "a leader") != leader
        ticket = wire.queue_ticket("default", name, run_id_in(out.stderr))
        assert not [e for e in queue_entries("default") if e["Key"].endswith(ticket)]
    finally:
        release.touch()
        for proc in replicas:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)
        purge(blocker)
        purge(name)


def test_admission_deploy_runs_the_service_in_the_cluster(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    name = unique("deployed")
    try:
        out = nomadtf("admission", "deploy", "--count", "2")
        assert out.returncode == 0 and f"deployed {wire.ADMISSION_SERVICE_JOB} (2 replicas)" in out.stderr, out.stderr
        wait_until(lambda: sum(a["ClientStatus"] == "running" for a in allocations(wire.ADMISSION_SERVICE_JOB)) == 2, 60, "2 replicas")
        wait_until(_leader, 30, "a replica to lead")
        queued = nomadtf("run", str(write_job(tmp_path, share_job(name, 0.65, sleep=1))), "--detach", timeout=60)
        assert queued.returncode == 0 and "queued" in queued.stderr, queued.stderr
        release.touch()
        _wait_succeeded(name, 90)
        assert wire.ADMISSION_SERVICE_JOB not in nomadtf("status").stdout  # the service is no run
    finally:
        release.touch()
        requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{wire.ADMISSION_SERVICE_JOB}", params={"purge": "true"}, timeout=10)
        purge(blocker)
        purge(name)
