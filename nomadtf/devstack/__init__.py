"""The local stack: Nomad, Consul and OpenBao on this machine, for trying nomadtf and for
its tests. Two stacks behind one `Stack` protocol (protocol.py): the single-node `DevStack`
(stack.py, on 127.0.0.1) and the several-client `ClusterStack` (cluster.py, network
namespaces on 198.18.0.0/24, optionally with ACLs and TLS). The functions here choose
which one a command means, so the CLI never asks.

    protocol      the Stack protocol; StackApi (where the servers answer, clients for them); Status
    stack         DevStack: -dev agents on 127.0.0.1
    cluster       ClusterStack: a server machine and N client namespaces; it only orchestrates:
      machines      starting the server machine and the clients (binaries, credentials, agents, daemons)
      netns         the bridge, namespaces and veths (iproute2)
      layout        which machine is where, the shape (clients, fake GPUs), its words
      record        the state directory, its marker and stack.json
      agents        how each server and agent is started
      probes        is it ready yet (through the client libraries)
      bootstrap     OpenBao for Nomad; ACLs, OpenBao's init and engines (the secure stack)
      security      the secure stack's certificates and tokens
      tls           the private CA and the certificates it signs
      teardown      stopping in order, unmounting, removing the state
    controller    the admission controller every `dev up` deploys (its own namespace and tokens on the secure stack)
    wiring        every agent configuration (shared with vagrant/)
    taskhost      what a client gives its tasks: checkpoint host volumes, the docker driver
    docker        a stack's own Docker daemon (`dev up --docker`; one per client on the cluster)
    images        `dev image build`: the Dockerfile on a debootstrap base, copied between daemons
    processes     processes by PID and start time (psutil)
    binaries      Nomad, Consul, OpenBao and Go: found, or built from the Go module proxy
    gobuild, plugin_builder   Go as the builds use it; the one builder of the project's Go plugins:
      gpu_plugin    fake NVIDIA GPUs for Nomad (its Go source in gpu_plugin/)
      consul_engine  OpenBao's Consul secrets engine (its Go source in consul_engine/)

Usage:
    stack = for_options(clients=3, secure=True)     # what `nomadtf dev up --clients 3 --secure` means
    running()                                       # the stack `nomadtf dev env` points at
    selected(cluster=False, single=False)           # the stacks `nomadtf dev down` stops
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nomadtf.devstack.protocol import Stack


def for_options(clients: int, secure: bool) -> Stack:
    """The stack `up` with these options builds: the several-client one for 2 or more
    clients or for ACLs and TLS, else the single-node one."""
    if clients >= 2 or secure:
        from nomadtf.devstack.cluster import ClusterStack

        return ClusterStack.default()
    from nomadtf.devstack.stack import DevStack

    return DevStack.default()


def running(cluster: bool = False) -> Stack:
    """The stack a shell should point at: the single-node one when it has a record, else
    the several-client one when that has one, else the single-node one; `cluster`: always
    the several-client one."""
    from nomadtf.devstack.cluster import ClusterStack
    from nomadtf.devstack.stack import DevStack

    single, several = DevStack.default(), ClusterStack.default()
    if cluster or (not single.components() and several.components()):
        return several
    return single


def selected(cluster: bool = False, single: bool = False) -> list[Stack]:
    """The stacks a command for every stack means (`dev down`, `dev status`): with
    `cluster`, the several-client one; with `single`, the single-node one; with neither,
    the single-node one and the several-client one when it has a state directory."""
    from nomadtf.devstack.cluster import ClusterStack
    from nomadtf.devstack.stack import DevStack

    stacks: list[Stack] = []
    if single or not cluster:
        stacks.append(DevStack.default())
    if single and not cluster:
        return stacks  # the several-client stack's network (netns.py) is not even read
    several = ClusterStack.default()
    if cluster or several.state_dir.exists():
        stacks.append(several)
    return stacks
