"""Several Nomad clients on one machine (`nomadtf dev up --clients 3`): each client is a
network namespace with its own address, Consul agent and Nomad agent; jobs spread over
them, and a client that dies is noticed and its work moves.

The `cluster` fixture reuses a running several-client stack or starts one (and stops it at
the end unless NOMADTF_KEEP_STACK=1); a cluster that cannot start fails. Nothing here
changes os.environ: every call names the cluster's addresses, so the single-node `stack`
of the other tests is never confused with it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from nomadtf.devstack import cluster as cluster_mod
from nomadtf.devstack import wiring
from nomadtf.devstack.cluster import ClusterStack
from tests.helpers import nomadtf, probe_job, unique, wait_until, write_job

CLIENTS = 3
META = "${meta.nomadtf_client}"


def _progress(message: str) -> None:
    sys.stderr.write(f"[cluster] {message}\n")


@pytest.fixture(scope="session")
def cluster():
    stack = ClusterStack.default()
    started = stack.up(progress=_progress, clients=CLIENTS, timeout=180)
    yield stack
    if started and not os.environ.get("NOMADTF_KEEP_STACK"):
        stack.down(progress=_progress)


def api(path: str, **params):
    """GET {cluster NOMAD_ADDR}/v1/<path>"""
    resp = requests.get(f"{cluster_mod.NOMAD_ADDR}/v1/{path}", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()


def purge(job_id: str) -> None:
    requests.delete(f"{cluster_mod.NOMAD_ADDR}/v1/job/{job_id}", params={"purge": "true"}, timeout=10)


def on_client(index: int, operator: str = "=") -> dict:
    return {"attribute": META, "operator": operator, "value": str(index)}


def tf_configs(job_id: str, env: dict) -> list[dict]:
    """Every TF_CONFIG the chief printed in this run, oldest first (`nomadtf logs`)."""
    out = nomadtf("logs", job_id, "--role", "chief", env=env, timeout=60).stdout
    return [json.loads(line.split("=", 1)[1]) for line in out.splitlines() if line.startswith("TF_CONFIG=")]


def hosts(tf_config: dict) -> set[str]:
    return {addr.rsplit(":", 1)[0] for addrs in tf_config["cluster"].values() for addr in addrs}


def consul_in(namespace: str, path: str) -> dict:
    """GET http://127.0.0.1:8500<path> from inside a client's namespace: its own agent."""
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:8500{path}', timeout=5).read().decode())"
    out = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# ---- the cluster itself -----------------------------------------------------------------


@pytest.mark.stack
def test_three_ready_clients_each_with_its_own_address_class_meta_and_consul_agent(cluster):
    nodes = {n["Name"]: n for n in api("nodes") if n["Status"] == "ready"}
    assert sorted(nodes) == [f"client-{i}" for i in range(1, CLIENTS + 1)]
    for i in range(1, CLIENTS + 1):
        node = api(f"node/{nodes[f'client-{i}']['ID']}")
        assert node["Attributes"]["unique.network.ip-address"] == f"198.18.0.{10 + i}"
        assert node["NodeClass"] == f"nomadtf-client-{i}"
        assert node["Meta"]["nomadtf_client"] == str(i)
        assert node["Drivers"]["raw_exec"]["Healthy"]
        # Nomad fingerprints the Consul agent it talks to: the one of its own namespace.
        assert node["Attributes"]["unique.consul.name"] == f"client-{i}"
        assert consul_in(f"ntf-c{i}", "/v1/agent/self")["Config"]["NodeName"] == f"client-{i}"
    catalog = {n["Node"]: n["Address"] for n in requests.get(f"http://{cluster_mod.CONSUL_ADDR}/v1/catalog/nodes", timeout=10).json()}
    assert catalog == {"server": "198.18.0.1", **{f"client-{i}": f"198.18.0.{10 + i}" for i in range(1, CLIENTS + 1)}}
    # The server machine listens on 198.18.0.1 only: the single-node stack can run beside it.
    for name in ("consul", "openbao", "nomad"):
        proc = psutil.Process(cluster.component(name).pid)
        listening = {c.laddr.ip for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        assert listening == {"198.18.0.1"}, (name, listening)
    assert [r["node"] for r in cluster.status() if r["node"]] == ["ready"] * CLIENTS


@pytest.mark.stack
def test_dev_cli_sees_the_cluster(cluster):
    up = nomadtf("dev", "up", "--clients", str(CLIENTS), timeout=60)
    assert up.returncode == 0 and "already up" in up.stderr, up.stderr
    status = nomadtf("dev", "status", "--cluster", timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(r"nomad-client-3\s+running .*198\.18\.0\.13.* node ready", status.stdout), status.stdout
    assert cluster.root_token() not in status.stdout + status.stderr
    env = nomadtf("dev", "env", "--cluster", timeout=60).stdout
    assert "export NOMAD_ADDR=http://198.18.0.1:4646" in env
    assert "export CONSUL_HTTP_ADDR=198.18.0.1:8500" in env
    assert re.search(r"export PATH=\S*nomadtf/bin", env), env


# ---- jobs over several clients --------------------------------------------------------------


@pytest.mark.stack
def test_a_job_spreads_over_the_clients_and_its_tf_config_names_their_addresses(cluster, tmp_path):
    env = cluster.env()
    spec = probe_job(unique("mc-spread"))
    for index, role in enumerate(("chief", "worker", "ps"), start=1):
        spec["roles"][role].update(cpu=200, memory=300, constraints=[on_client(index)])
    try:
        run = nomadtf("run", str(write_job(tmp_path, spec)), "--timeout", "2m", env=env, timeout=180)
        assert run.returncode == 0, run.stdout + run.stderr
        (tf_config,) = tf_configs(spec["name"], env)
        assert tf_config["cluster"]["chief"][0].startswith("198.18.0.11:")
        assert tf_config["cluster"]["worker"][0].startswith("198.18.0.12:")
        assert tf_config["cluster"]["ps"][0].startswith("198.18.0.13:")
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
        running = pool.submit(nomadtf, "run", str(write_job(tmp_path, spec)), "--timeout", "4m", env=env, timeout=300)
        try:
            first = wait_until(lambda: tf_configs(job_id, env), 90, "the chief's first TF_CONFIG", interval=1.0)[0]
            worker_address = first["cluster"]["worker"][0]
            victim = int(worker_address.split(":")[0].rsplit(".", 1)[1]) - 10
            assert victim in (2, 3)  # never with the chief (client 1); the affinity asks for 3

            killed = time.monotonic()
            cluster.kill_client(victim)
            wait_until(lambda: _node_status(f"client-{victim}") == "down", 30, f"client-{victim} to be down")
            down_after = time.monotonic() - killed
            configs = wait_until(
                lambda: (c := tf_configs(job_id, env)) and len(c) >= 2 and c, 90, "the chief's second TF_CONFIG", interval=0.5
            )
            moved_after = time.monotonic() - killed
            new_address = configs[-1]["cluster"]["worker"][0]
            assert new_address.split(":")[0] == f"198.18.0.{10 + (5 - victim)}", configs
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
                cluster.restart_client(victim)
            purge(job_id)
    assert [r["node"] for r in cluster.status() if r["node"]] == ["ready"] * CLIENTS


@pytest.mark.stack
def test_a_paused_client_goes_down_and_comes_back(cluster):
    try:
        cluster.pause_client(2)
        wait_until(lambda: _node_status("client-2") == "down", 30, "client-2 to be down")
    finally:
        cluster.resume_client(2)
    wait_until(lambda: _node_status("client-2") == "ready", 30, "client-2 to be ready again")


def _node_status(name: str) -> str:
    return {n["Name"]: n["Status"] for n in api("nodes")}.get(name, "absent")


# ---- the agents' configuration (no servers) ---------------------------------------------------


def test_generated_configs_are_accepted_by_nomad_and_consul(tmp_path):
    from nomadtf.devstack import binaries

    nomad = binaries.cache_dir() / "bin" / "nomad"
    consul = binaries.cache_dir() / "bin" / "consul"
    if not (nomad.is_file() and consul.is_file()):
        pytest.fail(f"the cached nomad and consul binaries are missing in {nomad.parent}; run scripts/setup")
    files = {
        "server.hcl": wiring.nomad_server_config(tmp_path / "s", "198.18.0.1", "198.18.0.1:8500", "http://198.18.0.1:8200"),
        "client.hcl": wiring.nomad_client_config(
            tmp_path / "c",
            "client-1",
            "198.18.0.11",
            ["198.18.0.1:4647"],
            "eth0",
            "127.0.0.1:8500",
            "http://198.18.0.1:8200",
            node_class="nomadtf-client-1",
            meta={"nomadtf_client": "1"},
        ),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        check = subprocess.run([str(nomad), "config", "validate", str(tmp_path / name)], capture_output=True, text=True)
        assert check.returncode == 0, f"{name}:\n{text}\n{check.stdout}{check.stderr}"
    consul_files = {
        "server.json": wiring.consul_server_config(tmp_path / "cs", "server", "198.18.0.1", "198.18.0.1"),
        "client.json": wiring.consul_client_config(tmp_path / "cc", "client-1", "198.18.0.11", "127.0.0.1", ["198.18.0.1"]),
    }
    for name, text in consul_files.items():
        (tmp_path / name).write_text(text)
        check = subprocess.run([str(consul), "validate", str(tmp_path / name)], capture_output=True, text=True)
        assert check.returncode == 0, f"{name}:\n{text}\n{check.stdout}{check.stderr}"


def test_server_config_detects_a_lost_client_in_seconds():
    text = wiring.nomad_server_config(Path("/d"), "198.18.0.1", "198.18.0.1:8500", "http://198.18.0.1:8200")
    assert 'heartbeat_grace        = "5s"' in text
    assert 'min_heartbeat_ttl      = "2s"' in text
    assert "enabled = false" in text  # no client on the server machine
    assert 'bind_addr = "198.18.0.1"' in text


def test_client_config_carries_identity_and_rejects_odd_meta_keys():
    text = wiring.nomad_client_config(
        Path("/d"), "client-2", "198.18.0.12", ["198.18.0.1:4647"], "eth0", "127.0.0.1:8500", "http://198.18.0.1:8200",
        node_class="nomadtf-client-2", meta={"nomadtf_client": "2"},
    )
    assert 'network_interface = "eth0"' in text and 'nomadtf_client = "2"' in text
    assert "create_from_role" not in text  # only servers derive task tokens
    with pytest.raises(ValueError, match="meta key"):
        wiring.nomad_client_config(Path("/d"), "c", "1.2.3.4", [], "eth0", "x", "y", meta={"a b": "1"})


def test_go_durations_parse():
    assert cluster_mod.go_duration("1m2.5s") == 62.5
    assert cluster_mod.go_duration("812.5ms") == pytest.approx(0.8125)
    assert cluster_mod.go_duration("3µs") == pytest.approx(3e-6)
    with pytest.raises(ValueError):
        cluster_mod.go_duration("soon")


def test_an_overlapping_route_or_address_is_named():
    routes = [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "192.0.2.0/24", "dev": "eth0"},
        {"dst": "198.18.0.1", "dev": "ntf-br0", "type": "local"},
        {"dst": "198.18.0.0/24", "dev": "ntf-br0"},
    ]
    links = [{"ifname": "eth0", "addr_info": [{"family": "inet", "local": "192.0.2.2"}, {"family": "inet6", "local": "fd00::2"}]}]
    assert cluster_mod.subnet_conflicts(routes, links) == []
    routes.append({"dst": "198.16.0.0/12", "dev": "tun0"})
    links.append({"ifname": "wg0", "addr_info": [{"family": "inet", "local": "198.18.0.77"}]})
    assert cluster_mod.subnet_conflicts(routes, links) == ["a route for 198.16.0.0/12 (dev tun0)", "address 198.18.0.77 on wg0"]


def test_namespace_names_and_addresses():
    assert [cluster_mod.client_ip(i) for i in (1, 2, 3)] == ["198.18.0.11", "198.18.0.12", "198.18.0.13"]
    assert cluster_mod.namespace(2) == "ntf-c2" and cluster_mod.host_veth(2) == "ntf-c2-br"
    assert len(cluster_mod.host_veth(cluster_mod.MAX_CLIENTS)) <= 15  # Linux IFNAMSIZ - 1
