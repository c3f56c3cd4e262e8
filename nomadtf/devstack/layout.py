"""The several-client stack's layout, pure: which machine is where, what its agents are
configured with, which clients carry fake GPUs, and how the shape is said and asked for.

The server machine (Consul server, OpenBao, Nomad server) is the host at netns.SERVER_IP;
client I (a Consul client agent and the Nomad client `client-I`) is the namespace
netns.namespace(I) at netns.client_ip(I). Its state lives under
`~/.local/state/nomadtf/dev-cluster` ($NOMADTF_DEV_CLUSTER_DIR).

Usage:
    machine("client", 3, gpus=2)            # wiring.Machine of client-3, as `up` runs it
    gpu_client_set(3, 2, (3,))              # (3,): only client 3 gets the 2 fake GPUs
    shape = Shape(3, 2, (3,), secure=True)
    shape.describe()                        # "3 clients with 2 fake GPUs on client 3"
    shape.up_command()                      # "nomadtf dev up --clients 3 --secure --gpus 2 --gpu-clients 3"
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nomadtf.devstack import gpu_plugin, netns, wiring
from nomadtf.errors import DevStackError


def default_state_dir() -> Path:
    """$NOMADTF_DEV_CLUSTER_DIR, else `dev-cluster` (`dev-cluster-<N>` for another subnet)
    under $XDG_STATE_HOME/nomadtf."""
    explicit = os.environ.get("NOMADTF_DEV_CLUSTER_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "nomadtf" / ("dev-cluster" if netns.NET_ID == 0 else f"dev-cluster-{netns.NET_ID}")


def urls(secure: bool) -> dict[str, str]:
    """Base URLs of the server machine's three APIs (HTTPS on the secure stack)."""
    server = netns.SERVER_IP
    if not secure:
        return {
            "nomad": f"http://{server}:4646",
            "consul": f"http://{server}:{wiring.CONSUL_HTTP_PORT}",
            "vault": f"http://{server}:{wiring.VAULT_PORT}",
        }
    return {
        "nomad": f"https://{server}:4646",
        "consul": f"https://{server}:{wiring.CONSUL_HTTPS_PORT}",
        "vault": f"https://{server}:{wiring.VAULT_PORT}",
    }


def node_name(index: int) -> str:
    return f"client-{index}"


def agent_names(index: int) -> tuple[str, str]:
    """The record's names of client `index`'s Consul and Nomad agents."""
    return f"consul-client-{index}", f"nomad-client-{index}"


def client_index(component: str) -> int | None:
    """`consul-client-2` / `nomad-client-2` -> 2; a server-machine component -> None."""
    head, _, tail = component.rpartition("-client-")
    return int(tail) if head and tail.isdigit() else None


def machine(
    kind: str,
    index: int = 0,
    *,
    state_dir: Path | None = None,
    address: str | None = None,
    servers: Sequence[str] = (),
    network_interface: str = netns.CLIENT_INTERFACE,
    vault: bool = True,
    gpus: int = 0,
) -> wiring.Machine:
    """The server machine or client `index` of the several-client stack, as `up` runs it;
    an argument given replaces the stack's own value (`nomadtf dev config` for other
    machines: addresses, interface, state directory)."""
    if kind == "server" and servers:
        raise DevStackError("the server machine's agents are the servers; --servers is for a client")
    if kind == "client" and not 1 <= index <= netns.MAX_CLIENTS:
        raise DevStackError(f"a client's index is a number from 1 to {netns.MAX_CLIENTS}, not {index}")
    if gpus and kind != "client":
        raise DevStackError("fake GPUs go on clients, not on the server machine")
    address = address or (netns.SERVER_IP if kind == "server" else netns.client_ip(index))
    name = "server" if kind == "server" else node_name(index)
    return wiring.Machine(
        kind,
        address,
        (address,) if kind == "server" else tuple(servers or (netns.SERVER_IP,)),
        (state_dir or default_state_dir()) / name,
        index=index if kind == "client" else 0,
        network_interface=network_interface,
        vault=vault,
        gpus=gpus,
        plugin_dir=gpu_plugin.plugin_dir() if gpus else None,
    )


def check_clients(clients: object) -> int:
    """`clients` when it is a number of clients the stack can have."""
    if isinstance(clients, bool) or not isinstance(clients, int) or not 1 <= clients <= netns.MAX_CLIENTS:
        raise DevStackError(f"clients must be a number from 1 to {netns.MAX_CLIENTS}, not {clients!r}")
    return clients


def gpu_client_set(clients: int, gpus: int, gpu_clients: Sequence[int] | None) -> tuple[int, ...]:
    """The sorted client indexes that get `gpus` fake GPUs: `gpu_clients`, or every client
    when it is None; none when `gpus` is 0."""
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
    """"3" or "2,3" (`--gpu-clients`) -> (2, 3)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise DevStackError(f"--gpu-clients is a comma-separated list of client numbers (e.g. 3 or 2,3), not {text!r}") from exc


def describe_shape(clients: int, gpus: int, gpu_clients: Sequence[int], secure: bool = False, docker: bool = False) -> str:
    """"3 clients with 2 fake GPUs on client 3" and the like (and " with ACLs and TLS", and
    ", each with its Docker daemon")."""
    tls = (" with ACLs and TLS" if secure else "") + (", each with its Docker daemon" if docker else "")
    if not gpus or not gpu_clients:
        return f"{clients} clients without fake GPUs{tls}"
    if tuple(gpu_clients) == tuple(range(1, clients + 1)):
        return f"{clients} clients with {gpus} fake GPUs each{tls}"
    names = ", ".join(str(i) for i in gpu_clients)
    return f"{clients} clients with {gpus} fake GPUs on client{'s' if len(gpu_clients) > 1 else ''} {names}{tls}"


def up_command(clients: int, gpus: int, gpu_clients: Sequence[int], secure: bool = False, docker: bool = False) -> str:
    """The `nomadtf dev up` command line that builds this shape."""
    command = f"nomadtf dev up --clients {clients}" + (" --secure" if secure else "") + (" --docker" if docker else "")
    if gpus and gpu_clients:
        command += f" --gpus {gpus}"
        if tuple(gpu_clients) != tuple(range(1, clients + 1)):
            command += f" --gpu-clients {','.join(str(i) for i in gpu_clients)}"
    return command


@dataclass(frozen=True)
class Shape:
    """What a several-client stack is: `clients` clients, `gpus` fake GPUs on each client
    of `gpu_clients`, ACLs and TLS when `secure`, a Docker daemon per client when `docker`."""

    clients: int = 0
    gpus: int = 0
    gpu_clients: tuple[int, ...] = ()
    secure: bool = False
    docker: bool = False

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Shape:
        """The shape stack.json records; a record from before `gpu_clients` means every client."""
        clients, gpus = int(data.get("clients", 0)), int(data.get("gpus", 0))
        if not gpus:
            chosen: tuple[int, ...] = ()
        elif "gpu_clients" not in data:
            chosen = tuple(range(1, clients + 1))
        else:
            chosen = tuple(int(i) for i in data["gpu_clients"])
        return cls(clients, gpus, chosen, bool(data.get("secure", False)), bool(data.get("docker", False)))

    def gpus_on(self, index: int) -> int:
        """Fake GPUs on client `index`."""
        return self.gpus if index in self.gpu_clients else 0

    def describe(self, *, with_security: bool = False) -> str:
        return describe_shape(self.clients, self.gpus, self.gpu_clients, self.secure and with_security, self.docker)

    def up_command(self) -> str:
        return up_command(self.clients, self.gpus, self.gpu_clients, self.secure, self.docker)


def wanted_shape(running: Shape | None, clients: int, gpus: int | None, gpu_clients: Sequence[int] | None, secure: bool,
                 docker: bool | None) -> Shape:  # fmt: skip
    """The shape `up` is asked for: `gpus` and `docker` None mean as the running stack has
    them (with its GPU clients), or none."""
    if gpus is None:
        gpus = running.gpus if running else 0
        if gpu_clients is None and running and gpus:
            gpu_clients = running.gpu_clients
    if docker is None:
        docker = running.docker if running else False
    return Shape(clients, gpus, gpu_client_set(clients, gpus, gpu_clients), secure, docker)
