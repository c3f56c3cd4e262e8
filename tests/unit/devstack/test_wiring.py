"""The agents' configuration files (nomadtf/devstack/wiring.py), as the several-client stack
writes them: accepted by the real nomad and consul binaries, and carrying what the stack
relies on. No server runs."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from nomadtf.devstack import gobuild, layout, wiring


def test_generated_configs_are_accepted_by_nomad_and_consul(tmp_path):
    nomad = gobuild.cache_dir() / "bin" / "nomad"
    consul = gobuild.cache_dir() / "bin" / "consul"
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
        # A client of `dev up --clients N --docker`: its docker plugin block too.
        "docker-client.hcl": wiring.nomad_config(replace(layout.machine("client", 2, state_dir=tmp_path), docker_endpoint="unix:///d/docker.sock")),
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


def test_a_client_with_its_docker_daemon_points_the_docker_driver_at_it(tmp_path):
    machine = layout.machine("client", 2, state_dir=tmp_path)
    assert 'plugin "docker"' not in wiring.nomad_config(machine)
    text = wiring.nomad_config(replace(machine, docker_endpoint="unix:///s/client-2/docker.sock"))
    assert 'endpoint = "unix:///s/client-2/docker.sock"' in text and "volumes {\n      enabled = false" in text
    assert 'allow_runtimes = ["runc", "nvidia"]' in text
    # Checkpoints reach containers as the namespaces' host volumes, never a bind mount.
    assert 'host_volume "nomadtf-team-a" {\n    path      = "/tmp/nomadtf/team-a"\n    read_only = false' in text


def test_client_config_carries_identity_and_rejects_odd_meta_keys():
    text = wiring.nomad_client_config(
        Path("/d"), "client-2", "198.18.0.12", ["198.18.0.1:4647"], "eth0", "127.0.0.1:8500", "http://198.18.0.1:8200",
        node_class="nomadtf-client-2", meta={"nomadtf_client": "2"},
    )
    assert 'network_interface = "eth0"' in text and 'nomadtf_client = "2"' in text
    assert "create_from_role" not in text  # only servers derive task tokens
    with pytest.raises(ValueError, match="meta key"):
        wiring.nomad_client_config(Path("/d"), "c", "1.2.3.4", [], "eth0", "x", "y", meta={"a b": "1"})
