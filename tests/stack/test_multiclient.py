"""Several Nomad clients on one machine (`nomadtf dev up --clients 3`): each client is a
network namespace with its own address, Consul agent and Nomad agent; jobs spread over
them, and a client that dies is noticed and its work moves.

The `cluster` fixture reuses a running several-client stack or starts one (and stops it at
the end unless NOMADTF_KEEP_STACK=1); a cluster that cannot start fails. Nothing here
changes os.environ: every call names the cluster's addresses, so the single-node `stack`
of the other tests is never confused with it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import consul
import psutil
import pytest

from nomadtf import wire
from nomadtf.devstack import netns, processes
from nomadtf.devstack.cluster import ClusterStack
from nomadtf.job.validate import normalize
from nomadtf.servers.consul import ConsulDiscovery
from tests import chaos, cluster_access, faults, node_loss
from tests.docs_commands import shown_argv
from tests.helpers import nomadtf, probe_job, unique, wait_until, write_job
from tests.stack.test_recovery import ACCURACY_FLOOR
from tests.stack.test_task import FakeAlloc

CLIENTS = 3
META = "${meta.nomadtf_client}"
# The shared cluster's fake GPUs: GPUS on client GPU_CLIENT only, CPU-only clients beside it.
GPUS = 2
GPU_CLIENT = 3


def _progress(message: str) -> None:
    sys.stderr.write(f"[cluster] {message}\n")


@pytest.fixture(scope="session")
def cluster(secure_cluster):
    """The shared several-client test bed (conftest.py): ACLs and TLS on, as in production."""
    assert (secure_cluster.shape().clients, secure_cluster.shape().gpus) == (CLIENTS, GPUS)
    return secure_cluster


def api(path: str, **params):
    """GET <cluster Nomad>/v1/<path>, as its operator"""
    return cluster_access.nomad_get(ClusterStack.default(), path, **params)


def purge(job_id: str) -> None:
    cluster_access.nomad_purge(ClusterStack.default(), job_id)


def ready(spec: dict, tmp_path: Path) -> Path:
    """job.json for `spec` on the cluster (its CA, Vault address, `nomadtf acl apply`'s lines)."""
    return write_job(tmp_path, cluster_access.secured(spec, ClusterStack.default(), tmp_path))


def on_client(index: int, operator: str = "=") -> dict:
    return {"attribute": META, "operator": operator, "value": str(index)}


def tf_configs(job_id: str, env: dict) -> list[dict]:
    """Every TF_CONFIG the chief printed in this run, oldest first (`nomadtf logs`)."""
    out = nomadtf("logs", job_id, "--role", "chief", env=env, timeout=60).stdout
    return [json.loads(line.split("=", 1)[1]) for line in out.splitlines() if line.startswith("TF_CONFIG=")]


def hosts(tf_config: dict) -> set[str]:
    return {addr.rsplit(":", 1)[0] for addrs in tf_config["cluster"].values() for addr in addrs}


# ---- the cluster itself -----------------------------------------------------------------


@pytest.mark.stack
def test_three_ready_clients_each_with_its_own_address_class_meta_and_consul_agent(cluster):
    nodes = {n["Name"]: n for n in api("nodes") if n["Status"] == "ready"}
    assert sorted(nodes) == [f"client-{i}" for i in range(1, CLIENTS + 1)]
    for i in range(1, CLIENTS + 1):
        node = api(f"node/{nodes[f'client-{i}']['ID']}")
        assert node["Attributes"]["unique.network.ip-address"] == netns.client_ip(i)
        assert node["NodeClass"] == f"nomadtf-client-{i}"
        assert node["Meta"]["nomadtf_client"] == str(i)
        assert node["Drivers"]["raw_exec"]["Healthy"]
        # Nomad fingerprints the Consul agent it talks to: the one of its own namespace.
        assert node["Attributes"]["unique.consul.name"] == f"client-{i}"
        assert cluster_access.consul_in(cluster, i, "/v1/agent/self")["Config"]["NodeName"] == f"client-{i}"
    catalog = {n["Node"]: n["Address"] for n in cluster_access.consul_get(cluster, "catalog/nodes").json()}
    assert catalog == {"server": netns.SERVER_IP, **{f"client-{i}": netns.client_ip(i) for i in range(1, CLIENTS + 1)}}
    # The server machine listens on its own address only: the single-node stack can run beside it.
    for name in ("consul", "openbao", "nomad"):
        proc = psutil.Process(cluster.component(name).pid)
        listening = {c.laddr.ip for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        assert listening == {netns.SERVER_IP}, (name, listening)
    assert [r.node for r in cluster.status().rows if r.node] == ["ready"] * CLIENTS


@pytest.mark.stack
def test_dev_cli_sees_the_cluster(cluster):
    up = nomadtf(*shown_argv(r"nomadtf dev up --clients 3 --secure"), timeout=60)
    assert up.returncode == 0 and "already up" in up.stderr, up.stderr
    status = nomadtf("dev", "status", "--cluster", timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(rf"nomad-client-3\s+running .*{re.escape(netns.client_ip(3))}.* node ready", status.stdout), status.stdout
    assert cluster.root_token() not in status.stdout + status.stderr
    env = nomadtf(*shown_argv(r"nomadtf dev env --cluster"), timeout=60).stdout
    assert f"export NOMAD_ADDR=https://{netns.SERVER_IP}:4646" in env
    assert f"export CONSUL_HTTP_ADDR=https://{netns.SERVER_IP}:8501" in env
    assert f"export NOMAD_CACERT={cluster.secure_state.ca_file}" in env and "export CONSUL_HTTP_TOKEN=" in env
    assert re.search(r"export PATH=\S*nomadtf/bin", env), env


# ---- jobs over several clients --------------------------------------------------------------


@pytest.mark.stack
def test_a_job_spreads_over_the_clients_and_its_tf_config_names_their_addresses(cluster, tmp_path):
    env = cluster.env()
    spec = probe_job(unique("mc-spread"))
    for index, role in enumerate(("chief", "worker", "ps"), start=1):
        spec["roles"][role].update(cpu=200, memory=300, constraints=[on_client(index)])
    try:
        run = nomadtf("run", str(ready(spec, tmp_path)), "--timeout", "2m", env=env, timeout=180)
        assert run.returncode == 0, run.stdout + run.stderr
        (tf_config,) = tf_configs(spec["name"], env)
        assert tf_config["cluster"]["chief"][0].startswith(f"{netns.client_ip(1)}:")
        assert tf_config["cluster"]["worker"][0].startswith(f"{netns.client_ip(2)}:")
        assert tf_config["cluster"]["ps"][0].startswith(f"{netns.client_ip(3)}:")
        assert len(hosts(tf_config)) == 3
    finally:
        purge(spec["name"])


@pytest.mark.stack
def test_a_lost_client_is_noticed_and_its_worker_moves(cluster, tmp_path):
    """The machine of the worker dies: Nomad marks it down within seconds and places the
    worker on another client; the chief restarts with the new address; the job succeeds."""
    env = cluster.env()
    release = tmp_path / "release"
    spec = probe_job(unique("mc-loss"), context={"until_file": str(release)})
    # Nomad replaces an allocation lost with its node whatever the reschedule policy says,
    # but `nomadtf run` counts a lost allocation against reschedule_attempts.
    spec["recovery"]["reschedule_attempts"] = 1
    spec["roles"]["chief"].update(cpu=200, memory=300, constraints=[on_client(1)])
    spec["roles"]["ps"].update(cpu=200, memory=300, constraints=[on_client(1)])
    spec["roles"]["worker"].update(
        cpu=200,
        memory=300,
        constraints=[on_client(1, "!=")],
        affinities=[{"attribute": META, "value": "3", "weight": 100}],
    )
    job_id = spec["name"]
    victim = None
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(nomadtf, "run", str(ready(spec, tmp_path)), "--timeout", "4m", env=env, timeout=300)
        try:
            first = wait_until(lambda: tf_configs(job_id, env), 90, "the chief's first TF_CONFIG", interval=1.0)[0]
            worker_address = first["cluster"]["worker"][0]
            victim = int(worker_address.split(":")[0].rsplit(".", 1)[1]) - 10
            assert victim in (2, 3)  # never with the chief (client 1); the affinity asks for 3

            killed = time.monotonic()
            faults.kill_client(cluster, victim)
            wait_until(lambda: _node_status(f"client-{victim}") == "down", 30, f"client-{victim} to be down")
            down_after = time.monotonic() - killed
            configs = wait_until(
                lambda: (c := tf_configs(job_id, env)) and len(c) >= 2 and c, 90, "the chief's second TF_CONFIG", interval=0.5
            )
            moved_after = time.monotonic() - killed
            new_address = configs[-1]["cluster"]["worker"][0]
            assert new_address.split(":")[0] == netns.client_ip(5 - victim), configs
            assert configs[-1]["cluster"]["chief"] == first["cluster"]["chief"]

            release.write_text("go")
            result = running.result(timeout=180)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "succeeded" in result.stderr
            sys.stderr.write(
                f"[cluster] client-{victim} killed: node down after {down_after:.1f}s, "
                f"chief restarted with {new_address} after {moved_after:.1f}s\n"
            )
            assert down_after < 20
        finally:
            release.write_text("go")
            if victim is not None:
                faults.restart_client(cluster, victim)
            purge(job_id)
    assert [r.node for r in cluster.status().rows if r.node] == ["ready"] * CLIENTS


@pytest.mark.stack
def test_a_paused_client_goes_down_and_comes_back(cluster):
    try:
        faults.pause_client(cluster, 2)
        wait_until(lambda: _node_status("client-2") == "down", 30, "client-2 to be down")
    finally:
        faults.resume_client(cluster, 2)
    wait_until(lambda: _node_status("client-2") == "ready", 30, "client-2 to be ready again")


def _node_status(name: str) -> str:
    return {n["Name"]: n["Status"] for n in api("nodes")}.get(name, "absent")


def _node_id(name: str) -> str:
    (node,) = [n for n in api("nodes") if n["Name"] == name and n["Status"] == "ready"]
    return node["ID"]


def _allocs(job_id: str) -> list[dict]:
    return api(f"job/{job_id}/allocations")


def _run_id(job_id: str) -> str:
    return (api(f"job/{job_id}")["Meta"] or {})[wire.META_RUN]


# ---- placement: distinct_hosts ----------------------------------------------------------------


def _distinct_workers(name: str, workers: int) -> dict:
    """A chief and `workers` workers that all run the probe (no TensorFlow to import), the
    workers on distinct hosts."""
    spec = probe_job(name, strategy="multi_worker_mirrored")
    spec["roles"] = {
        "chief": {"count": 1, "cpu": 100, "memory": 200},
        "worker": {"count": workers, "cpu": 100, "memory": 200, "distinct_hosts": True},
    }
    return spec


@pytest.mark.stack
def test_distinct_hosts_puts_every_worker_on_its_own_client(cluster, tmp_path):
    env = cluster.env()
    spec = _distinct_workers(unique("mc-distinct"), CLIENTS)
    try:
        run = nomadtf("run", str(ready(spec, tmp_path)), "--timeout", "2m", env=env, timeout=180)
        assert run.returncode == 0, run.stdout + run.stderr
        (tf_config,) = tf_configs(spec["name"], env)
        workers = {addr.rsplit(":", 1)[0] for addr in tf_config["cluster"]["worker"]}
        assert workers == {netns.client_ip(i) for i in range(1, CLIENTS + 1)}, tf_config
    finally:
        purge(spec["name"])


@pytest.mark.stack
def test_more_distinct_hosts_than_clients_is_explained_by_plan(cluster, tmp_path):
    spec = _distinct_workers(unique("mc-distinct"), CLIENTS + 1)
    out = nomadtf("plan", str(write_job(tmp_path, spec)), env=cluster.env(), timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    expected = f"worker: cannot be placed: distinct_hosts asks for {CLIENTS + 1} different nodes, only {CLIENTS} are eligible"
    assert expected in out.stdout.splitlines(), out.stdout


# ---- GPUs on one client, CPU roles elsewhere ---------------------------------------------------


def _gpu_workers(name: str, workers: int) -> dict:
    """A chief kept off the GPU clients (`${meta.nomadtf_gpu} = false`), `workers` workers
    with one GPU each."""
    spec = probe_job(name, strategy="multi_worker_mirrored")
    no_gpu = {"attribute": "${meta.nomadtf_gpu}", "operator": "=", "value": "false"}
    spec["roles"] = {
        "chief": {"count": 1, "cpu": 100, "memory": 200, "constraints": [no_gpu]},
        "worker": {"count": workers, "cpu": 100, "memory": 200, "gpus": 1},
    }
    return spec


def _probe_env(alloc: dict) -> dict[str, str]:
    """The `env NAME=value` lines the probe printed. GET /v1/client/fs/logs/:alloc_id"""
    stack = ClusterStack.default()
    resp = stack.api().session().get(
        f"{stack.api().nomad_url}/v1/client/fs/logs/{alloc['ID']}",
        params={"task": alloc["TaskGroup"], "type": "stdout", "plain": "true"},
        timeout=10,
    )
    resp.raise_for_status()
    return dict(re.findall(r"^env (\w+)=(.*)$", resp.text, re.M))


@pytest.mark.stack
def test_gpu_workers_land_on_the_gpu_client_and_the_chief_elsewhere_sees_none(cluster, tmp_path):
    nodes = {n["Name"]: api(f"node/{n['ID']}") for n in api("nodes") if n["Status"] == "ready"}
    assert {name: node["Meta"]["nomadtf_gpu"] for name, node in nodes.items()} == {
        f"client-{i}": "true" if i == GPU_CLIENT else "false" for i in range(1, CLIENTS + 1)
    }
    env = cluster.env()
    spec = _gpu_workers(unique("mc-gpu"), 2)
    try:
        run = nomadtf("run", str(ready(spec, tmp_path)), "--timeout", "2m", env=env, timeout=180)
        assert run.returncode == 0, run.stdout + run.stderr
        (tf_config,) = tf_configs(spec["name"], env)
        workers = {addr.rsplit(":", 1)[0] for addr in tf_config["cluster"]["worker"]}
        assert workers == {netns.client_ip(GPU_CLIENT)}, tf_config
        assert not tf_config["cluster"]["chief"][0].startswith(f"{netns.client_ip(GPU_CLIENT)}:"), tf_config
        seen = []
        for alloc in _allocs(spec["name"]):
            visible = _probe_env(alloc)
            if alloc["TaskGroup"] == "chief":
                assert visible["CUDA_VISIBLE_DEVICES"] == "", visible
                continue
            (gpu,) = visible["NVIDIA_VISIBLE_DEVICES"].split(",")
            assert visible["CUDA_VISIBLE_DEVICES"] == gpu, visible
            full = api(f"allocation/{alloc['ID']}")
            (devices,) = full["AllocatedResources"]["Tasks"][alloc["TaskGroup"]]["Devices"]
            assert devices["DeviceIDs"] == [gpu]  # exactly what Nomad reserved
            seen.append(gpu)
        assert len(seen) == len(set(seen)) == 2, seen
    finally:
        purge(spec["name"])


@pytest.mark.stack
def test_dev_cli_up_with_gpu_clients_finds_the_cluster_and_status_shows_its_gpus(cluster):
    up = nomadtf(*shown_argv(r"nomadtf dev up --clients 3 --gpus 2 --gpu-clients 3 --secure"), timeout=60)
    assert up.returncode == 0 and "already up" in up.stderr, up.stderr
    status = nomadtf(*shown_argv(r"nomadtf dev status --cluster"), timeout=60)
    assert f"several-client stack: {CLIENTS} clients with {GPUS} fake GPUs on client {GPU_CLIENT}" in status.stdout, status.stdout
    other = nomadtf("dev", "up", "--clients", str(CLIENTS), "--gpus", "0", "--secure", timeout=60)
    assert other.returncode == 1, other.stderr
    # Without --docker the running stack's daemons are kept in the shape asked for.
    docker = " --docker" if cluster.shape().docker else ""
    assert f"`nomadtf dev up --clients {CLIENTS} --secure{docker}`" in other.stderr and "on client 3" in other.stderr, other.stderr
    rows = {r.component: r.gpus for r in cluster.status().rows if r.component.startswith("nomad-client-")}
    assert rows == {f"nomad-client-{i}": GPUS if i == GPU_CLIENT else 0 for i in range(1, CLIENTS + 1)}


@pytest.mark.stack
def test_more_gpu_workers_than_the_gpu_client_has_is_explained_by_plan(cluster, tmp_path):
    spec = _gpu_workers(unique("mc-gpu"), GPUS + 1)
    out = nomadtf("plan", str(write_job(tmp_path, spec)), env=cluster.env(), timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "worker: cannot be placed" in out.stdout, out.stdout
    assert "not enough free nvidia/gpu" in out.stdout or "no node offers" in out.stdout, out.stdout


# ---- drain: the chief moves, after SIGTERM ------------------------------------------------------


def _drain(node_id: str, deadline_s: float | None) -> None:
    """`nomad node drain -enable -yes -deadline 30s <node>` (deadline_s None: -disable, and
    the node is eligible again). PUT /v1/node/:node_id/drain"""
    spec = {"Deadline": int(deadline_s * 1e9), "IgnoreSystemJobs": False} if deadline_s is not None else None
    body = {"DrainSpec": spec, "MarkEligible": deadline_s is None}
    stack = ClusterStack.default()
    stack.api().session().put(f"{stack.api().nomad_url}/v1/node/{node_id}/drain", json=body, timeout=10).raise_for_status()


@pytest.mark.stack
def test_a_drained_client_moves_the_chief_after_sigterm(cluster, tmp_path):
    """client-1 is drained with a 30 s deadline: Nomad leaves a batch allocation running
    until the deadline, then stops it (SIGTERM to `nomadtf task`, which passes it to the
    code) and places the chief on another client; the chief starts again with the new
    address in its TF_CONFIG, the workers (elsewhere) keep theirs, and the job succeeds."""
    env = cluster.env()
    release = tmp_path / "release"
    # Every task runs the probe (multi_worker_mirrored with a chief): no TensorFlow to import.
    spec = probe_job(unique("mc-drain"), "multi_worker_mirrored", context={"until_file": str(release), "report_sigterm": True})
    spec["roles"] = {
        "chief": {"count": 1, "cpu": 100, "memory": 200, "affinities": [{"attribute": META, "value": "1", "weight": 100}]},
        "worker": {"count": 2, "cpu": 100, "memory": 200, "constraints": [on_client(1, "!=")]},
    }
    job_id = spec["name"]
    node = _node_id("client-1")
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(nomadtf, "run", str(ready(spec, tmp_path)), "--timeout", "4m", env=env, timeout=300)
        try:
            first = wait_until(lambda: tf_configs(job_id, env), 90, "the chief's first TF_CONFIG", interval=1.0)[0]
            assert first["cluster"]["chief"][0].startswith(f"{netns.client_ip(1)}:"), first
            kill_timeout = next(g for g in api(f"job/{job_id}")["TaskGroups"] if g["Name"] == "chief")["Tasks"][0]["KillTimeout"]

            drained_at = time.time()
            _drain(node, 30)
            configs = wait_until(
                lambda: (c := tf_configs(job_id, env)) and len(c) >= 2 and c, 120, "the chief's TF_CONFIG after the drain", interval=0.5
            )
            moved_after = time.time() - drained_at
            assert not configs[-1]["cluster"]["chief"][0].startswith(f"{netns.client_ip(1)}:"), configs
            assert configs[-1]["cluster"]["worker"] == first["cluster"]["worker"]
            logs = nomadtf("logs", job_id, "--role", "chief", env=env, timeout=60).stdout
            sigterm_at = float(re.search(r"probe got SIGTERM at ([\d.]+)", logs)[1])

            release.write_text("go")
            result = running.result(timeout=180)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "succeeded" in result.stderr
            sys.stderr.write(
                f"[cluster] client-1 drained (deadline 30s, chief KillTimeout {kill_timeout / 1e9:.0f}s): chief got SIGTERM "
                f"after {sigterm_at - drained_at:.1f}s, ran again elsewhere with its new TF_CONFIG after {moved_after:.1f}s\n"
            )
            assert 25 <= sigterm_at - drained_at <= 45  # the batch allocation runs until the deadline
        finally:
            release.write_text("go")
            _drain(node, None)
            wait_until(
                lambda: api(f"node/{node}")["SchedulingEligibility"] == "eligible", 30, "client-1 to be eligible again"
            )
            purge(job_id)


# ---- node loss under real TensorFlow training --------------------------------------------------

# Small enough for CI on 2 cores: a few seconds of training, one kill well inside it.
TF_STEPS = 600
TF_CHECKPOINT_EVERY = 50
TF_LOG_EVERY = 10  # finer than a checkpoint, so the steps lost are measured, not always 0
TF_KILL_AT_STEP = 150


# Each role's client lost under raw_exec, and the ps's with every task in a container of the
# clients' own Docker daemons (TLS to Consul and Vault from inside them: the CA is mounted).
NODE_LOSS_CASES = [
    *(pytest.param(role, None, id=role) for role in node_loss.ROLES),
    pytest.param("ps", "docker", id="ps-in-containers", marks=pytest.mark.docker),
]


@pytest.mark.stack
@pytest.mark.tf
@pytest.mark.parametrize("role, driver", NODE_LOSS_CASES)
def test_node_loss_under_tf_training_resumes_within_one_checkpoint(cluster, tmp_path, request, role, driver):
    """The digits example trains (chief, worker, ps); the client holding `role` dies at
    once mid-training (`kill_client`: its agents and tasks SIGKILLed, its Docker daemon and
    containers too). Nomad marks it down and places the role on the other client left to
    it; the chief restarts with the new TF_CONFIG and resumes from its last checkpoint; the
    job succeeds with accuracy above the example's floor, having lost at most one checkpoint
    interval. The client comes back afterwards (its daemon first), for the tests that follow."""
    env = cluster.env()
    spec = node_loss.spec(unique(f"mc-tf-{role}" + ("-docker" if driver else "")), role, TF_STEPS, TF_CHECKPOINT_EVERY, TF_LOG_EVERY)
    if driver == "docker":
        spec["driver"] = {"name": "docker", "image": request.getfixturevalue("cluster_image")}
        spec["entrypoint"]["workdir"] = "/opt/nomadtf/examples/digits"  # the code from the image
        spec["roles"]["chief"]["memory"] = 1536  # a real limit in a container (examples/docker/job.json)
    job_id = spec["name"]
    dead = None
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(nomadtf, "run", str(ready(spec, tmp_path)), "--timeout", "5m", env=env, timeout=360)
        try:
            wait_until(
                lambda: running.done() or chaos.current_step(node_loss.chief_stdout(cluster, job_id)) >= TF_KILL_AT_STEP,
                240, f"training step {TF_KILL_AT_STEP}", interval=0.2,
            )
            assert not running.done(), running.result().stderr
            victim = node_loss.running_client(job_id, role)
            assert victim in (2, 3), victim  # never client 1, which holds the other roles
            if driver == "docker":  # the role runs in a container of its own client's daemon
                on_victim = [c.labels.get("com.hashicorp.nomad.task_name") for c in cluster.daemon(victim).client().containers.list()]
                assert on_victim == [role], on_victim
            before = chaos.current_step(node_loss.chief_stdout(cluster, job_id))
            killed = time.monotonic()
            dead = victim
            faults.kill_client(cluster, victim)
            wait_until(lambda: _node_status(f"client-{victim}") == "down", 30, f"client-{victim} to be down")
            down_after = time.monotonic() - killed

            result = running.result(timeout=300)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "succeeded" in result.stderr
            stdout = node_loss.chief_stdout(cluster, job_id)
            history = chaos.events(stdout)
            resumed = chaos.resumes_with_loss(history)
            sys.stderr.write(
                f"[cluster] client-{victim} with the {role} killed after step {before}: node down after "
                f"{down_after:.1f}s, job done after {time.monotonic() - killed:.1f}s; (resumed from, steps lost) {resumed}\n"
            )
            moved = [node_loss.client_of(a) for a in node_loss.allocations(job_id) if a["TaskGroup"] == role]
            assert moved == [victim, 5 - victim], moved  # lost with its client, then on the other one
            accuracy = node_loss.accuracy(stdout)
            assert accuracy is not None and accuracy >= ACCURACY_FLOOR, stdout[-2000:]
            assert history and history[0][0] == "step", history[:3]  # the first chief trained from step 0
            assert resumed, f"the chief never resumed from a checkpoint:\n{stdout[-2000:]}"
            assert max(lost for _step, lost in resumed) <= TF_CHECKPOINT_EVERY, resumed
            assert chaos.step_regressions(history) == [], "step lines went back without a restart"
        finally:
            if dead is not None:
                faults.restart_client(cluster, dead)
            purge(job_id)
    assert [r.node for r in cluster.status().rows if r.node] == ["ready"] * CLIENTS


# ---- containers: a Docker daemon per client (`dev up --clients N --docker`) ----------------------


@pytest.fixture(scope="session")
def cluster_image(cluster) -> str:
    """The task image in every client's daemon (the clients share no registry): copied from
    the single-node session's build when there is one, else built here (tests/images.py)."""
    from tests import images

    return images.for_clients([daemon.client(timeout=900) for daemon in cluster.docker_daemons()], lambda message: _progress(f"[image] {message}"))


# ---- partition: a ps whose client goes silent ---------------------------------------------------


def _ps_servers() -> list[str]:
    """The allocation of every bare TensorFlow server of role ps running in a client
    namespace (psutil: NOMADTF_ROLE=ps in the environment, nomadtf.usercode.tfserver in argv)."""
    spaces = {os.stat(f"/run/netns/{netns.namespace(i)}").st_ino for i in range(1, CLIENTS + 1)}
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "nomadtf.usercode.tfserver" not in (proc.info["cmdline"] or []):
                continue
            if os.stat(f"/proc/{proc.pid}/ns/net").st_ino not in spaces:
                continue  # the single-node stack's tasks, beside us
            environ = proc.environ()
            if environ.get("NOMADTF_ROLE") == "ps" and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(environ.get("NOMAD_ALLOC_ID", "?"))
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError, ProcessLookupError):
            continue
    return found


def _slot_holder(key: str) -> str | None:
    """The allocation holding a Consul KV slot. GET /v1/kv/<key>"""
    resp = cluster_access.consul_get(ClusterStack.default(), f"kv/{key}")
    if resp.status_code == 404:
        return None
    item = resp.json()[0]
    return json.loads(base64.b64decode(item["Value"]))["alloc"] if item.get("Session") else None


@pytest.mark.stack
def test_a_partitioned_ps_is_replaced_and_two_never_serve_at_once(cluster, tmp_path):
    """client-3, which runs the ps, stops talking to the Nomad server (its agent paused):
    Nomad marks it down and places a replacement ps on another client, which waits for the
    index (the old task's Consul session lives on: client-3's Consul agent still runs).
    When the agent comes back, Nomad stops the old allocation, the new ps takes the index,
    and the chief restarts with its address. Sampled all along, from the processes and
    from the slot in Consul: never two ps[0] servers."""
    env = cluster.env()
    release = tmp_path / "release"
    spec = probe_job(unique("mc-part"), context={"until_file": str(release)})
    spec["roles"]["ps"].update(cpu=200, memory=300, affinities=[{"attribute": META, "value": "3", "weight": 100}])
    for role in ("chief", "worker"):
        spec["roles"][role].update(cpu=200, memory=300, constraints=[on_client(3, "!=")])
    job_id = spec["name"]
    samples: list[tuple[float, str | None, list[str], str | None]] = []
    sampling = threading.Event()

    def sample(key: str) -> None:
        while not sampling.is_set():
            before = _slot_holder(key)
            servers = _ps_servers()
            samples.append((time.time(), before, servers, _slot_holder(key)))
            time.sleep(0.2)

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(nomadtf, "run", str(ready(spec, tmp_path)), "--timeout", "5m", env=env, timeout=360)
        paused = False
        try:
            first = wait_until(lambda: tf_configs(job_id, env), 120, "the chief's first TF_CONFIG", interval=1.0)[0]
            assert first["cluster"]["ps"][0].startswith(f"{netns.client_ip(3)}:"), first
            key = wire.kv_slot("default", job_id, "ps", 0, _run_id(job_id))
            old = wait_until(lambda: _slot_holder(key), 30, "the ps slot")
            wait_until(lambda: _ps_servers() == [old], 60, "the ps server process")
            sampler = pool.submit(sample, key)

            faults.pause_client(cluster, 3)
            paused, paused_at = True, time.time()
            wait_until(lambda: _node_status("client-3") == "down", 30, "client-3 to be down")
            down_after = time.time() - paused_at
            new = wait_until(
                lambda: [a["ID"] for a in _allocs(job_id) if a["TaskGroup"] == "ps" and a["ID"] != old
                         and a["ClientStatus"] == "running"],
                60, "a replacement ps running elsewhere",
            )[0]
            replaced_after = time.time() - paused_at
            time.sleep(5)  # the replacement waits for the index: the old ps still holds it
            assert _slot_holder(key) == old and _ps_servers() == [old]

            faults.resume_client(cluster, 3)
            paused, resumed_at = False, time.time()
            wait_until(lambda: old not in _ps_servers(), 60, "the old ps server to stop")
            old_gone_after = time.time() - resumed_at
            wait_until(lambda: _ps_servers() == [new] and _slot_holder(key) == new, 90, "the new ps to serve")
            serving_after = time.time() - resumed_at
            configs = wait_until(
                lambda: (c := tf_configs(job_id, env)) and len(c) >= 2 and c, 90, "the chief's TF_CONFIG with the new ps", interval=0.5
            )
            chief_after = time.time() - resumed_at
            assert not configs[-1]["cluster"]["ps"][0].startswith(f"{netns.client_ip(3)}:"), configs
            time.sleep(2)
            sampling.set()
            sampler.result(timeout=30)

            release.write_text("go")
            result = running.result(timeout=240)
            assert result.returncode == 0, result.stdout + result.stderr
            sys.stderr.write(
                f"[cluster] client-3 paused: down after {down_after:.1f}s, replacement ps running after "
                f"{replaced_after:.1f}s (waiting for the index); resumed: old ps stopped after {old_gone_after:.1f}s, "
                f"new ps serving after {serving_after:.1f}s, chief with its address after {chief_after:.1f}s; "
                f"{len(samples)} samples\n"
            )
        finally:
            sampling.set()
            release.write_text("go")
            if paused:
                faults.resume_client(cluster, 3)
            purge(job_id)
    two = [s for s in samples if len(s[2]) > 1]
    assert not two, f"two ps[0] servers at once: {two[:5]}"
    strays = [s for s in samples if s[2] and s[2][0] not in (s[1], s[3])]
    assert not strays, f"a ps server whose allocation did not hold the slot: {strays[:5]}"
    assert {s[2][0] for s in samples if s[2]} == {old, new}
    wait_until(lambda: _node_status("client-3") == "ready", 30, "client-3 to be ready again")


# ---- the runtime: a task whose index was taken while it was cut off ----------------------------


class ClusterAlloc(FakeAlloc):
    """tests/stack/test_task.py's allocation (Nomad's part played by the test), with the
    task and its registration on the several-client stack's Consul server."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.consul = cluster_consul()

    def env(self) -> dict[str, str]:
        # The operator's Consul token and CA: this tests the runtime, test_secure.py the policies.
        found = {k: v for k, v in ClusterStack.default().env().items() if k.startswith("CONSUL_")}
        return {**super().env(), **found}


def cluster_consul() -> consul.Consul:
    return cluster_access.consul_client(ClusterStack.default())


@pytest.mark.stack
def test_a_task_whose_index_was_taken_stops_its_child(cluster, tmp_path):
    """A real `nomadtf task` runs its child; then it is frozen (SIGSTOP: cut off, as the
    task sees it), its session lapses and another allocation claims its index, as a
    replacement Nomad placed meanwhile would. Running again, it must stop its child and
    end, never serve beside the new holder."""
    spec = probe_job(unique("mc-taken"), strategy="multi_worker_mirrored", context={"sleep": -1})
    spec["roles"]["worker"]["count"] = 1
    spec = normalize(spec)
    task = ClusterAlloc(tmp_path, spec, "worker").register().start()
    other = ConsulDiscovery(spec["name"], client=cluster_consul())
    try:
        wait_until(lambda: "generation 1: starting" in task.output(), 60, "the task's child")
        children = wait_until(lambda: psutil.Process(task.proc.pid).children(recursive=True), 10, "the child process")
        lapsed = other.slots()[("worker", 0)].session
        task.proc.send_signal(signal.SIGSTOP)
        try:
            other.consul.session.destroy(lapsed)  # Consul's doing when the TTL runs out; the key goes with it
            other.open_session("nomadtf replacement")
            assert other.claim_slot("worker", 1, "replacement-alloc", 0, "new") == 0
        finally:
            task.proc.send_signal(signal.SIGCONT)
        assert task.wait(timeout=30) == 0, task.output()
        assert "worker[0] is held by allocation replacem" in task.output()
        assert not [p for p in children if processes.running(p)], "the child outlived its task"
        assert other.slots()[("worker", 0)].alloc_id == "replacement-alloc"  # the new holder keeps it
    finally:
        task.stop()
        other.close()
        other.delete_job_keys()
