"""Several Nomad clients on this one machine, each in its own Linux network namespace.

The shape of a production cluster, small: a "server machine" in the host namespace and N
"client machines" that are network namespaces joined by a bridge.

    ntf-br0 (host)      198.18.0.1/24   Consul server, OpenBao, Nomad server (bound there only)
    ntf-cI (netns)      198.18.0.(10+I) Consul client agent (HTTP on the namespace's own
                                        127.0.0.1:8500) + Nomad client `client-I`

198.18.0.0/15 is the RFC 2544 benchmarking range: nothing outside this machine uses it, and
nothing here routes it anywhere. Nothing binds 127.0.0.1 of the host, so the single-node
stack (`stack.py`) runs beside this one.

Every task reaches "its" Consul agent at 127.0.0.1:8500, as on a real node; one agent per
Nomad client is required, since a Nomad client's service sync deregisters every `_nomad-`
service its agent holds that it does not know. The Nomad server declares a silent client
down within seconds (`wiring.FAST_HEARTBEATS`), so node loss can be tested.

State, under `~/.local/state/nomadtf/dev-cluster` (`$NOMADTF_DEV_CLUSTER_DIR`):

    .nomadtf-devstack       the marker: `down` deletes no directory without it
    stack.json              every process (PID + start time) and every namespace and link `up` made
    root-token              the OpenBao root token (0600)
    server/                 consul.json, nomad.hcl and both data dirs of the server machine
    client-I/               consul.json, nomad.hcl and both data dirs of client I
    <component>.log         each agent's output

Usage:
    cluster = ClusterStack.default()
    cluster.up(progress=print, clients=3)
    cluster.up(progress=print, clients=3, gpus=2, gpu_clients=(3,))   # 2 fake GPUs on client-3 only
    cluster.env()            # NOMAD_ADDR=http://198.18.0.1:4646, CONSUL_HTTP_ADDR, VAULT_*, PATH
    cluster.kill_client(3)   # the machine dies: every process in ntf-c3 gets SIGKILL
    cluster.restart_client(3)
    cluster.down(progress=print)
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psutil
import requests

from nomadtf.devstack import binaries, consul_engine, gpu_plugin, processes, security, wiring
from nomadtf.devstack.stack import (
    MARKER,
    Component,
    Progress,
    _base_env,
    _remove_tree,
    _unmount_under,
    _write_private,
    claim_state_dir,
    configure_openbao,
    node_gpu_count,
    spawn,
    wait_for,
)
from nomadtf.errors import DevStackError

DEFAULT_SUBNET = "198.18.0.0/24"


def _subnet() -> ipaddress.IPv4Network:
    """The stack's /24 inside 198.18.0.0/15: $NOMADTF_DEV_CLUSTER_SUBNET, so that two
    several-client stacks (two checkouts, two developers) can run side by side."""
    text = os.environ.get("NOMADTF_DEV_CLUSTER_SUBNET") or DEFAULT_SUBNET
    try:
        net = ipaddress.ip_network(text)
    except ValueError:
        net = None
    if net is None or net.prefixlen != 24 or not net.subnet_of(ipaddress.ip_network("198.18.0.0/15")):
        raise DevStackError(f"NOMADTF_DEV_CLUSTER_SUBNET is a /24 inside 198.18.0.0/15 (e.g. 198.18.1.0/24), not {text!r}")
    return net


SUBNET = _subnet()
# Interface and namespace names carry the subnet's third octet; the default keeps its names.
NET_ID = int(SUBNET.network_address.packed[2]) + (256 if SUBNET.network_address.packed[1] == 19 else 0)
NAME_PREFIX = "ntf-" if NET_ID == 0 else f"ntf{NET_ID}-"
BRIDGE = f"{NAME_PREFIX}br0"
SERVER_IP = str(SUBNET.network_address + 1)
# Inside each namespace the client's end of its veth pair.
CLIENT_INTERFACE = "eth0"
MAX_CLIENTS = 200

NOMAD_ADDR = f"http://{SERVER_IP}:4646"
CONSUL_ADDR = f"{SERVER_IP}:{wiring.CONSUL_HTTP_PORT}"
VAULT_ADDR = f"http://{SERVER_IP}:{wiring.VAULT_PORT}"


def urls(secure: bool) -> dict[str, str]:
    """Base URLs of the server machine's three APIs (HTTPS on the secure stack)."""
    if not secure:
        return {"nomad": NOMAD_ADDR, "consul": f"http://{CONSUL_ADDR}", "vault": VAULT_ADDR}
    return {
        "nomad": f"https://{SERVER_IP}:4646",
        "consul": f"https://{SERVER_IP}:{wiring.CONSUL_HTTPS_PORT}",
        "vault": f"https://{SERVER_IP}:{wiring.VAULT_PORT}",
    }


def default_state_dir() -> Path:
    explicit = os.environ.get("NOMADTF_DEV_CLUSTER_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "nomadtf" / ("dev-cluster" if NET_ID == 0 else f"dev-cluster-{NET_ID}")


def client_ip(index: int) -> str:
    return str(SUBNET.network_address + 10 + index)


def namespace(index: int) -> str:
    return f"{NAME_PREFIX}c{index}"


def host_veth(index: int) -> str:
    """The host end of client `index`'s veth pair, a port of the bridge."""
    return f"{namespace(index)}-br"


def node_name(index: int) -> str:
    return f"client-{index}"


def machine(
    kind: str,
    index: int = 0,
    *,
    state_dir: Path | None = None,
    address: str | None = None,
    servers: Sequence[str] = (),
    network_interface: str = CLIENT_INTERFACE,
    vault: bool = True,
    gpus: int = 0,
) -> wiring.Machine:
    """The server machine or client `index` of the several-client stack, as `up` runs it;
    an argument given replaces the stack's own value (`nomadtf dev config` for other
    machines: addresses, interface, state directory)."""
    if kind == "server" and servers:
        raise DevStackError("the server machine's agents are the servers; --servers is for a client")
    if kind == "client" and not 1 <= index <= MAX_CLIENTS:
        raise DevStackError(f"a client's index is a number from 1 to {MAX_CLIENTS}, not {index}")
    if gpus and kind != "client":
        raise DevStackError("fake GPUs go on clients, not on the server machine")
    address = address or (SERVER_IP if kind == "server" else client_ip(index))
    name = "server" if kind == "server" else node_name(index)
    return wiring.Machine(
        kind,
        address,
        (address,) if kind == "server" else tuple(servers or (SERVER_IP,)),
        (state_dir or default_state_dir()) / name,
        index=index if kind == "client" else 0,
        network_interface=network_interface,
        vault=vault,
        gpus=gpus,
        plugin_dir=gpu_plugin.plugin_dir() if gpus else None,
    )


def gpu_client_set(clients: int, gpus: int, gpu_clients: Sequence[int] | None) -> tuple[int, ...]:
    """The sorted client indexes that get `gpus` fake GPUs: `gpu_clients`, or every client
    when it is None; none when `gpus` is 0. Pure."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise DevStackError(f"gpus must be a number >= 0, not {gpus!r}")
    if gpu_clients is None:
        return tuple(range(1, clients + 1)) if gpus else ()
    chosen = tuple(sorted(set(gpu_clients)))
    odd = [i for i in chosen if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= clients]
    if odd:
        raise DevStackError(f"--gpu-clients names clients 1..{clients}, not {', '.join(map(str, odd))}")
    if chosen and not gpus:
        raise DevStackError("--gpu-clients needs --gpus N (how many fake GPUs each of those clients gets)")
    return chosen if gpus else ()


def parse_client_list(text: str) -> tuple[int, ...]:
    """"3" or "2,3" (`--gpu-clients`) -> (2, 3). Pure."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise DevStackError(f"--gpu-clients is a comma-separated list of client numbers (e.g. 3 or 2,3), not {text!r}") from exc


def describe_shape(clients: int, gpus: int, gpu_clients: Sequence[int]) -> str:
    """"3 clients with 2 fake GPUs on client 3" and the like. Pure."""
    if not gpus or not gpu_clients:
        return f"{clients} clients without fake GPUs"
    if tuple(gpu_clients) == tuple(range(1, clients + 1)):
        return f"{clients} clients with {gpus} fake GPUs each"
    names = ", ".join(str(i) for i in gpu_clients)
    return f"{clients} clients with {gpus} fake GPUs on client{'s' if len(gpu_clients) > 1 else ''} {names}"


def up_command(clients: int, gpus: int, gpu_clients: Sequence[int], secure: bool = False) -> str:
    """The `nomadtf dev up` command line that builds this shape. Pure."""
    command = f"nomadtf dev up --clients {clients}" + (" --secure" if secure else "")
    if gpus and gpu_clients:
        command += f" --gpus {gpus}"
        if tuple(gpu_clients) != tuple(range(1, clients + 1)):
            command += f" --gpu-clients {','.join(str(i) for i in gpu_clients)}"
    return command


def _client_index(component: str) -> int | None:
    """`consul-client-2` / `nomad-client-2` -> 2; a server-machine component -> None."""
    head, _, tail = component.rpartition("-client-")
    return int(tail) if head and tail.isdigit() else None


def _ip(*args: str, check: bool = True) -> str:
    """Run `ip ARGS`; a failure is a DevStackError with ip's own message."""
    try:
        result = subprocess.run(["ip", *args], capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise DevStackError("the several-client stack needs the `ip` command (iproute2)") from exc
    if check and result.returncode != 0:
        raise DevStackError(f"`ip {' '.join(args)}` failed: {result.stderr.strip() or result.returncode}")
    return result.stdout


def namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()}


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def namespace_pids(name: str) -> list[int]:
    """Every process whose network namespace is `name` (`ip netns pids`)."""
    result = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def subnet_conflicts(routes: list[dict], links: list[dict]) -> list[str]:
    """What on this machine overlaps SUBNET, from `ip -j route show table all` and
    `ip -j addr show`: routes and IPv4 addresses on anything but our own bridge. Pure."""
    found = []
    for route in routes:
        dst = route.get("dst", "")
        if not dst or dst == "default" or route.get("dev") == BRIDGE or route.get("type") in ("broadcast", "local"):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.version == 4 and net.overlaps(SUBNET):
            found.append(f"a route for {dst} (dev {route.get('dev', '?')})")
    for link in links:
        if link.get("ifname") == BRIDGE:
            continue
        for addr in link.get("addr_info", []):
            if addr.get("family") == "inet" and ipaddress.ip_address(addr["local"]) in SUBNET:
                found.append(f"address {addr['local']} on {link.get('ifname')}")
    return found


def check_subnet_free() -> None:
    """Refuse to take SUBNET when a route or an address of this machine overlaps it."""
    routes = json.loads(_ip("-j", "route", "show", "table", "all") or "[]")
    links = json.loads(_ip("-j", "addr", "show") or "[]")
    conflicts = subnet_conflicts(routes, links)
    if conflicts:
        raise DevStackError(
            f"{'; '.join(conflicts)} overlaps {SUBNET}, which the several-client stack puts on its own "
            f"bridge {BRIDGE}; remove it or stop what uses it"
        )


class ClusterStack:
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.record_path = state_dir / "stack.json"
        self.token_path = state_dir / "root-token"
        self.marker_path = state_dir / MARKER
        self.secure_state = security.SecureState(state_dir / "secure")

    @classmethod
    def default(cls) -> ClusterStack:
        return cls(default_state_dir())

    # ---- the record ------------------------------------------------------------------

    def _load(self) -> dict:
        if not self.record_path.is_file():
            return {}
        return json.loads(self.record_path.read_text())

    def _save(self, **changes) -> None:
        data = {
            "components": [], "clients": 0, "gpus": 0, "gpu_clients": [], "namespaces": [], "links": [],
            **self._load(), **changes,
        }
        _write_private(self.record_path, json.dumps(data, indent=2))

    def _remember(self, key: str, item: str) -> None:
        """Record a namespace or link before creating it: a failed `up` still removes it."""
        items = self._load().get(key, [])
        if item not in items:
            self._save(**{key: [*items, item]})

    def _put(self, comp: Component) -> None:
        comps = [c for c in self.components() if c.name != comp.name]
        self._save(components=[c.__dict__ for c in [*comps, comp]])

    def components(self) -> list[Component]:
        return [Component(**c) for c in self._load().get("components", [])]

    def component(self, name: str) -> Component:
        for comp in self.components():
            if comp.name == name:
                return comp
        raise DevStackError(f"the several-client stack has no {name}")

    def clients(self) -> int:
        return int(self._load().get("clients", 0))

    def secure(self) -> bool:
        """ACLs and TLS on Nomad, Consul and OpenBao (`up(secure=True)`)."""
        return bool(self._load().get("secure", False))

    def urls(self) -> dict[str, str]:
        return urls(self.secure())

    def api(self) -> requests.Session:
        """A session for the server machine's APIs: on the secure stack the CA and the
        management tokens, else plain."""
        return self.secure_state.api() if self.secure() else requests.Session()

    def recorded_gpus(self) -> int:
        """Fake GPUs on each client that has them (`recorded_gpu_clients`)."""
        return int(self._load().get("gpus", 0))

    def recorded_gpu_clients(self) -> tuple[int, ...]:
        """The clients with fake GPUs; a record from before `gpu_clients` means all of them."""
        data = self._load()
        if not int(data.get("gpus", 0)):
            return ()
        if "gpu_clients" not in data:
            return tuple(range(1, int(data.get("clients", 0)) + 1))
        return tuple(int(i) for i in data["gpu_clients"])

    def client_gpus(self, index: int) -> int:
        """Fake GPUs on client `index`, as recorded."""
        return self.recorded_gpus() if index in self.recorded_gpu_clients() else 0

    def describe(self) -> str:
        """The recorded shape, e.g. "3 clients with 2 fake GPUs on client 3"."""
        return describe_shape(self.clients(), self.recorded_gpus(), self.recorded_gpu_clients())

    def _process(self, comp: Component) -> psutil.Process | None:
        return processes.find(comp.pid, comp.create_time) if comp.create_time is not None else None

    def is_up(self) -> bool:
        data = self._load()
        comps = self.components()
        if not comps or len(comps) != 3 + 2 * int(data.get("clients", 0)):
            return False
        return all(self._process(c) for c in comps) and set(data.get("namespaces", [])) <= namespaces()

    def root_token(self) -> str:
        if self.secure():
            return self.secure_state.tokens().openbao_root
        try:
            return self.token_path.read_text().strip()
        except OSError as exc:
            raise DevStackError(f"no several-client stack at {self.state_dir}; run `nomadtf dev up --clients N`") from exc

    def env(self) -> dict[str, str]:
        """The variables that point nomad, consul, bao and nomadtf at this cluster; on the
        secure stack with the CA and the management tokens (an operator's shell)."""
        bin_dirs = []
        for comp in self.components():
            folder = str(Path(comp.binary).parent)
            if folder not in bin_dirs:
                bin_dirs.append(folder)
        found = self.urls()
        env = {
            "NOMAD_ADDR": found["nomad"],
            "CONSUL_HTTP_ADDR": found["consul"].removeprefix("http://"),
            "VAULT_ADDR": found["vault"],
            "VAULT_TOKEN": self.root_token(),
            "PATH": os.pathsep.join([*bin_dirs, os.environ.get("PATH", "")]),
        }
        if self.secure():
            tokens = self.secure_state.tokens()
            ca = str(self.secure_state.ca_file)
            env.update(
                {
                    "NOMAD_TOKEN": tokens.nomad_management,
                    "NOMAD_CACERT": ca,
                    "CONSUL_HTTP_TOKEN": tokens.consul_management,
                    "CONSUL_HTTP_SSL": "true",
                    "CONSUL_CACERT": ca,
                    "VAULT_CACERT": ca,
                    "BAO_CACERT": ca,
                }
            )
        return env

    def status(self) -> list[dict[str, str]]:
        """One row per agent (never the token); a Nomad client's row carries its node's
        status as the server sees it (`ready`, `down`, `initializing`, or `unknown`)."""
        nodes = _node_statuses(self.api(), self.urls()["nomad"])
        rows = []
        for comp in self.components():
            index = _client_index(comp.name)
            if index is None:
                found = self.urls()
                address = {"consul": found["consul"], "openbao": found["vault"], "nomad": found["nomad"]}[comp.name]
            else:
                address = f"{client_ip(index)} ({namespace(index)})"
            is_nomad_client = index is not None and comp.name.startswith("nomad")
            node = nodes.get(node_name(index), "unknown") if is_nomad_client else ""
            rows.append(
                {
                    "component": comp.name,
                    "pid": str(comp.pid),
                    "state": "running" if self._process(comp) else "stopped",
                    "address": address,
                    "node": node,
                    "gpus": str(self.client_gpus(index)) if is_nomad_client else "",
                    "log": comp.log,
                }
            )
        return rows

    # ---- up --------------------------------------------------------------------------

    def up(
        self,
        progress: Progress,
        clients: int = 3,
        gpus: int | None = 0,
        timeout: float = 180.0,
        gpu_clients: Sequence[int] | None = None,
        secure: bool = False,
    ) -> bool:
        """Start the server machine and `clients` client namespaces, `gpus` fake GPUs on
        each client of `gpu_clients` (None: every client). `gpus` None means as the running
        cluster has, or none; `secure`: ACLs and TLS everywhere. Returns False when that
        cluster already runs (a no-op)."""
        if isinstance(clients, bool) or not isinstance(clients, int) or not 1 <= clients <= MAX_CLIENTS:
            raise DevStackError(f"clients must be a number from 1 to {MAX_CLIENTS}, not {clients!r}")
        if os.geteuid() != 0:
            raise DevStackError("the several-client stack creates network namespaces and a bridge: run it as root")
        running_up = self.is_up()
        if gpus is None:
            gpus = self.recorded_gpus() if running_up else 0
            if gpu_clients is None and running_up and gpus:
                gpu_clients = self.recorded_gpu_clients()
        with_gpus = gpu_client_set(clients, gpus, gpu_clients)
        if running_up:
            running = (self.clients(), self.recorded_gpus(), self.recorded_gpu_clients())
            if running != (clients, gpus, with_gpus) or self.secure() != secure:
                now = describe_shape(*running) + (" with ACLs and TLS" if self.secure() else "")
                wanted = describe_shape(clients, gpus, with_gpus) + (" with ACLs and TLS" if secure else "")
                raise DevStackError(
                    f"the several-client stack runs {now}, not {wanted}; "
                    f"`nomadtf dev down --cluster`, then `{up_command(clients, gpus, with_gpus, secure)}`"
                )
            return False
        if self.record_path.is_file():
            progress("a previous several-client stack is partly there; removing it first")
            self.down(progress)
        check_subnet_free()
        taken = [n for n in (namespace(i) for i in range(1, clients + 1)) if n in namespaces()]
        taken += [n for n in (BRIDGE, *(host_veth(i) for i in range(1, clients + 1))) if link_exists(n)]
        if taken:
            raise DevStackError(
                f"{', '.join(taken)} already exist{'s' if len(taken) == 1 else ''} but no several-client stack "
                f"recorded {'it' if len(taken) == 1 else 'them'} in {self.state_dir}; delete them "
                "(`ip netns del NAME`, `ip link del NAME`) and retry"
            )
        claim_state_dir(self.state_dir, "NOMADTF_DEV_CLUSTER_DIR")
        self._save(clients=clients, gpus=gpus, gpu_clients=list(with_gpus), secure=secure)
        started = time.monotonic()
        try:
            bins = {name: binaries.find_or_build(name, progress) for name in ("consul", "bao", "nomad")}
            if gpus:
                gpu_plugin.find_or_build(progress)  # into gpu_plugin.plugin_dir(), which the clients load
            if secure:
                consul_engine.find_or_build(progress)  # OpenBao 2 ships no Consul secrets engine
            if secure:
                security.SecureState.create(self.secure_state.folder, SERVER_IP, [client_ip(i) for i in range(1, clients + 1)])
                progress(f"secure: a CA and agent certificates in {self.secure_state.tls_dir}, tokens in {self.secure_state.tokens_path} (0600)")
            else:
                _write_private(self.token_path, secrets.token_urlsafe(24))
            found, api = self.urls(), self.api()
            self._make_network(clients)
            progress(f"network: {BRIDGE} {SERVER_IP}/{SUBNET.prefixlen}, namespaces {namespace(1)}..{namespace(clients)}")

            self._start_consul_server(bins["consul"])
            wait_for(lambda: _leader(api, found["consul"]), timeout, "consul server", self.component("consul").log)
            if secure:
                security.consul_acl_setup(api, found["consul"], self.secure_state)
            progress(f"consul server ready at {found['consul']}" + (" (ACLs: default deny; TLS)" if secure else ""))

            self._start_openbao(bins["bao"])
            openbao_log = self.component("openbao").log
            if secure:
                wait_for(lambda: security.openbao_initialised(api, found["vault"]), timeout, "openbao", openbao_log)
                security.openbao_init(api, found["vault"], self.secure_state)
            wait_for(lambda: api.get(f"{found['vault']}/v1/sys/health", timeout=2).status_code == 200, timeout, "openbao", openbao_log)
            nomad_token = configure_openbao(self.root_token(), found["vault"], verify=api.verify)
            if secure:
                consul_engine.register_and_mount(api, found["vault"])
                security.openbao_consul_engine(api, found["vault"], f"{SERVER_IP}:{wiring.CONSUL_HTTPS_PORT}", self.secure_state)
            progress(f"openbao ready at {found['vault']} (KV v2 at secret/, role nomad-cluster)")

            self._start_nomad_server(bins["nomad"], nomad_token)
            wait_for(lambda: _leader(api, found["nomad"]), timeout, "nomad server", self.component("nomad").log)
            if secure:
                security.nomad_acl_bootstrap(api, found["nomad"], self.secure_state)
            progress(f"nomad server ready at {found['nomad']} (UI at {found['nomad']}/ui/)")

            for i in range(1, clients + 1):
                self._start_consul_client(bins["consul"], i)
            # Each Nomad client must find its Consul agent when it starts: it fingerprints
            # the agent once, then only every 15 s, and without `consul.version` on the
            # node no job with a service is placed there.
            for i in range(1, clients + 1):
                self._wait_consul_client(i, timeout)
            for i in range(1, clients + 1):
                self._start_nomad_client(bins["nomad"], i, self.client_gpus(i))
            for i in range(1, clients + 1):
                self._wait_client(i, timeout, self.client_gpus(i))
            progress(
                f"{clients} nomad clients ready ({', '.join(client_ip(i) for i in range(1, clients + 1))}) "
                f"in {time.monotonic() - started:.1f}s"
            )
        except BaseException:
            self.down(lambda _msg: None)
            raise
        return True

    def _make_network(self, clients: int) -> None:
        self._remember("links", BRIDGE)
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{SERVER_IP}/{SUBNET.prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for i in range(1, clients + 1):
            ns, veth = namespace(i), host_veth(i)
            self._remember("namespaces", ns)
            _ip("netns", "add", ns)
            self._remember("links", veth)
            _ip("link", "add", veth, "type", "veth", "peer", "name", CLIENT_INTERFACE, "netns", ns)
            _ip("link", "set", veth, "master", BRIDGE, "up")
            _ip("-n", ns, "addr", "add", f"{client_ip(i)}/{SUBNET.prefixlen}", "dev", CLIENT_INTERFACE)
            _ip("-n", ns, "link", "set", CLIENT_INTERFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _machine(self, kind: str, index: int = 0, gpus: int = 0) -> wiring.Machine:
        """The machine's description (its folder made, private): configs come from it."""
        desc = machine(kind, index, state_dir=self.state_dir, gpus=gpus)
        if self.secure():
            desc = replace(desc, security=self.secure_state.machine(kind, index))
        desc.state_dir.mkdir(mode=0o700, exist_ok=True)
        return desc

    def _start(self, name: str, argv: list[str], env: dict[str, str], ns: str | None = None) -> Component:
        # `ip netns exec` execs the agent in place: the PID we record is the agent's.
        launcher = ["ip", "netns", "exec", ns] if ns else []
        comp = spawn(self.state_dir, name, [*launcher, *argv], env, binary=argv[0])
        self._put(comp)
        return comp

    def _start_consul_server(self, binary: Path) -> None:
        server = self._machine("server")
        config = server.state_dir / "consul.json"
        _write_private(config, wiring.consul_config(server))
        self._start("consul", [str(binary), "agent", "-config-file", str(config)], _base_env())

    def _start_openbao(self, binary: Path) -> None:
        if self.secure():
            # A real server: file storage, TLS listener; `up` initialises and unseals it.
            folder = self.state_dir / "openbao"
            folder.mkdir(mode=0o700, exist_ok=True)
            config = folder / "openbao.hcl"
            address = f"{SERVER_IP}:{wiring.VAULT_PORT}"
            text = security.openbao_config(address, self.secure_state.pair("openbao")) + consul_engine.openbao_config()
            _write_private(config, text)
            self._start("openbao", [str(binary), "server", f"-config={config}"], _base_env())
            return
        token = self.root_token()
        argv = [str(binary), "server", "-dev", f"-dev-listen-address={SERVER_IP}:8200"]
        # The token goes through the environment, not argv, so `ps` never shows it.
        self._start("openbao", argv, {**_base_env(), "BAO_DEV_ROOT_TOKEN_ID": token, "VAULT_DEV_ROOT_TOKEN_ID": token})

    def _start_nomad_server(self, binary: Path, vault_token: str) -> None:
        server = self._machine("server")
        config = server.state_dir / "nomad.hcl"
        _write_private(config, wiring.nomad_config(server))
        # Nomad reads its Vault token from VAULT_TOKEN, never from argv.
        self._start("nomad", [str(binary), "agent", "-config", str(config)], {**_base_env(), "VAULT_TOKEN": vault_token})

    def _start_consul_client(self, binary: Path, index: int) -> None:
        client = self._machine("client", index)
        config = client.state_dir / "consul.json"
        _write_private(config, wiring.consul_config(client))
        argv = [str(binary), "agent", "-config-file", str(config)]
        self._start(f"consul-client-{index}", argv, _base_env(), namespace(index))

    def _start_nomad_client(self, binary: Path, index: int, gpus: int) -> None:
        client = self._machine("client", index, gpus)
        config = client.state_dir / "nomad.hcl"
        _write_private(config, wiring.nomad_config(client))
        # raw_exec tasks inherit this PATH, so `python3 -m nomadtf` in them finds this installation.
        argv = [str(binary), "agent", "-config", str(config)]
        self._start(f"nomad-client-{index}", argv, _base_env(), namespace(index))

    def _wait_consul_client(self, index: int, timeout: float) -> None:
        consul = self.component(f"consul-client-{index}")
        api, url = self.api(), self.urls()["consul"]
        wait_for(lambda: _consul_member_alive(api, url, node_name(index)), timeout, f"consul agent {node_name(index)}", consul.log)

    def _wait_client(self, index: int, timeout: float, gpus: int) -> None:
        name = node_name(index)
        nomad = self.component(f"nomad-client-{index}")
        api, url = self.api(), self.urls()["nomad"]
        wait_for(lambda: _nomad_node_ready(api, url, name, gpus), timeout, f"nomad client {name}", nomad.log)
        # A client sends its first heartbeat up to 10 s after registering (Nomad's fixed
        # initial stagger), later than our short TTL + grace: the server may mark it down
        # once in between. Wait until it has heartbeated, and is ready after that.
        scheme = "https" if self.secure() else "http"
        seen = _HeartbeatWatch(api, f"{scheme}://{client_ip(index)}:4646")
        wait_for(seen.heartbeated, timeout, f"nomad client {name}'s first heartbeat", nomad.log)
        wait_for(lambda: _nomad_node_ready(api, url, name, gpus), timeout, f"nomad client {name}", nomad.log)

    # ---- faults, for tests -------------------------------------------------------------

    def kill_client(self, index: int) -> list[int]:
        """The machine dies: SIGKILL, at once, to every process in client `index`'s
        namespace (its Nomad and Consul agents, executors, tasks). Returns their PIDs once
        all are gone."""
        ns = self._client_namespace(index)
        procs = []
        for pid in namespace_pids(ns):
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=processes.REAP_WAIT)
        if [p for p in alive if processes.running(p)]:
            raise DevStackError(f"processes in {ns} survived SIGKILL: {', '.join(str(p.pid) for p in alive)}")
        return [p.pid for p in procs]

    def restart_client(self, index: int, timeout: float = 60.0) -> None:
        """Start client `index`'s Consul and Nomad agents again (after `kill_client`), with
        their data dirs: the same node comes back. Waits until the node is ready."""
        self._client_namespace(index)
        for name in (f"nomad-client-{index}", f"consul-client-{index}"):
            running = self._process(self.component(name))
            if running is not None:
                processes.stop(processes.tree(running), 10.0)
        consul = self.component(f"consul-client-{index}")
        nomad = self.component(f"nomad-client-{index}")
        self._start_consul_client(Path(consul.binary), index)
        self._wait_consul_client(index, timeout)
        self._start_nomad_client(Path(nomad.binary), index, self.client_gpus(index))
        self._wait_client(index, timeout, self.client_gpus(index))

    def pause_client(self, index: int) -> None:
        """SIGSTOP client `index`'s Nomad agent: it stops heartbeating, its tasks run on
        (a partition as the servers see it)."""
        self._signal_nomad_client(index, signal.SIGSTOP)

    def resume_client(self, index: int) -> None:
        self._signal_nomad_client(index, signal.SIGCONT)

    def _signal_nomad_client(self, index: int, sig: signal.Signals) -> None:
        self._client_namespace(index)
        proc = self._process(self.component(f"nomad-client-{index}"))
        if proc is None:
            raise DevStackError(f"the Nomad agent of {node_name(index)} is not running")
        proc.send_signal(sig)

    def _client_namespace(self, index: int) -> str:
        if not 1 <= index <= self.clients():
            raise DevStackError(f"the several-client stack has clients 1..{self.clients()}, not {index}")
        return namespace(index)

    # ---- down ------------------------------------------------------------------------

    def down(self, progress: Progress, grace: float = 15.0) -> None:
        """Stop every recorded agent and every process in the recorded namespaces, delete
        the namespaces, veths and the bridge, unmount what Nomad mounted, remove the state.

        Only what the record names is touched; a directory without the marker is refused.
        """
        if not self.state_dir.exists():
            return
        if not self.marker_path.is_file():
            raise DevStackError(
                f"refusing to stop or delete anything in {self.state_dir}: it has no {MARKER}, so "
                "`nomadtf dev up --clients N` did not create it; fix NOMADTF_DEV_CLUSTER_DIR or XDG_STATE_HOME"
            )
        data = self._load()
        recorded_ns = [ns for ns in data.get("namespaces", []) if ns in namespaces()]
        # Collected before anything stops: executors and tasks outlive their agent.
        agents = {c.name: (c, self._process(c)) for c in self.components()}
        in_namespaces = {pid for ns in recorded_ns for pid in namespace_pids(ns)}
        consul_like = {"consul", "openbao"} | {n for n in agents if n.startswith("consul-client-")}
        first: dict[int, psutil.Process] = {}
        last: dict[int, psutil.Process] = {}
        for name, (_comp, proc) in agents.items():
            if proc is not None:
                target = last if name in consul_like else first
                target.update((p.pid, p) for p in processes.tree(proc))
        for pid in in_namespaces - set(last):
            try:
                first.setdefault(pid, psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        # Nomad and the tasks first, so they stop while Consul and OpenBao still answer.
        survivors = []
        for label, group in (("nomad agents and tasks", first), ("consul agents and openbao", last)):
            if group:
                progress(f"stopping {len(group)} processes: {label}")
                survivors += processes.stop(list(group.values()), grace)
        if survivors:
            pids = ", ".join(str(p.pid) for p in survivors)
            raise DevStackError(f"could not stop pid {pids}; stop them and run `nomadtf dev down --cluster` again")
        for ns in recorded_ns:
            _ip("netns", "del", ns)
        for link in reversed(data.get("links", [])):
            # A veth's host end goes with its namespace, and the kernel may remove it just
            # after we looked: "Cannot find device" then means done.
            if link_exists(link):
                result = subprocess.run(["ip", "link", "del", link], capture_output=True, text=True)
                if result.returncode != 0 and "Cannot find device" not in result.stderr:
                    raise DevStackError(f"`ip link del {link}` failed: {result.stderr.strip() or result.returncode}")
        if recorded_ns or data.get("links"):
            progress(f"removed {len(recorded_ns)} namespaces and {BRIDGE}")
        _unmount_under(self.state_dir)
        _remove_tree(self.state_dir)


class _HeartbeatWatch:
    """Tells when a Nomad client has heartbeated since the watch began, from the instant of
    its last successful registration or heartbeat (GET /v1/agent/self on the client:
    stats.client.last_heartbeat is the time since then). Two different instants seen means
    at least one heartbeat; heartbeats are seconds apart, polls are not."""

    def __init__(self, api: requests.Session, base_url: str):
        self.api = api
        self.url = f"{base_url}/v1/agent/self"
        self.instants: list[float] = []

    def heartbeated(self) -> bool:
        stats = self.api.get(self.url, timeout=2).json()["stats"]["client"]
        instant = time.time() - go_duration(stats["last_heartbeat"])
        if not self.instants or instant - self.instants[-1] > 0.5:
            self.instants.append(instant)
        return len(self.instants) >= 2


_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_duration(text: str) -> float:
    """Seconds in a Go `time.Duration` string ("1m2.5s", "812.3ms", "0s")."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text.lstrip("-"):
        raise ValueError(f"not a Go duration: {text!r}")
    seconds = sum(float(n) * _GO_UNITS[u] for n, u in parts)
    return -seconds if text.startswith("-") else seconds


def _leader(api: requests.Session, url: str) -> bool:
    # GET /v1/status/leader (Nomad and Consul alike; answered without a token)
    return bool(api.get(f"{url}/v1/status/leader", timeout=2).json())


def _consul_member_alive(api: requests.Session, url: str, name: str) -> bool:
    # GET /v1/agent/members (the server's view of the LAN pool; 1 = alive)
    members = api.get(f"{url}/v1/agent/members", timeout=2).json()
    return any(m.get("Name") == name and m.get("Status") == 1 for m in members)


def _nomad_node_ready(api: requests.Session, url: str, name: str, gpus: int) -> bool:
    """Ready, raw_exec healthy, its own Consul agent fingerprinted, every fake GPU there.

    GET /v1/nodes?resources=true ; GET /v1/node/:id
    """
    nodes = api.get(f"{url}/v1/nodes", params={"resources": "true"}, timeout=2).json()
    for stub in nodes:
        if stub.get("Name") == name and stub.get("Status") == "ready":
            node = api.get(f"{url}/v1/node/{stub['ID']}", timeout=2).json()
            healthy = (node.get("Drivers") or {}).get("raw_exec", {}).get("Healthy")
            own_consul = (node.get("Attributes") or {}).get("unique.consul.name") == name
            return bool(healthy) and own_consul and node_gpu_count(stub) >= gpus
    return False


def _node_statuses(api: requests.Session, url: str) -> dict[str, str]:
    """Node name -> status, from GET /v1/nodes; empty when the server does not answer."""
    try:
        nodes = api.get(f"{url}/v1/nodes", timeout=2).json()
    except (requests.RequestException, ValueError):
        return {}
    latest: dict[str, tuple[int, str]] = {}
    for node in nodes:
        # A node re-registering under a new ID leaves its old entry behind: the newest wins.
        order = int(node.get("ModifyIndex", 0))
        if order >= latest.get(node["Name"], (-1, ""))[0]:
            latest[node["Name"]] = (order, node.get("Status", "unknown"))
    return {name: status for name, (_order, status) in latest.items()}
