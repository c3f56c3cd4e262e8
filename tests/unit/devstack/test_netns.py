"""The several-client stack's network, pure parts (nomadtf/devstack/netns.py): which
subnet it takes, what on this machine would overlap it, the names and addresses of the
client namespaces. Nothing is created."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest

from nomadtf.devstack import netns
from nomadtf.errors import DevStackError


def test_the_subnet_is_a_24_inside_the_benchmarking_range():
    assert netns.subnet("198.18.5.0/24") == ipaddress.ip_network("198.18.5.0/24")
    assert netns.subnet("198.19.255.0/24").subnet_of(netns.BENCHMARK_RANGE)
    for wrong in ("198.18.0.0/16", "10.0.0.0/24", "198.20.0.0/24", "soon", "::1/128"):
        with pytest.raises(DevStackError, match="a /24 inside 198.18.0.0/15"):
            netns.subnet(wrong)


def test_an_overlapping_route_or_address_is_named():
    routes = [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "192.0.2.0/24", "dev": "eth0"},
        {"dst": "198.18.0.1", "dev": "ntf-br0", "type": "local"},
        {"dst": "198.18.0.0/24", "dev": "ntf-br0"},
    ]
    links = [{"ifname": "eth0", "addr_info": [{"family": "inet", "local": "192.0.2.2"}, {"family": "inet6", "local": "fd00::2"}]}]
    assert netns.subnet_conflicts(routes, links) == []
    routes.append({"dst": "198.16.0.0/12", "dev": "tun0"})
    links.append({"ifname": "wg0", "addr_info": [{"family": "inet", "local": "198.18.0.77"}]})
    assert netns.subnet_conflicts(routes, links) == ["a route for 198.16.0.0/12 (dev tun0)", "address 198.18.0.77 on wg0"]


def test_namespace_names_and_addresses():
    assert [netns.client_ip(i) for i in (1, 2, 3)] == ["198.18.0.11", "198.18.0.12", "198.18.0.13"]
    assert netns.namespace(2) == "ntf-c2" and netns.host_veth(2) == "ntf-c2-br"
    assert len(netns.host_veth(netns.MAX_CLIENTS)) <= 15  # Linux IFNAMSIZ - 1


def test_a_route_only_overlapping_another_subnet_is_no_conflict():
    routes = [{"dst": "198.18.1.0/24", "dev": "ntf1-br0"}]
    assert netns.subnet_conflicts(routes, [], subnet=ipaddress.ip_network("198.18.0.0/24"), bridge="ntf-br0") == []
    assert netns.subnet_conflicts(routes, [], subnet=ipaddress.ip_network("198.18.1.0/24"), bridge="ntf-br0") == [
        "a route for 198.18.1.0/24 (dev ntf1-br0)"
    ]


def test_a_bad_subnet_variable_fails_only_what_needs_the_network(tmp_path):
    # Importing the package (as `dev down --single` does) must not raise; asking for the
    # several-client stack's address names the variable and the fix.
    code = (
        "import nomadtf.devstack.netns as n\n"
        "try:\n    n.SERVER_IP\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "NOMADTF_DEV_CLUSTER_SUBNET": "10.0.0.0/8"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("DevStackError NOMADTF_DEV_CLUSTER_SUBNET is a /24 inside 198.18.0.0/15"), out.stdout
    env["NOMADTF_DEV_DIR"] = str(tmp_path / "no-stack")  # nothing to stop: `down` says so
    down = subprocess.run([sys.executable, "-m", "nomadtf", "dev", "down", "--single"], env=env, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
