"""`nomadtf dev`: the local Nomad + Consul + OpenBao stack for trying nomadtf."""

from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nomadtf.cli.common import err, stamp

if TYPE_CHECKING:
    from nomadtf.devstack.protocol import Status

dev_app = typer.Typer(no_args_is_help=True, help="The local Nomad + Consul + OpenBao stack for trying nomadtf.")


@dev_app.command("up")
def dev_up(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server")] = 120.0,
    gpus: Annotated[
        Optional[int], typer.Option("--gpus", min=0, help="Fake NVIDIA GPUs per Nomad client (the project's device plugin); default none, or as the running stack has")
    ] = None,
    clients: Annotated[
        int, typer.Option("--clients", min=1, help="Nomad clients; 2 or more: a cluster of network namespaces on 198.18.0.0/24")
    ] = 1,
    gpu_clients: Annotated[
        Optional[str], typer.Option("--gpu-clients", help="With --clients N: only these clients get the --gpus (e.g. 3 or 2,3); default every client")
    ] = None,
    secure: Annotated[
        bool, typer.Option("--secure", help="ACLs (default deny) and TLS on Nomad, Consul and OpenBao; runs as the several-client stack")
    ] = False,
    docker: Annotated[
        bool, typer.Option("--docker", help="A private Docker daemon (with --clients N: one per client) and Nomad's docker driver beside raw_exec")
    ] = False,
    mig: Annotated[
        Optional[int],
        typer.Option(
            "--mig", min=0,
            help="Single-node stack: fake MIG slices beside the --gpus, as nomad-device-nvidia 1.1 lists them "
            "(GPUs named '<model> MIG 1g.5gb', 4864 MiB); default none, or as the running stack has",
        ),
    ] = None,
) -> None:
    """Build or find the binaries and start Consul, OpenBao and Nomad on 127.0.0.1
    (--clients N or --secure: a server on 198.18.0.1 and N client namespaces)."""
    from nomadtf import devstack
    from nomadtf.devstack.layout import parse_client_list

    stack = devstack.for_options(clients, secure)
    chosen = parse_client_list(gpu_clients) if gpu_clients is not None else None
    started = time.monotonic()
    if not stack.up(stamp, timeout=timeout, gpus=gpus, clients=clients, gpu_clients=chosen, secure=secure, docker=docker or None, mig=mig):
        err(f"the {stack.title} is already up ({stack.state_dir})")
        return
    err(f"{stack.title} up in {time.monotonic() - started:.1f}s; state in {stack.state_dir}")
    err(f'use it from a shell with: eval "$({stack.env_command})"')


OnlyCluster = Annotated[bool, typer.Option("--cluster", help="Only the several-client stack (`dev up --clients N`)")]
OnlySingle = Annotated[bool, typer.Option("--single", help="Only the single-node stack")]


@dev_app.command("down")
def dev_down(cluster: OnlyCluster = False, single: OnlySingle = False) -> None:
    """Stop what `dev up` started and remove its state (every stack that runs, unless
    --cluster or --single)."""
    from nomadtf import devstack

    for stack in devstack.selected(cluster=cluster, single=single):
        stack.down(progress=stamp)
        err(f"{stack.title} stopped")


@dev_app.command("status")
def dev_status(cluster: OnlyCluster = False, single: OnlySingle = False) -> None:
    """What runs, where, and where its log is (every stack that runs, unless --cluster or
    --single); exit 1 when a part of one is not healthy."""
    from nomadtf import devstack

    stacks = devstack.selected(cluster=cluster, single=single)
    shown = [status for status in (stack.status() for stack in stacks) if status.rows]
    if not shown:
        typer.echo(f"{stacks[0].title}: not running")
        raise typer.Exit(1)
    for status in shown:
        for line in status_lines(status):
            typer.echo(line)
    if not all(row.healthy for status in shown for row in status.rows):
        raise typer.Exit(1)


def status_lines(status: Status) -> list[str]:
    """A stack's status as `dev status` shows it: the heading, a line per process (with a
    node column where the stack has nodes), the footer."""
    width = max(8, *(len(row.component) + 1 for row in status.rows))
    with_nodes = any(row.node is not None for row in status.rows)
    lines = [status.heading] if status.heading else []
    for row in status.rows:
        node = f"{f' node {row.node}' if row.node else '':<14}" if with_nodes else ""
        lines.append(f"{row.component:<{width}} {row.state:<8} pid {row.pid:<7} {row.address:<24}{node} log {row.log}")
    return lines + ([status.footer] if status.footer else [])


@dev_app.command("env")
def dev_env(cluster: OnlyCluster = False) -> None:
    """Print export lines for a shell: eval "$(nomadtf dev env)" (the single-node stack
    when it runs, else the several-client one; --cluster: always that one)."""
    import shlex

    from nomadtf import devstack

    for key, value in devstack.running(cluster).env().items():
        typer.echo(f"export {key}={shlex.quote(value)}")


@dev_app.command("binaries")
def dev_binaries(
    names: Annotated[Optional[list[str]], typer.Argument(help="consul, nomad, bao, gpu-plugin, consul-engine (default: the first three)", show_default=False)] = None,
    go: Annotated[Optional[str], typer.Option("--go", help="Build with this Go (e.g. go1.26.8): the machine's go (1.21 or later) fetches it itself (GOTOOLCHAIN)")] = None,
) -> None:
    """Find or build the stack's binaries (cached in ~/.cache/nomadtf) and print their paths."""
    from nomadtf.devstack import binaries

    started = time.monotonic()
    found = binaries.ensure(names or ["consul", "nomad", "bao"], lambda m: err(f"    {m}"), go)
    for name, path in found.items():
        typer.echo(f"{name}: {path}")
    err(f"binaries ready in {time.monotonic() - started:.0f}s")


class MachineKind(str, enum.Enum):
    server = "server"
    client = "client"


class Agent(str, enum.Enum):
    nomad = "nomad"
    consul = "consul"


@dev_app.command("config")
def dev_config(
    kind: Annotated[MachineKind, typer.Argument(help="server (Consul and Nomad servers) or client (their client agents)")],
    agent: Annotated[Agent, typer.Option("--agent", help="nomad: the Nomad agent's HCL; consul: the Consul agent's JSON")] = Agent.nomad,
    index: Annotated[int, typer.Option("--index", min=1, help="client: its number (node client-N, node_class nomadtf-client-N)")] = 1,
    address: Annotated[Optional[str], typer.Option("--address", help="The machine's address; default: the stack's (198.18.0.1, 198.18.0.(10+N))")] = None,
    servers: Annotated[Optional[str], typer.Option("--servers", help="client: the server machine's address(es), comma-separated; default 198.18.0.1")] = None,
    interface: Annotated[str, typer.Option("--interface", help="client: the network interface its allocations advertise")] = "eth0",
    state_dir: Annotated[Optional[Path], typer.Option("--state-dir", help="Holds <machine>/nomad-data and consul-data; default: the stack's")] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="client: fake NVIDIA GPUs (the project's device plugin)")] = 0,
    no_vault: Annotated[bool, typer.Option("--no-vault", help="No vault block (a cluster without Vault)")] = False,
) -> None:
    """Print one machine's agent configuration, as `dev up --clients N` writes it (with no
    option: exactly the stack's file). vagrant/provision.sh writes the VMs' files with it."""
    from nomadtf.devstack import layout, wiring

    machine = layout.machine(
        kind.value,
        index,
        state_dir=state_dir,
        address=address,
        servers=[s.strip() for s in servers.split(",") if s.strip()] if servers else (),
        network_interface=interface,
        vault=not no_vault,
        gpus=gpus,
    )
    typer.echo(wiring.nomad_config(machine) if agent is Agent.nomad else wiring.consul_config(machine), nl=False)


image_app = typer.Typer(no_args_is_help=True, help="Task images for the local stack's Docker daemon (`dev up --docker`).")
dev_app.add_typer(image_app, name="image")


@image_app.command("build")
def dev_image_build(
    tf: Annotated[Optional[str], typer.Option("--tf", help="TensorFlow version (default: this installation's)")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="tensorflow[and-cuda] instead of tensorflow-cpu (several GB of CUDA wheels)")] = False,
    cluster: Annotated[bool, typer.Option("--cluster", help="For the several-client stack's daemons (`dev up --clients N --docker`)")] = False,
) -> None:
    """Build the repository's Dockerfile on a Debian base made here (cached) and print the
    image reference on the last line (for driver.image / driver.gpu_image). On the
    several-client stack it is built by client 1's daemon and copied to the others."""
    from nomadtf import devstack
    from nomadtf.devstack import images
    from nomadtf.errors import DevStackError

    stack = devstack.running(cluster=cluster)
    daemons = stack.docker_daemons() if stack.is_up() else []
    if not daemons:
        up = "nomadtf dev up --clients N --docker" if cluster else "nomadtf dev up --docker"
        raise DevStackError(f"no local stack with Docker runs: `{up}` first")
    started = time.monotonic()
    first, *others = [(d, d.client(timeout=900)) for d in daemons]
    ref = images.build(first[1], stamp, tf_version=tf, gpu=gpu)
    for daemon, client in others:
        images.copy(first[1], client, ref, stamp, to=daemon.host)
    err(f"image ready in {time.monotonic() - started:.0f}s")
    typer.echo(ref)
