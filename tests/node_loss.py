"""Node loss under real TensorFlow training, on the several-client stack: the digits example
(parameter-server strategy, one chief, one worker, one parameter server) with the role under
test kept off client 1 and every other role pinned to it, so the test knows which client to
kill and the lost allocation has a client left to move to. Shared by
tests/stack/test_multiclient.py and bench/bench_node_loss.py.

The chief's stdout is read from the clients' data directories (every client namespace shares
this machine's filesystem): the log of a chief lost with its client stays on the dead
client's disk, where Nomad's API cannot serve it while that client is down.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from nomadtf.devstack.cluster import ClusterStack
from tests import cluster_access
from tests.helpers import EXAMPLES

ROLES = ("worker", "ps", "chief")
HOME_CLIENT = 1  # every role but the one under test; never killed
PREFERRED_VICTIM = 2
META = "${meta.nomadtf_client}"


def spec(name: str, role: str, steps: int, checkpoint_every: int, log_every: int | None = None) -> dict:
    """The digits job, `role` on client 2 or 3 and the other two roles on client 1."""
    data = json.loads((EXAMPLES / "digits" / "job.json").read_text())
    data["name"] = name
    data["entrypoint"]["workdir"] = str(EXAMPLES / "digits")
    data["context"].update(steps=steps, log_every=log_every or checkpoint_every, checkpoint_every=checkpoint_every)
    # A lost allocation counts against reschedule_attempts in `nomadtf run`'s follower.
    data["recovery"] = {"restart_attempts": 3, "restart_delay": "1s", "reschedule_attempts": 2, "reschedule_delay": "5s"}
    data["discovery"] = {"rendezvous_timeout": "3m"}
    for each, options in data["roles"].items():
        options.update(count=1, cpu=200, memory=1024)  # a reservation only (raw_exec)
        if each == role:
            options["constraints"] = [_on_client(HOME_CLIENT, "!=")]
            options["affinities"] = [{"attribute": META, "value": str(PREFERRED_VICTIM), "weight": 100}]
        else:
            options["constraints"] = [_on_client(HOME_CLIENT)]
    return data


def _on_client(index: int, operator: str = "=") -> dict:
    return {"attribute": META, "operator": operator, "value": str(index)}


def _api(path: str) -> list | dict:
    """GET <cluster Nomad>/v1/<path>, as its operator"""
    return cluster_access.nomad_get(ClusterStack.default(), path)


def allocations(job_id: str) -> list[dict]:
    """The job's allocations, oldest first. GET /v1/job/:job_id/allocations"""
    return sorted(_api(f"job/{job_id}/allocations"), key=lambda a: a["CreateIndex"])


def client_of(alloc: dict) -> int:
    return int(alloc["NodeName"].rsplit("-", 1)[1])


def running_client(job_id: str, role: str) -> int | None:
    """The client whose allocation of `role` runs, or None."""
    running = [a for a in allocations(job_id) if a["TaskGroup"] == role and a["ClientStatus"] == "running"]
    return client_of(running[-1]) if running else None


def task_stdout(stack: ClusterStack, alloc: dict) -> str:
    """An allocation's task stdout, from its client's data directory (rotated files in order)."""
    logs = stack.state_dir / f"client-{client_of(alloc)}" / "nomad-data" / "alloc" / alloc["ID"] / "alloc" / "logs"
    task = alloc["TaskGroup"]
    parts = sorted(logs.glob(f"{task}.stdout.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    return "".join(_read(p) for p in parts)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def chief_stdout(stack: ClusterStack, job_id: str) -> str:
    """Every chief allocation's stdout, oldest first."""
    return "".join(task_stdout(stack, a) for a in allocations(job_id) if a["TaskGroup"] == "chief")


def accuracy(stdout: str) -> float | None:
    found = re.findall(r"^final_accuracy=([0-9.]+)", stdout, re.M)
    return float(found[-1]) if found else None
