"""A shared cluster on the real single-node stack, with the admission controller `nomadtf dev
up` deploys: runs that do not fit now wait their turn suspended in Nomad (and say for
what), runs that can never fit fail at once, a run starts all at once or not at all, and
the queue keeps its order (docs/guide/queueing.md).

Every job here asks a share of the node's CPU (read from Nomad, not assumed): two jobs of
65 % can never run side by side, either fits alone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import requests

from nomadtf import wire
from nomadtf.admission import suspension
from nomadtf.admission.controller import Controller
from nomadtf.client.queued import read_board
from nomadtf.job import capacity
from nomadtf.job.answers import Allocation, Node, held_by_job
from nomadtf.servers.consulhttp import consul_client
from nomadtf.servers.nomad import NomadAPI
from tests.docs_commands import shown_argv, shown_argvs
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
    nodes = capacity.node_capacities(map(Node.from_api, nomad("nodes", resources="true")), {"Datacenters": ["*"]})
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


def job_of(name: str, namespace: str = "default") -> dict | None:
    resp = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}", params={"namespace": namespace}, timeout=10)
    return resp.json() if resp.status_code == 200 else None


def state_of(name: str, namespace: str = "default") -> str:
    """suspension.state of the job, "" when there is none, "stopped" when it was stopped."""
    job = job_of(name, namespace)
    if job is None:
        return ""
    return "stopped" if job.get("Stop") else suspension.state(job)


def wait_queued(name: str, namespace: str = "default") -> dict:
    """Until the run waits suspended in Nomad and the controller's board places it."""
    def queued():
        job = job_of(name, namespace)
        if job is None or job.get("Stop") or suspension.state(job) != suspension.QUEUED:
            return None  # (a stopped run's line may linger on the board for a second)
        ticket = wire.queue_ticket(namespace, name, job["Meta"][wire.META_RUN])
        return job if read_board().line_of(ticket) else None

    return wait_until(queued, 60, f"{namespace}/{name} queued on the board")


def scale_events(name: str, namespace: str = "default") -> dict[str, list[dict]]:
    data = requests.get(f"{os.environ['NOMAD_ADDR']}/v1/job/{name}/scale", params={"namespace": namespace}, timeout=10).json()
    return {group: status.get("Events") or [] for group, status in (data.get("TaskGroups") or {}).items()}


def start_blocker(tmp_path: Path, share: float = 0.65) -> tuple[str, Path]:
    """A running job that holds `share` of the CPU until its release file exists."""
    name, release = unique("blocker"), tmp_path / "release-blocker"
    out = nomadtf("run", str(write_job(tmp_path, share_job(name, share, until_file=str(release)))), "--detach", timeout=120)
    assert out.returncode == 0, out.stderr
    wait_until(lambda: sum(a["ClientStatus"] == "running" for a in allocations(name)) == 3, 60, "the blocker to run")
    return name, release


# Runs argv with SIGINT at its default: a session started in the background by a script
# (`scripts/test` runs two side by side; `cmd &` in any non-interactive shell) inherits SIGINT
# ignored, and Python then never turns a Ctrl-C into KeyboardInterrupt.
DEFAULT_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"


def popen_run(path: Path, *args: str) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "nomadtf"
    return subprocess.Popen([sys.executable, "-c", DEFAULT_SIGINT, str(exe), "run", str(path), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _plain_job(job_id: str, cpu: int, seconds: int, count: int = 1, port: int = 0, job_type: str = "batch") -> dict:
    """A job nomadtf did not start: raw_exec sleep, as another team's `nomad job run` would."""
    task = {"Name": "sleep", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": [str(seconds)]},
            "Resources": {"CPU": cpu, "MemoryMB": 64}}  # fmt: skip
    group = {"Name": "sleep", "Count": count, "Tasks": [task], "RestartPolicy": {"Attempts": 0, "Mode": "fail"}}
    if port:
        group["Networks"] = [{"ReservedPorts": [{"Label": "fixed", "Value": port}]}]
    return {"Job": {"ID": job_id, "Type": job_type, "Datacenters": ["*"], "TaskGroups": [group]}}


def test_two_teams_at_once_both_succeed_one_after_the_other_and_the_second_says_why_it_waited(stack, tmp_path):
    for namespace in (TEAM_A, TEAM_B):
        ensure_namespace(namespace)
    name = unique("share")
    spec = share_job(name, 0.65, sleep=3)
    del spec["namespace"]
    path = write_job(tmp_path, spec)  # the same job.json for both teams, as docs/guide/queueing.md shows
    try:
        # The page's two commands, one per team, with its job.json being this one.
        shown = {argv[-1].removeprefix("namespace="): [str(path) if arg == "job.json" else arg for arg in argv]
                 for argv in shown_argvs(r"nomadtf run job.json --var namespace=team-[ab]")}
        assert sorted(shown) == [TEAM_A, TEAM_B], shown
        with ThreadPoolExecutor(2) as pool:
            futures = {ns: pool.submit(nomadtf, *argv, "--timeout", "3m", timeout=240) for ns, argv in shown.items()}
            results = {ns: future.result() for ns, future in futures.items()}
        for namespace, out in results.items():
            assert out.returncode == 0, (namespace, out.stderr)
        firsts, seconds = sorted(
            (nomad(f"job/{name}/allocations", namespace=ns) for ns in (TEAM_A, TEAM_B)), key=lambda allocs: min(a["CreateTime"] for a in allocs)
        )
        second = seconds[0]["Namespace"]
        said = results[second].stderr
        assert "does not fit now: needs cpu" in said and "the cluster lacks cpu" in said, said
        assert re.search(r"place 1 of \d in the queue since \d\d:\d\d:\d\d", said), said
        assert re.search(r"admitted after \d+s in the queue", said), said
        # One after the other: the second's allocations were created once the first's had ended.
        assert min(a["CreateTime"] for a in seconds) >= max(a["ModifyTime"] for a in firsts) - 1e9
        for allocs in (firsts, seconds):
            # All or nothing: its three allocations placed together, none placed twice.
            assert len(allocs) == 3
            assert (max(a["CreateTime"] for a in allocs) - min(a["CreateTime"] for a in allocs)) / 1e9 < 2
        # While it waited it was a suspended job in its own namespace, shown pending in the UI.
        job = nomad(f"job/{name}", namespace=second)
        assert job["Meta"][suspension.META_ADMISSION] == suspension.SUSPENDED
        assert suspension.state(job) == suspension.ADMITTED
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
        assert job_of(name) is None
        plan = nomadtf("plan", str(write_job(tmp_path, spec)))
        assert plan.returncode == 1 and "it can never fit" in plan.stdout, plan.stdout
    finally:
        purge(name)


def test_what_long_running_jobs_hold_and_static_ports_make_never_and_the_controller_says_so_at_once(stack, tmp_path):
    """The submitter's plan sees capacity in use; the controller knows what no batch run's end
    gives back (service jobs: its own replicas) and that two allocations wanting one static
    port need two nodes: it refuses both at once with the reason, and the run's follower and
    `status` say it."""
    name, ported = unique("held-for-good"), unique("ported")
    spec = probe_job(name)
    spec["roles"]["chief"]["cpu"] = cluster_cpu() - 2 * 200 - 50  # the controller's replicas hold 2 x 100 MHz
    try:
        started = time.monotonic()
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "2m", timeout=150)
        assert out.returncode == 1, out.stderr
        assert "was not admitted: nomadtf admission refused run" in out.stderr and "it can never fit" in out.stderr, out.stderr
        assert "long-running" in out.stderr, out.stderr
        assert time.monotonic() - started < 30
        assert state_of(name) == suspension.REFUSED and not allocations(name)
        shown = nomadtf("status", name)
        assert "not admitted: nomadtf admission refused run" in shown.stdout, shown.stdout

        # A suspended run as any client could register it: two sleeps that both want port 23456.
        body = suspension.suspend(_plain_job(ported, 50, 5, count=2, port=23456), gang_timeout_s=5)
        body["Job"]["Meta"].update({wire.META_VERSION: "test", wire.META_RUN: "r1"})
        submit_raw(body)
        wait_until(lambda: state_of(ported) == suspension.REFUSED, 30, "the controller to refuse the static-port run")
        (event, *_) = scale_events(ported)[suspension.PLACEHOLDER_GROUP]
        assert "must each have a node of their own" in event["Message"], event
        assert not allocations(ported)
    finally:
        purge(name)
        purge(ported)


def test_a_queued_run_is_bounded_by_timeout_and_ctrl_c_removes_or_leaves_it(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    waiting = unique("waits")
    path = write_job(tmp_path, share_job(waiting, 0.65))
    try:
        started = time.monotonic()
        timed_out = nomadtf("run", str(path), "--timeout", "4s", timeout=60)
        assert timed_out.returncode == 3, timed_out.stderr
        assert "in the queue (--timeout)" in timed_out.stderr and "removed it from the queue, nothing of it ran" in timed_out.stderr
        assert time.monotonic() - started < 20 and state_of(waiting) == "stopped" and not allocations(waiting)

        for choice in ("remove", "leave"):
            proc = popen_run(path, "--on-interrupt", choice, "--replace")
            job = wait_queued(waiting)
            time.sleep(1)  # the follower is in its wait for admission (the board can list the run a moment before)
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=90)  # a loaded machine: the stop itself is one Nomad call
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
                raise AssertionError(f"`run` did not end within 90 s of Ctrl-C; its stderr:\n{err}") from None
            assert proc.returncode == 130, err
            if choice == "remove":
                assert "from the queue; nothing of it ran" in err, err
                assert state_of(waiting) == "stopped"
            else:
                assert "in the queue: the admission controller starts it in its turn" in err, err
                assert state_of(waiting) == suspension.QUEUED and job_of(waiting)["Meta"][wire.META_RUN] == job["Meta"][wire.META_RUN]
                # Nomad's job GC (forced: every dead job, whatever its age) leaves a queued run be.
                requests.put(f"{os.environ['NOMAD_ADDR']}/v1/system/gc", timeout=30).raise_for_status()
                time.sleep(1)
                assert state_of(waiting) == suspension.QUEUED and job_of(waiting)["Status"] == "pending"
                shown = nomadtf("status", waiting)
                assert shown.returncode == 0 and "queued: default/" in shown.stdout, shown
                # What it waits for: its needs, and what of them the blocker leaves it short of.
                needs = sum(r["cpu"] for r in share_job(waiting, 0.65)["roles"].values())
                assert f"needs cpu {needs} MHz, memory 1800 MB" in shown.stdout, shown.stdout
                assert re.search(r"the cluster lacks cpu \d+ MHz now; place \d+ of \d+", shown.stdout), shown.stdout
                listed = nomadtf("status")
                assert re.search(rf"^{waiting}\s+queued: ", listed.stdout, re.M), listed.stdout
                stopped = nomadtf("stop", waiting)
                assert stopped.returncode == 0 and f"removed {waiting} run" in stopped.stdout, stopped.stdout + stopped.stderr
                assert state_of(waiting) == "stopped"
            assert not allocations(waiting)
    finally:
        release.touch()
        purge(blocker)
        purge(waiting)


def test_a_run_stopped_while_the_controller_admits_it_never_starts(stack, tmp_path):
    """The race of `nomadtf stop` with an admission: a queued run is stopped, then its groups
    are scaled up as a controller that read it a moment before would; Nomad keeps a stopped
    job stopped, so nothing of it ever starts; its follower was told it was removed."""
    blocker, release = start_blocker(tmp_path)
    name = unique("raced")
    follower = popen_run(write_job(tmp_path, share_job(name, 0.65, sleep=1)), "--timeout", "2m")
    try:
        job = wait_queued(name)
        stopped = nomadtf("stop", name)
        assert stopped.returncode == 0 and f"removed {name} run" in stopped.stdout, stopped.stdout
        api = NomadAPI.from_env()
        wanted = suspension.Suspension.of(job)
        for group, count in sorted(wanted.counts.items()):  # the late admitting calls
            api.scale(name, group, count, "a controller's late admission")
        api.scale(name, suspension.PLACEHOLDER_GROUP, 0, "a controller's late admission")
        release.touch()
        _, err = follower.communicate(timeout=60)
        assert follower.returncode == 4, err
        assert "was removed from the queue" in err or "stopped from outside (nomadtf stop" in err, err
        time.sleep(3)  # the blocker's capacity is free: a run Nomad would place is placed by now
        assert job_of(name)["Stop"] and not allocations(name)
    finally:
        release.touch()
        if follower.poll() is None:
            follower.kill()
        purge(blocker)
        purge(name)


def test_a_followed_queued_run_removed_by_replace_exits_stopped_and_one_run_per_job_waits(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    name = unique("dropped")
    path = write_job(tmp_path, share_job(name, 0.65, sleep=1))
    replacing = None
    try:
        follower = popen_run(path, "--timeout", "2m")
        wait_queued(name)
        twice = nomadtf("run", str(path), "--timeout", "1m")
        assert twice.returncode == 1 and "already has a run waiting in the admission queue" in twice.stderr, twice.stderr
        replacing = popen_run(path, "--replace", "--timeout", "2m")
        _, err = follower.communicate(timeout=60)
        assert follower.returncode == 4 and "was removed from the queue" in err, err
        release.touch()
        _, err = replacing.communicate(timeout=120)
        assert replacing.returncode == 0, err
        assert "out of the queue (--replace)" in err, err
        assert len(allocations(name)) == 3  # only the replacing run ever ran
    finally:
        release.touch()
        if replacing is not None and replacing.poll() is None:
            replacing.kill()
        purge(blocker)
        purge(name)


def test_runs_queued_behind_a_running_job_start_in_priority_order(stack, tmp_path):
    blocker, release = start_blocker(tmp_path)
    names = {priority: unique(f"prio{priority}") for priority in (30, 90, 60)}
    try:
        for priority, name in names.items():  # arrival order: 30, 90, 60; nobody follows them
            spec = share_job(name, 0.65, sleep=1)
            spec["priority"] = priority
            out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach", timeout=60)
            assert out.returncode == 0 and "the admission controller starts it in its turn" in out.stderr, out.stderr
            wait_queued(name)
        places = {p: read_board().line_of(wire.queue_ticket("default", n, job_of(n)["Meta"][wire.META_RUN])).place for p, n in names.items()}
        assert sorted(places, key=places.get) == [90, 60, 30], places
        release.touch()
        for name in names.values():
            wait_until(lambda name=name: "outcome: succeeded" in nomadtf("status", name).stdout, 180, f"{name} to succeed", interval=1.0)
        started = {priority: min(a["CreateTime"] for a in allocations(name)) for priority, name in names.items()}
        assert sorted(started, key=started.get) == [90, 60, 30], started
    finally:
        release.touch()
        purge(blocker)
        for name in names.values():
            purge(name)


def test_a_node_made_ineligible_while_a_run_waits_holds_it_and_it_runs_when_the_node_returns(stack, tmp_path):
    """The only node taken out of scheduling (as a drain or a reboot does) is no "never":
    the run waits and starts once the node is eligible again."""
    (node,) = nomad("nodes")
    name = unique("node-away")
    path = write_job(tmp_path, share_job(name, 0.3, sleep=1))  # sized while the node counts
    url = f"{os.environ['NOMAD_ADDR']}/v1/node/{node['ID']}/eligibility"
    requests.post(url, json={"Eligibility": "ineligible"}, timeout=10).raise_for_status()
    try:
        follower = popen_run(path, "--timeout", "3m")
        wait_queued(name)
        time.sleep(2)
        assert follower.poll() is None and state_of(name) == suspension.QUEUED
        requests.post(url, json={"Eligibility": "eligible"}, timeout=10).raise_for_status()
        _, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err
        assert "does not fit now" in err and re.search(r"admitted after \d+s in the queue", err), err
    finally:
        requests.post(url, json={"Eligibility": "eligible"}, timeout=10)
        purge(name)


def test_a_half_admitted_run_is_finished_once_by_the_controller(stack, tmp_path):
    """What a leader that died between two admitting calls leaves: one group scaled up, the
    placeholder still up. The leading controller finishes the admission: every group once."""
    name = unique("half")
    out = nomadtf("run", str(write_job(tmp_path, share_job(name, 0.65, sleep=1))), "--detach", timeout=60)
    assert out.returncode == 0, out.stderr
    try:
        # Wait for the controller to have run it to an end, then register the next run
        # suspended ourselves and scale one group as a dying leader would have.
        wait_until(lambda: "outcome: succeeded" in nomadtf("status", name).stdout, 120, f"{name} to succeed", interval=1.0)
        blocker, release = start_blocker(tmp_path)
        try:
            queued = nomadtf("run", str(write_job(tmp_path, share_job(name, 0.65, sleep=1))), "--detach", timeout=60)
            assert queued.returncode == 0, queued.stderr
            job = wait_queued(name)
            # A leader records its intent, then scales group by group: this one died after its first call.
            consul_client().kv.put(wire.kv_admitted("default", name), job["Meta"][wire.META_RUN])
            NomadAPI.from_env().scale(name, "ps", 1, "a leader's first admitting call, then it died")
            release.touch()
            wait_until(lambda: "outcome: succeeded" in nomadtf("status", name).stdout and job_of(name)["Meta"][wire.META_RUN] == job["Meta"][wire.META_RUN],
                       120, f"{name}'s second run to succeed", interval=1.0)  # fmt: skip
        finally:
            release.touch()
            purge(blocker)
        events = scale_events(name)
        run_id = job["Meta"][wire.META_RUN]
        for group in ("chief", "worker", "ps"):
            ups = [e for e in events[group] if (e.get("Count") or 0) > 0 and e.get("Time", 0) / 1e9 >= job["SubmitTime"] / 1e9 - 1]
            assert len(ups) == 1, (group, ups)  # scaled up once: by the dead leader (ps) or the controller
        assert any((e.get("Meta") or {}).get(wire.META_RUN) == run_id for e in events[suspension.PLACEHOLDER_GROUP])
    finally:
        purge(name)


def test_a_run_its_submitter_resumes_out_of_turn_is_suspended_again_and_waits_its_turn(stack, tmp_path):
    """Nomad CE lets a token with scale-job scale its own jobs: a queued run scaled up by its
    submitter (not by the controller) is suspended again and runs only in its turn."""
    blocker, release = start_blocker(tmp_path)
    name, head = unique("jumper"), unique("head")
    try:
        # In line: a large run at the head (it waits for the blocker), a small one behind it.
        go = tmp_path / "jumper-go"  # the jumper's tasks wait for it: one placed out of turn cannot finish before it is seen
        # 40 %: it does not fit beside the blocker either (no backfill past the head).
        for job_id, share, context in ((head, 0.65, {"sleep": 1}), (name, 0.4, {"until_file": str(go)})):
            out = nomadtf("run", str(write_job(tmp_path, share_job(job_id, share, **context))), "--detach", timeout=60)
            assert out.returncode == 0, out.stderr
            job = wait_queued(job_id)
        api = NomadAPI.from_env()
        for group, count in sorted(suspension.Suspension.of(job).counts.items()):
            api.scale(name, group, count, "my own run, now")
        wait_until(lambda: any("resumed out of turn" in (e.get("Message") or "") for events in scale_events(name).values() for e in events),
                   30, "the controller to suspend it again")  # fmt: skip
        release.touch()
        go.touch()
        for job_id in (head, name):
            wait_until(lambda job_id=job_id: "outcome: succeeded" in nomadtf("status", job_id).stdout, 180, f"{job_id} to succeed", interval=1.0)
    finally:
        release.touch()
        purge(blocker)
        purge(name)
        purge(head)


def test_a_run_not_placed_whole_is_given_back_and_requeued_then_succeeds_without_its_submitter(stack, tmp_path):
    """Capacity taken between the controller's fit and Nomad's placement (a job nomadtf did
    not start): the placed part is given back after the gang timeout and the run waits
    again at its place; its submitter had gone (`--detach`); it succeeds once the thief
    ended. The stack's deployed controller is stopped for the test and this one leads."""
    cpu = cluster_cpu()
    name, thief = unique("gang"), unique("thief")
    spec = probe_job(name, context={"sleep": 1}, admission={"gang_timeout": "3s"})
    spec["roles"]["chief"]["cpu"] = spec["roles"]["worker"]["cpu"] = int(cpu * 0.3)
    spec["roles"]["ps"]["cpu"] = 100
    stolen: list[float] = []

    def steal(run) -> None:
        """A plain job takes all but 45 % of the CPU and is placed before ours: what is left
        holds the chief and the ps, not the worker too."""
        if stolen or run.job_id != name:
            return
        held = held_by_job(map(Allocation.from_api, nomad("allocations", namespace="*", resources="true", task_states="false")))
        submit_raw(_plain_job(thief, cpu - capacity.total(held.values()).cpu - int(cpu * 0.45), 12))
        wait_until(lambda: [a for a in allocations(thief) if a["ClientStatus"] in ("pending", "running")], 30, "the thief to be placed")
        stolen.append(time.time())

    events: list[str] = []
    stop = threading.Event()
    requests.delete(f"{os.environ['NOMAD_ADDR']}/v1/job/{wire.ADMISSION_SERVICE_JOB}", params={"purge": "true"}, timeout=10).raise_for_status()
    wait_until(lambda: not read_leader(), 60, "the deployed controller to hand the lead on")
    controller = Controller(NomadAPI.from_env(namespace="*"), consul_client(), "test controller", on_event=events.append, after_fit=steal)
    serving = threading.Thread(target=controller.serve, args=(stop,), daemon=True)
    serving.start()
    try:
        out = nomadtf("run", str(write_job(tmp_path, spec)), "--detach", timeout=60)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: "outcome: succeeded" in nomadtf("status", name).stdout, 120, f"{name} to succeed", interval=1.0)
        assert stolen and any("not placed whole within 3s: gave back its placed part; queued again" in e for e in events), events
        allocs = sorted(allocations(name), key=lambda a: a["CreateIndex"])
        final = list({a["TaskGroup"]: a for a in allocs}.values())  # each group's newest: the admission that ran
        first = [a for a in allocs if a not in final]
        assert sorted(a["TaskGroup"] for a in final) == ["chief", "ps", "worker"] and all(a["ClientStatus"] == "complete" for a in final)
        assert first and len(first) < 3, first  # placed in part ...
        for alloc in first:  # ... and given back within the gang timeout (plus the stop itself)
            assert alloc["DesiredStatus"] == "stop" and (alloc["ModifyTime"] - alloc["CreateTime"]) / 1e9 < 3 + 8, alloc
        # The second admission came once the thief had let go, not beside it.
        (thief_alloc,) = allocations(thief)
        finished = thief_alloc["TaskStates"]["sleep"]["FinishedAt"]
        thief_end = datetime.fromisoformat(finished[:26].rstrip("Z") + "+00:00").timestamp()
        assert min(a["CreateTime"] for a in final) / 1e9 >= thief_end - 1, (finished, final)
    finally:
        stop.set()
        serving.join(timeout=40)
        purge(name)
        purge(thief)
        # The stack's controller again, deployed as an operator does (docs/guide/queueing.md).
        deployed = nomadtf(*shown_argv(r"nomadtf admission deploy"))
        assert deployed.returncode == 0 and f"deployed {wire.ADMISSION_SERVICE_JOB} (2 replicas)" in deployed.stderr, deployed.stderr
        wait_until(read_leader, 60, "the redeployed controller to lead")


def read_leader() -> str:
    out = nomadtf("admission", "status")
    assert out.returncode == 0, out.stderr
    match = re.search(r"^leader: (.*)$", out.stdout, re.M)
    return "" if match[1].startswith("none") else match[1]


def test_a_detached_run_is_admitted_when_the_leading_replica_is_killed(stack, tmp_path):
    """The deployed controller's leader is SIGKILLed while a detached run waits: its session
    lapses, the lock-delay passes, a replica takes the lead and admits the run, each group
    once; `admission status` and `nomadtf status` show the controller is no run."""
    import psutil

    blocker, release = start_blocker(tmp_path)
    name = unique("unattended")
    try:
        leader = wait_until(read_leader, 30, "a replica to lead")
        out = nomadtf("run", str(write_job(tmp_path, share_job(name, 0.65, sleep=1))), "--detach", timeout=60)
        assert out.returncode == 0 and "the admission controller starts it in its turn" in out.stderr, out.stderr
        wait_queued(name)
        pid = int(re.search(r"pid (\d+)", leader)[1])
        psutil.Process(pid).kill()
        release.touch()
        wait_until(lambda: "outcome: succeeded" in nomadtf("status", name).stdout, 150, f"{name} to succeed", interval=1.0)
        events = scale_events(name)
        for group in ("chief", "worker", "ps"):
            assert [e["Count"] for e in events[group] if (e.get("Count") or 0) > 0] == [1], events[group]
        assert wait_until(read_leader, 30, "a leader") != leader
        assert wire.ADMISSION_SERVICE_JOB not in nomadtf("status").stdout  # the controller is no run
    finally:
        release.touch()
        purge(blocker)
        purge(name)


def test_a_run_queued_longer_than_its_deadline_counts_it_from_its_admission_and_succeeds(stack, tmp_path):
    """recovery.deadline 20 s; the run waits 25 s behind another; admitted, it trains its 3 s
    and succeeds (the deadline counts from the admission the controller recorded)."""
    blocker, release = start_blocker(tmp_path)
    name = unique("late-deadline")
    spec = share_job(name, 0.65, sleep=3)
    spec["recovery"]["deadline"] = "20s"
    try:
        follower = popen_run(write_job(tmp_path, spec), "--timeout", "3m")
        job = wait_queued(name)
        time.sleep(25)
        assert follower.poll() is None and state_of(name) == suspension.QUEUED
        release.touch()
        _, err = follower.communicate(timeout=150)
        assert follower.returncode == 0, err
        admitted_at = consul_client().kv.get(wire.kv_admitted_at("default", name, job["Meta"][wire.META_RUN]))[1]
        assert admitted_at and float(admitted_at["Value"]) >= job["SubmitTime"] / 1e9 + 25
    finally:
        release.touch()
        purge(blocker)
        purge(name)


def test_a_run_whose_cluster_never_forms_is_queued_again_with_a_backoff_then_refused_with_the_reason(stack):
    """A suspended run whose tasks never form a cluster (plain sleeps: no nomadtf task writes
    its generation) with a ready timeout of 5 s and one requeue allowed: admitted and placed,
    given back after 5 s and queued again, admitted again only after its backoff, then
    refused with the reason. Nomad's scaling events tell the whole story."""
    name = unique("never-forms")
    body = suspension.suspend(_plain_job(name, 50, 300), gang_timeout_s=30, ready_timeout_s=5, requeue_limit=1)
    body["Job"]["Meta"].update({wire.META_VERSION: "test", wire.META_RUN: "r1"})
    try:
        submit_raw(body)
        wait_until(lambda: state_of(name) == suspension.REFUSED, 90, "the controller to give up on the run")
        events = list(reversed(scale_events(name)[suspension.PLACEHOLDER_GROUP]))  # oldest first
        said = [(e["Meta"].get(suspension.META_ADMISSION), e["Count"], e["Message"]) for e in events if e.get("Meta")]
        verdicts = [verdict for verdict, _, _ in said]
        assert verdicts == ["admitted", "not-ready", "admitted", "not-ready", "refused"], said
        first_requeue = events[[e.get("Meta", {}).get(suspension.META_ADMISSION) for e in events].index("not-ready")]
        assert "its cluster did not form within 5s of being placed; queued again (1 of 1), next try in 10s" in first_requeue["Message"]
        second_admission = [e for e in events if (e.get("Meta") or {}).get(suspension.META_ADMISSION) == "admitted"][1]
        assert (second_admission["Time"] - first_requeue["Time"]) / 1e9 >= 9.5  # the backoff
        assert "its cluster did not form within 5s of being placed, 2 times (admission.requeue_limit 1)" in said[-1][2]
        wait_until(lambda: not [a for a in allocations(name) if a["ClientStatus"] in ("pending", "running")], 30, "its allocations to stop")
    finally:
        purge(name)
