"""Fair sharing on the local stack: five teams with different arrival rates and run sizes
submit more than the cluster holds; how fairly, how fully and how soon the admission
controller (the stack's deployed one) shares it (issue 32, "Measured").

Each run is a tiny suspended job (one raw_exec `sleep`, registered the way `nomadtf run`
registers one) in the team's namespace (`bench-share-1` … `-5`, made for the bench), asking a
share of the node's CPU. The teams, by size, duration and arrival (a run every so many
seconds, the same arrival pattern in every round):

    team 1: 10 % for 3 s, every 0.5 s      team 4: 35 % for 6 s, every 3 s
    team 2: 15 % for 4 s, every 1 s        team 5: 60 % for 8 s, every 6 s
    team 3: 25 % for 5 s, every 2 s

about 3.3 times what the cluster holds while they all arrive. For the bench the sharing
policy is `{"half_life": "1m", "reserve_after": "20s"}` (equal weights, no quotas); the one
stored before is put back at the end. From each run's allocation (Nomad's task start and end
times) and submission, on 0.5 s slices from the first submission to the last end:

- **Jain's index** over the busy period (the slices where the teams with runs in the system
  ask more than the cluster holds): each team's CPU-seconds held against its max-min fair
  share of the cluster in each slice (water-filling over what each team asks); 1 is perfectly
  fair; target at least 0.95;
- **utilisation while runs wait**: the CPU held as a share of what runs may use, over the
  slices where some run waits; target at least 90 %;
- **the largest runs' wait** (team 5), p50 and max, against the reservation rule's bound
  (`reserve_after` plus the longest run it may wait behind);
- each team's runs, mean wait and CPU-seconds.

Steps lost to preemption with and without the checkpoint request: bench/bench_preemption.py.

Needs the local single-node stack without ACLs with its admission controller:
`nomadtf dev up && eval "$(nomadtf dev env)"`, then
`PYTHONPATH=$PWD python bench/bench_sharing.py [--runs 200]`. 200 runs take about 4 minutes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nomadtf import wire  # noqa: E402
from nomadtf.admission import suspension  # noqa: E402
from nomadtf.job import capacity  # noqa: E402
from nomadtf.job.answers import Allocation, Node  # noqa: E402
from nomadtf.servers.consulhttp import consul_client  # noqa: E402
from nomadtf.servers.nomadhttp import NomadSettings  # noqa: E402

NOMAD = NomadSettings.from_env().address
POLICY = {"half_life": "1m", "reserve_after": "20s"}
SLICE_S = 0.5


@dataclass(frozen=True)
class Team:
    name: str
    share: float
    duration_s: float
    every_s: float


TEAMS = [
    Team("bench-share-1", 0.10, 3, 0.5),
    Team("bench-share-2", 0.15, 4, 1.0),
    Team("bench-share-3", 0.25, 5, 2.0),
    Team("bench-share-4", 0.35, 6, 3.0),
    Team("bench-share-5", 0.60, 8, 6.0),
]


@dataclass
class Run:
    team: Team
    job_id: str
    cpu: int
    submitted: float = 0.0
    started: float | None = None
    ended: float | None = None


def nomad(method: str, path: str, **kwargs: Any) -> Any:
    resp = requests.request(method, f"{NOMAD}/v1/{path}", timeout=30, **kwargs)
    resp.raise_for_status()
    return resp.json() if resp.content else None


def usable_cpu() -> int:
    """The node CPU batch runs may use: what Nomad offers less what service jobs hold (the
    controller's own replicas)."""
    nodes = nomad("get", "nodes", params={"resources": "true"})
    offered = capacity.cluster_capacity(capacity.node_capacities(map(Node.from_api, nodes), {"Datacenters": ["*"]})).cpu
    allocs = nomad("get", "allocations", params={"resources": "true", "namespace": "*"})
    held = sum(a.resources.cpu for a in map(Allocation.from_api, allocs) if a.holds_resources and a.job_type != "batch")
    return offered - held


def body(run: Run) -> dict[str, Any]:
    task = {"Name": "work", "Driver": "raw_exec", "Config": {"command": "/bin/sleep", "args": [f"{run.team.duration_s:g}"]},
            "Resources": {"CPU": run.cpu, "MemoryMB": 16}, "LogConfig": {"MaxFiles": 1, "MaxFileSizeMB": 1}}  # fmt: skip
    group = {"Name": "work", "Count": 1, "Tasks": [task], "EphemeralDisk": {"SizeMB": 10},
             "RestartPolicy": {"Attempts": 0, "Mode": "fail"}, "ReschedulePolicy": {"Attempts": 0, "Unlimited": False}}  # fmt: skip
    job = {"Job": {"ID": run.job_id, "Namespace": run.team.name, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [group],
                   "Meta": {wire.META_VERSION: "bench", wire.META_RUN: uuid.uuid4().hex[:8]}}}  # fmt: skip
    return suspension.suspend(job, gang_timeout_s=600)


def schedule(total: int) -> list[tuple[float, Team]]:
    """(offset, team) of every run, by arrival: each team at its own pace, `total` in all."""
    arrivals = sorted((i * team.every_s, k, team) for k, team in enumerate(TEAMS) for i in range(total))
    return [(at, team) for at, _, team in arrivals[:total]]


def parse_time(text: str | None) -> float | None:
    """Nomad's RFC 3339 time with nanoseconds ("2026-12-06T08:40:01.123456789Z"); None for its zero time."""
    if not text or text.startswith("0001-"):
        return None
    whole, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp() + float(f"0.{fraction or 0}")


def read_times(run: Run) -> None:
    for alloc in nomad("get", f"job/{run.job_id}/allocations", params={"namespace": run.team.name}):
        state = (alloc.get("TaskStates") or {}).get("work") or {}
        started, ended = parse_time(state.get("StartedAt")), parse_time(state.get("FinishedAt"))
        if started:
            run.started = min(run.started or started, started)
        if ended:
            run.ended = max(run.ended or ended, ended)


def water_fill(capacity_: float, asks: dict[str, float]) -> dict[str, float]:
    """Max-min fair shares of `capacity_` among `asks` (equal weights)."""
    share, left, open_ = {k: 0.0 for k in asks}, capacity_, {k for k, v in asks.items() if v > 0}
    while open_ and left > 1e-9:
        each = left / len(open_)
        for k in sorted(open_, key=lambda k: asks[k] - share[k]):
            take = min(each, asks[k] - share[k])
            share[k] += take
            left -= take
        open_ = {k for k in open_ if asks[k] - share[k] > 1e-9}
    return share


def measure(runs: list[Run], cpu: int) -> dict[str, Any]:
    start = min(r.submitted for r in runs)
    end = max(r.ended or r.submitted for r in runs)
    held_s = {t.name: 0.0 for t in TEAMS}
    fair_s = {t.name: 0.0 for t in TEAMS}
    waiting_used, waiting_slices, busy = 0.0, 0, 0
    for k in itertools.count():
        t = start + (k + 0.5) * SLICE_S
        if t > end:
            break
        asks = {team.name: 0.0 for team in TEAMS}
        held = {team.name: 0.0 for team in TEAMS}
        waits = False
        for r in runs:
            if r.submitted <= t and (r.ended is None or t < r.ended):
                asks[r.team.name] += r.cpu
                if r.started is not None and r.started <= t:
                    held[r.team.name] += r.cpu
                else:
                    waits = True
        if waits:
            waiting_slices += 1
            waiting_used += sum(held.values()) / cpu
        if sum(asks.values()) > cpu:
            busy += 1
            fair = water_fill(cpu, asks)
            for name in held_s:
                held_s[name] += held[name] * SLICE_S
                fair_s[name] += fair[name] * SLICE_S
    ratios = [held_s[n] / fair_s[n] for n in held_s if fair_s[n] > 0]
    jain = sum(ratios) ** 2 / (len(ratios) * sum(x * x for x in ratios)) if ratios else float("nan")
    return {"jain": jain, "utilisation": waiting_used / waiting_slices if waiting_slices else float("nan"),
            "busy_s": busy * SLICE_S, "ratios": dict(zip([n for n in held_s if fair_s[n] > 0], ratios, strict=True))}  # fmt: skip


def policy_swap(value: dict[str, Any] | None) -> bytes | None:
    """Store `value` (None: delete) as the sharing policy; what was there."""
    client = consul_client()
    _, item = client.kv.get(wire.KV_ADMISSION_POLICY)
    if value is None:
        client.kv.delete(wire.KV_ADMISSION_POLICY)
    else:
        client.kv.put(wire.KV_ADMISSION_POLICY, json.dumps(value))
    return (item or {}).get("Value")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--reserve-after", default=POLICY["reserve_after"], help="the policy's reserve_after for the bench (e.g. 10m: none in a 4-minute bench)")
    args = parser.parse_args()
    POLICY["reserve_after"] = args.reserve_after
    cpu = usable_cpu()
    tag = uuid.uuid4().hex[:6]
    runs = [Run(team, f"share-{tag}-{i:03d}", max(1, int(cpu * team.share))) for i, (_, team) in enumerate(schedule(args.runs))]
    offsets = [at for at, _ in schedule(args.runs)]
    made: list[str] = []
    before = None
    try:
        for team in TEAMS:
            nomad("post", "namespace", json={"Name": team.name, "Description": "bench/bench_sharing.py"})
            made.append(team.name)
        before = policy_swap(POLICY)
        time.sleep(12)  # the controller reads the policy every 10 s
        print(f"{len(runs)} runs from {len(TEAMS)} teams on {cpu} MHz ...", file=sys.stderr, flush=True)
        origin = time.time() + 1
        with ThreadPoolExecutor(4) as pool:
            for run, at in zip(runs, offsets, strict=True):
                time.sleep(max(0.0, origin + at - time.time()))
                run.submitted = time.time()
                pool.submit(nomad, "post", "jobs", params={"namespace": run.team.name}, json=body(run))
        deadline = time.time() + 120 + sum(r.team.duration_s * r.team.share for r in runs) * 3
        pending = list(runs)
        while pending and time.time() < deadline:
            time.sleep(2.0)
            for run in list(pending):
                read_times(run)
                if run.ended is not None:
                    pending.remove(run)
        if pending:
            print(f"{len(pending)} runs did not end in time; measured without their ends", file=sys.stderr)
        figures = measure(runs, cpu)
    finally:
        for run in runs:
            try:
                nomad("delete", f"job/{run.job_id}", params={"namespace": run.team.name, "purge": "true"})
            except requests.RequestException:
                pass
        if made:
            policy_swap(json.loads(before) if before else None)
        for name in made:
            for _ in range(20):
                if requests.delete(f"{NOMAD}/v1/namespace/{name}", timeout=30).ok:
                    break
                time.sleep(1)
    print(f"runs: {len(runs)}; busy period {figures['busy_s']:.0f} s (the teams ask more than the cluster holds)")
    print(f"Jain's index over the busy period: {figures['jain']:.3f} (target >= 0.95)")
    print(f"utilisation while runs wait: {figures['utilisation'] * 100:.1f} % (target >= 90 %)")
    largest = [r.started - r.submitted for r in runs if r.team is TEAMS[-1] and r.started]
    from nomadtf.durations import parse_seconds

    bound = parse_seconds(POLICY["reserve_after"]) + max(t.duration_s for t in TEAMS)
    if largest:
        print(f"largest runs' wait: p50 {statistics.median(largest):.1f} s, max {max(largest):.1f} s "
              f"(reserve_after {POLICY['reserve_after']} + the longest run {max(t.duration_s for t in TEAMS):g} s = {bound:g} s "
              "bounds its wait behind the runs after it in the fair order, not behind those of teams that used less)")  # fmt: skip
    print("team           runs  size  mean wait  core-s held  held / fair share")
    for team in TEAMS:
        mine = [r for r in runs if r.team is team]
        waits = [r.started - r.submitted for r in mine if r.started]
        held = sum(r.cpu / 1000 * ((r.ended or r.started or 0) - (r.started or 0)) for r in mine if r.started)
        ratio = figures["ratios"].get(team.name, float("nan"))
        print(f"{team.name:<14} {len(mine):>4}  {team.share * 100:>3.0f}%  {statistics.mean(waits) if waits else float('nan'):>8.1f}s"
              f"  {held:>11.1f}  {ratio:>6.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
