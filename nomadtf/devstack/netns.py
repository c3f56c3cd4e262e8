"""The several-client stack's network: a bridge in the host namespace for the server machine
and one Linux network namespace per client machine, joined to it by a veth pair. Made and
removed with iproute2's `ip`, as root.

    ntf-br0 (host)      198.18.0.1/24     the server machine's address (SERVER_IP)
    ntf-cI (netns)      198.18.0.(10+I)   client I; its end of the veth pair is eth0 there
    ntf-cI-br (host)    a port of ntf-br0 (the host end of client I's veth pair)

198.18.0.0/15 is the RFC 2544 benchmarking range: nothing outside this machine uses it, and
nothing here routes it anywhere. $NOMADTF_DEV_CLUSTER_SUBNET picks another /24 inside it, so
that two several-client stacks (two checkouts, two developers) run side by side; the names
then carry its number (ntf5-br0, ntf5-c1 for 198.18.5.0/24).

Usage:
    check_subnet_free()                       # or DevStackError naming what overlaps
    create(3, remember=record.remember)       # bridge, ntf-c1..ntf-c3, their veths
    remove(record.get("namespaces"), record.get("links"))
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nomadtf.errors import DevStackError

DEFAULT_SUBNET = "198.18.0.0/24"
BENCHMARK_RANGE = ipaddress.ip_network("198.18.0.0/15")


def subnet(text: str | None = None) -> ipaddress.IPv4Network:
    """The stack's /24 inside 198.18.0.0/15: `text`, else $NOMADTF_DEV_CLUSTER_SUBNET, else
    198.18.0.0/24."""
    text = text or os.environ.get("NOMADTF_DEV_CLUSTER_SUBNET") or DEFAULT_SUBNET
    try:
        net = ipaddress.ip_network(text)
    except ValueError:
        net = None
    if not isinstance(net, ipaddress.IPv4Network) or net.prefixlen != 24 or not net.subnet_of(BENCHMARK_RANGE):
        raise DevStackError(f"NOMADTF_DEV_CLUSTER_SUBNET is a /24 inside 198.18.0.0/15 (e.g. 198.18.1.0/24), not {text!r}")
    return net


@dataclass(frozen=True)
class Net:
    """The stack's subnet and the names and server address that follow from it."""

    subnet: ipaddress.IPv4Network

    @property
    def net_id(self) -> int:
        """The subnet's third octet (plus 256 in 198.19.x): interface and namespace names
        carry it; the default subnet keeps the plain names."""
        return int(self.subnet.network_address.packed[2]) + (256 if self.subnet.network_address.packed[1] == 19 else 0)

    @property
    def name_prefix(self) -> str:
        return "ntf-" if self.net_id == 0 else f"ntf{self.net_id}-"

    @property
    def bridge(self) -> str:
        return f"{self.name_prefix}br0"

    @property
    def server_ip(self) -> str:
        return str(self.subnet.network_address + 1)


@functools.cache
def net() -> Net:
    """This process's stack network, read from $NOMADTF_DEV_CLUSTER_SUBNET on first use (not
    at import: a bad value fails only the commands that need the several-client stack)."""
    return Net(subnet())


_DERIVED = {"SUBNET": "subnet", "NET_ID": "net_id", "NAME_PREFIX": "name_prefix", "BRIDGE": "bridge", "SERVER_IP": "server_ip"}


def __getattr__(name: str):
    """SUBNET, NET_ID, NAME_PREFIX, BRIDGE, SERVER_IP: the fields of net(), as module names."""
    if name in _DERIVED:
        return getattr(net(), _DERIVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Inside each namespace the client's end of its veth pair.
CLIENT_INTERFACE = "eth0"
# Client addresses run from .11 to .210; the longest host-side name stays within Linux's
# 15 characters (IFNAMSIZ - 1).
MAX_CLIENTS = 200


def client_ip(index: int) -> str:
    return str(net().subnet.network_address + 10 + index)


def namespace(index: int) -> str:
    """The network namespace of client `index`."""
    return f"{net().name_prefix}c{index}"


def host_veth(index: int) -> str:
    """The host end of client `index`'s veth pair, a port of the bridge."""
    return f"{namespace(index)}-br"


def ip(*args: str) -> str:
    """Run `ip ARGS` and return its output; a failure is a DevStackError with ip's own message."""
    try:
        result = subprocess.run(["ip", *args], capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise DevStackError("the several-client stack needs the `ip` command (iproute2)") from exc
    if result.returncode != 0:
        raise DevStackError(f"`ip {' '.join(args)}` failed: {result.stderr.strip() or result.returncode}")
    return result.stdout


def namespaces() -> set[str]:
    """Every network namespace of this machine (`ip netns list`)."""
    return {line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def namespace_pids(name: str) -> list[int]:
    """Every process whose network namespace is `name` (`ip netns pids`)."""
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def subnet_conflicts(routes: list[dict], links: list[dict], subnet: ipaddress.IPv4Network | None = None, bridge: str | None = None) -> list[str]:
    """What on this machine overlaps `subnet` (default: the stack's), from `ip -j route show table all` and
    `ip -j addr show`: routes and IPv4 addresses on anything but our own bridge. Pure."""
    subnet = subnet or net().subnet
    bridge = bridge or net().bridge
    found = []
    for route in routes:
        dst = route.get("dst", "")
        if not dst or dst == "default" or route.get("dev") == bridge or route.get("type") in ("broadcast", "local"):
            continue
        try:
            other = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if other.version == 4 and other.overlaps(subnet):
            found.append(f"a route for {dst} (dev {route.get('dev', '?')})")
    for link in links:
        if link.get("ifname") == bridge:
            continue
        for addr in link.get("addr_info", []):
            if addr.get("family") == "inet" and ipaddress.ip_address(addr["local"]) in subnet:
                found.append(f"address {addr['local']} on {link.get('ifname')}")
    return found


def check_subnet_free() -> None:
    """Refuse to take SUBNET when a route or an address of this machine overlaps it."""
    routes = json.loads(ip("-j", "route", "show", "table", "all") or "[]")
    links = json.loads(ip("-j", "addr", "show") or "[]")
    conflicts = subnet_conflicts(routes, links)
    if conflicts:
        raise DevStackError(
            f"{'; '.join(conflicts)} overlaps {net().subnet}, which the several-client stack puts on its own "
            f"bridge {net().bridge}; remove it or stop what uses it"
        )


def taken(clients: int) -> list[str]:
    """The namespaces and links `create(clients)` would make that exist already."""
    names = [n for n in (namespace(i) for i in range(1, clients + 1)) if n in namespaces()]
    return names + [n for n in (net().bridge, *(host_veth(i) for i in range(1, clients + 1))) if link_exists(n)]


def check_names_free(clients: int, recorded_in: object) -> None:
    """Refuse to make what `create(clients)` would when any of it exists already, unrecorded
    by the stack in `recorded_in` (its state directory, for the message)."""
    names = taken(clients)
    if names:
        raise DevStackError(
            f"{', '.join(names)} already exist{'s' if len(names) == 1 else ''} but no several-client stack "
            f"recorded {'it' if len(names) == 1 else 'them'} in {recorded_in}; delete them "
            "(`ip netns del NAME`, `ip link del NAME`) and retry"
        )


def create(clients: int, remember: Callable[[str, str], None]) -> None:
    """The bridge with SERVER_IP, and for each client its namespace, addressed, with its
    veth pair up. `remember(kind, name)` ("namespaces" or "links") is told of each before
    it is made, so that a failure half-way still leaves a record of what to remove."""
    bridge = net().bridge
    remember("links", bridge)
    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", f"{net().server_ip}/{net().subnet.prefixlen}", "dev", bridge)
    ip("link", "set", bridge, "up")
    for i in range(1, clients + 1):
        ns, veth = namespace(i), host_veth(i)
        remember("namespaces", ns)
        ip("netns", "add", ns)
        remember("links", veth)
        ip("link", "add", veth, "type", "veth", "peer", "name", CLIENT_INTERFACE, "netns", ns)
        ip("link", "set", veth, "master", bridge, "up")
        ip("-n", ns, "addr", "add", f"{client_ip(i)}/{net().subnet.prefixlen}", "dev", CLIENT_INTERFACE)
        ip("-n", ns, "link", "set", CLIENT_INTERFACE, "up")
        ip("-n", ns, "link", "set", "lo", "up")


def remove(recorded_namespaces: Sequence[str], links: Sequence[str]) -> None:
    """Delete the namespaces that still exist and the links (last made, first deleted).
    Stop the processes in the namespaces first."""
    for ns in recorded_namespaces:
        ip("netns", "del", ns)
    for link in reversed(links):
        # A veth's host end goes with its namespace, and the kernel may remove it just
        # after we looked: "Cannot find device" then means done.
        if link_exists(link):
            result = subprocess.run(["ip", "link", "del", link], capture_output=True, text=True)
            if result.returncode != 0 and "Cannot find device" not in result.stderr:
                raise DevStackError(f"`ip link del {link}` failed: {result.stderr.strip() or result.returncode}")
