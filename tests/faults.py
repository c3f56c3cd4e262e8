"""Fault injection on the stacks, for tests: on the single-node stack find a job's processes
and read its training step; on the several-client stack kill, pause, resume and restart a
client machine (`ClusterStack` keeps none of this: only tests break machines).

Usage:
    kill_client(cluster, 3)       # the machine dies: every process in ntf-c3 gets SIGKILL
    restart_client(cluster, 3)    # its agents again, same data dirs: the same node comes back
    pause_client(cluster, 2); resume_client(cluster, 2)   # a partition, as the servers see it
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import psutil

from nomadtf.devstack import layout, netns
from nomadtf.devstack import processes as devstack_processes
from nomadtf.devstack.cluster import ClusterStack
from nomadtf.devstack.processes import pid_alive  # noqa: F401 - the one liveness check, for tests
from nomadtf.errors import DevStackError
from tests.helpers import allocations, task_log


def processes(job_id: str) -> dict[tuple[str, str, int], int]:
    """(kind, role, index) -> pid, kind "task" (nomadtf task) or "child" (TF / user code)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(
                item.split("=", 1)
                for item in (entry / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in item
            )
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if env.get("NOMAD_JOB_ID") != job_id:
            continue
        role = env.get("NOMADTF_ROLE", "?")
        if "nomadtf task" in cmdline:
            found[("task", role, int(env.get("NOMAD_ALLOC_INDEX", -1)))] = int(entry.name)
        elif "NOMADTF_INDEX" in env and ("TF_CONFIG" in env or "KERAS_DISTRIBUTION_JOB_ADDRESSES" in env or "nomadtf.usercode.warmstart" in cmdline):
            # A child started ahead of the cluster got TF_CONFIG after it started: /proc shows
            # the environment it started with.
            found[("child", role, int(env["NOMADTF_INDEX"]))] = int(entry.name)
    return found


def restarts(job_id: str) -> dict[str, int]:
    out = {}
    for alloc in allocations(job_id):
        if alloc["ClientStatus"] == "running":
            out[alloc["Name"]] = sum(s.get("Restarts", 0) for s in (alloc.get("TaskStates") or {}).values())
    return out


def chief_stdout(job_id: str) -> str:
    return "\n".join(task_log(a["ID"], "chief") for a in allocations(job_id) if a["TaskGroup"] == "chief")


def step(job_id: str) -> int:
    steps = [int(s) for s in re.findall(r"step=(\d+)", chief_stdout(job_id))]
    return max(steps) if steps else 0


# ---- the several-client stack's machines ----------------------------------------------------


def kill_client(cluster: ClusterStack, index: int) -> list[int]:
    """The machine dies: SIGKILL, at once, to every process in client `index`'s namespace
    (its Nomad and Consul agents, executors, tasks). Returns their PIDs once all are gone."""
    ns = cluster.client_namespace(index)
    procs = []
    for pid in netns.namespace_pids(ns):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=devstack_processes.REAP_WAIT)
    if [p for p in alive if devstack_processes.running(p)]:
        raise DevStackError(f"processes in {ns} survived SIGKILL: {', '.join(str(p.pid) for p in alive)}")
    return [p.pid for p in procs]


def restart_client(cluster: ClusterStack, index: int, timeout: float = 60.0) -> None:
    """Start client `index`'s agents again (after `kill_client`, or stopping any that still
    run), with their data dirs: the same node comes back. Waits until the node is ready."""
    for name in layout.agent_names(index):
        running = cluster.component(name).process()
        if running is not None:
            devstack_processes.stop(devstack_processes.tree(running), 10.0)
    cluster.start_client(index, timeout)


def pause_client(cluster: ClusterStack, index: int) -> None:
    """SIGSTOP client `index`'s Nomad agent: it stops heartbeating, its tasks run on (a
    partition as the servers see it)."""
    _signal_nomad_client(cluster, index, signal.SIGSTOP)


def resume_client(cluster: ClusterStack, index: int) -> None:
    _signal_nomad_client(cluster, index, signal.SIGCONT)


def _signal_nomad_client(cluster: ClusterStack, index: int, sig: signal.Signals) -> None:
    cluster.client_namespace(index)
    proc = cluster.component(layout.agent_names(index)[1]).process()
    if proc is None:
        raise DevStackError(f"the Nomad agent of {layout.node_name(index)} is not running")
    proc.send_signal(sig)
