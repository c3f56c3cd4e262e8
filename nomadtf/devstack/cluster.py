"""Several Nomad clients on this one machine, each in its own Linux network namespace: the
shape of a production cluster, small. A `Stack` (protocol.py).

    ntf-br0 (host)      198.18.0.1/24   Consul server, OpenBao, Nomad server (bound there only)
    ntf-cI (netns)      198.18.0.(10+I) Consul client agent (HTTP on the namespace's own
                                        127.0.0.1:8500) + Nomad client `client-I`

Every task reaches "its" Consul agent at 127.0.0.1:8500, as on a real node; one agent per
Nomad client is required, since a Nomad client's service sync deregisters every `_nomad-`
service its agent holds that it does not know. Nothing binds 127.0.0.1 of the host, so the
single-node stack (`stack.py`) runs beside this one. The Nomad server declares a silent
client down within seconds (`wiring.FAST_HEARTBEATS`), so node loss can be tested
(tests/faults.py kills, pauses and restarts clients).

This class only orchestrates; each job has its module: `machines` (starting the server and
client machines), `netns` (the network), `layout`
(which machine is where, the shape), `record` (stack.json), `agents` (starting them),
`probes` (waiting for them), `bootstrap` (ACLs, OpenBao's init and engines), `security`
(the CA and tokens of `--secure`), `teardown` (stopping and removing).

State, under `~/.local/state/nomadtf/dev-cluster` (`$NOMADTF_DEV_CLUSTER_DIR`):

    .nomadtf-devstack       the marker: `down` deletes no directory without it
    stack.json              every process (PID + start time), the shape, and every namespace
                            and link `up` made
    root-token              the OpenBao root token (0600; with --secure: secure/tokens.json)
    secure/                 with --secure: the CA, certificates and tokens (security.py)
    server/                 consul.json, nomad.hcl and both data dirs of the server machine
    client-I/               consul.json, nomad.hcl and both data dirs of client I
    <component>.log         each agent's output

Usage:
    cluster = ClusterStack.default()
    cluster.up(progress=print, clients=3)
    cluster.up(progress=print, clients=3, gpus=2, gpu_clients=(3,))   # 2 fake GPUs on client-3 only
    cluster.env()            # NOMAD_ADDR=http://198.18.0.1:4646, CONSUL_HTTP_ADDR, VAULT_*, PATH
    cluster.down(progress=print)
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from nomadtf.devstack import (
    controller,
    layout,
    netns,
    probes,
    processes,
    security,
    teardown,
)
from nomadtf.devstack.docker import Daemon
from nomadtf.devstack.machines import Machines
from nomadtf.devstack.protocol import Progress, StackApi, Status, StatusRow
from nomadtf.devstack.record import MARKER, Component, Record, claim_state_dir
from nomadtf.errors import DevStackError

# What stack.json holds before `up` wrote it (and what a record from an older nomadtf lacks).
RECORD_DEFAULTS = {"clients": 0, "gpus": 0, "gpu_clients": [], "namespaces": [], "links": [], "secure": False, "docker": False}


class ClusterStack:
    """The several-client stack in `state_dir` (see the module's docstring)."""

    title = "several-client stack"
    env_command = "nomadtf dev env --cluster"

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.record = Record(state_dir / "stack.json", defaults=RECORD_DEFAULTS)
        self.record_path = self.record.path
        self.token_path = state_dir / "root-token"
        self.marker_path = state_dir / MARKER
        self.secure_state = security.SecureState(state_dir / "secure")

    @classmethod
    def default(cls) -> ClusterStack:
        return cls(layout.default_state_dir())

    # ---- the record ------------------------------------------------------------------

    def components(self) -> list[Component]:
        return self.record.components()

    def component(self, name: str) -> Component:
        return self.record.component(name)

    def daemon(self, index: int) -> Daemon:
        """Client `index`'s Docker daemon (`up --docker`): its socket in the client's folder,
        its images in a data root of its own that outlives `down`."""
        return Daemon.for_stack(self.state_dir / layout.node_name(index))

    def docker_daemons(self) -> list[Daemon]:
        """Every client's Docker daemon; none without `--docker`."""
        shape = self.shape()
        return [self.daemon(i) for i in range(1, shape.clients + 1)] if shape.docker else []

    def shape(self) -> layout.Shape:
        """The shape `up` recorded (clients, fake GPUs, ACLs and TLS); all zero without a record."""
        return layout.Shape.from_record(self.record.load())

    def is_up(self) -> bool:
        comps = self.components()
        shape = self.shape()
        if not comps or len(comps) != 3 + (3 if shape.docker else 2) * shape.clients:
            return False
        return all(c.process() for c in comps) and set(self.record.get("namespaces")) <= netns.namespaces()

    # ---- reaching it -----------------------------------------------------------------

    def root_token(self) -> str:
        if self.shape().secure:
            return self.secure_state.tokens().openbao_root
        try:
            return self.token_path.read_text().strip()
        except OSError as exc:
            raise DevStackError(f"no several-client stack at {self.state_dir}; run `nomadtf dev up --clients N`") from exc

    def api(self) -> StackApi:
        """The server machine's three APIs: on the secure stack HTTPS with the stack's CA
        and the management tokens (OpenBao's root token once it is initialised)."""
        secure = self.shape().secure
        urls = layout.urls(secure)
        if not secure:
            token = self.token_path.read_text().strip() if self.token_path.is_file() else None
            return StackApi(urls["nomad"], urls["consul"], urls["vault"], vault_token=token)
        tokens = self.secure_state.tokens()
        return StackApi(
            urls["nomad"],
            urls["consul"],
            urls["vault"],
            ca_file=str(self.secure_state.ca_file),
            nomad_token=tokens.nomad_management,
            consul_token=tokens.consul_management,
            vault_token=tokens.openbao_root or None,
        )

    def env(self) -> dict[str, str]:
        """The variables that point nomad, consul, bao and nomadtf at this cluster; on the
        secure stack with the CA and the management tokens (an operator's shell)."""
        bin_dirs = []
        for comp in self.components():
            folder = str(Path(comp.binary).parent)
            if folder not in bin_dirs:
                bin_dirs.append(folder)
        secure = self.shape().secure
        found = layout.urls(secure)
        env = {
            "NOMAD_ADDR": found["nomad"],
            "CONSUL_HTTP_ADDR": found["consul"].removeprefix("http://"),
            "VAULT_ADDR": found["vault"],
            "VAULT_TOKEN": self.root_token(),
            "PATH": os.pathsep.join([*bin_dirs, os.environ.get("PATH", "")]),
        }
        if secure:
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

    def status(self) -> Status:
        """One row per agent (never a token); a Nomad client's row carries its node's status
        as the server sees it (`ready`, `down`, `initializing`, or `unknown`) and its fake
        GPUs. The shape is the heading."""
        comps = self.components()
        if not comps:
            return Status()
        shape = self.shape()
        nodes = probes.node_statuses(self.api())
        found = layout.urls(shape.secure)
        server_addresses = {"consul": found["consul"], "openbao": found["vault"], "nomad": found["nomad"]}
        rows = []
        for comp in comps:
            row = StatusRow(comp.name, "running" if comp.process() else "stopped", comp.pid, "", comp.log, node="")
            index = layout.client_index(comp.name)
            if index is None:
                row = replace(row, address=server_addresses[comp.name])
            else:
                row = replace(row, address=f"{netns.client_ip(index)} ({netns.namespace(index)})")
                if comp.name == layout.agent_names(index)[1]:  # a Nomad client: its node
                    row = replace(row, node=nodes.get(layout.node_name(index), "unknown"), gpus=shape.gpus_on(index))
            rows.append(row)
        return Status(tuple(rows), heading=f"several-client stack: {shape.describe()}")

    # ---- up --------------------------------------------------------------------------

    def up(
        self,
        progress: Progress,
        *,
        timeout: float = 180.0,
        gpus: int | None = None,
        clients: int = 3,
        gpu_clients: Sequence[int] | None = None,
        secure: bool = False,
        docker: bool | None = None,
        mig: int | None = None,
    ) -> bool:
        """Start the server machine and `clients` client namespaces, `gpus` fake GPUs on
        each client of `gpu_clients` (None: every client). `gpus` None means as the running
        cluster has, or none; `secure`: ACLs and TLS everywhere; `docker`: a Docker daemon
        in each client's namespaces and Nomad's docker driver beside raw_exec (None: as the
        running cluster has, or none). Returns False when that cluster already runs (a no-op);
        another shape running is an error that names the command for this one. MIG slices
        (`mig`) are the single-node stack's only."""
        if mig:
            raise DevStackError("--mig (fake MIG slices) is for the single-node stack: leave out --clients and --secure")
        layout.check_clients(clients)
        if os.geteuid() != 0:
            raise DevStackError("the several-client stack creates network namespaces and a bridge: run it as root")
        running = self.shape() if self.is_up() else None
        wanted = layout.wanted_shape(running, clients, gpus, gpu_clients, secure, docker)
        if running:
            if running != wanted:
                raise DevStackError(
                    f"the several-client stack runs {running.describe(with_security=True)}, not "
                    f"{wanted.describe(with_security=True)}; `nomadtf dev down --cluster`, then `{wanted.up_command()}`"
                )
            controller.ensure_controller(self, progress, secure=secure)
            return False
        if self.record.exists():
            progress("a previous several-client stack is partly there; removing it first")
            self.down(progress)
        netns.check_subnet_free()
        netns.check_names_free(clients, recorded_in=self.state_dir)
        claim_state_dir(self.state_dir, "NOMADTF_DEV_CLUSTER_DIR")
        self.record.save(clients=clients, gpus=wanted.gpus, gpu_clients=list(wanted.gpu_clients), secure=secure, docker=wanted.docker)
        started = time.monotonic()
        try:
            machines = Machines(self)
            bins = machines.binaries(progress, wanted.gpus, secure)
            machines.credentials(progress, clients, secure)
            netns.create(clients, self.record.remember)
            progress(f"network: {netns.BRIDGE} {netns.SERVER_IP}/{netns.SUBNET.prefixlen}, namespaces {netns.namespace(1)}..{netns.namespace(clients)}")
            machines.start_server(bins, timeout, progress)
            machines.start_clients(bins["consul"], bins["nomad"], range(1, clients + 1), timeout)
            addresses = ", ".join(netns.client_ip(i) for i in range(1, clients + 1))
            progress(f"{clients} nomad clients ready ({addresses}) in {time.monotonic() - started:.1f}s")
            controller.ensure_controller(self, progress, secure=secure)
        except BaseException:
            self.down(lambda _msg: None)
            raise
        return True

    def start_client(self, index: int, timeout: float = 60.0) -> None:
        """Start client `index`'s Consul and Nomad agents again, with their data dirs (the
        same node comes back), and wait until the node is ready. Its agents must not run
        (tests/faults.py stops them first)."""
        self.client_namespace(index)
        consul = self.component(layout.agent_names(index)[0])
        nomad = self.component(layout.agent_names(index)[1])
        Machines(self).start_clients(Path(consul.binary), Path(nomad.binary), [index], timeout)

    def client_namespace(self, index: int) -> str:
        """The network namespace of client `index`, which must be one of the stack's."""
        clients = self.shape().clients
        if not 1 <= index <= clients:
            raise DevStackError(f"the several-client stack has clients 1..{clients}, not {index}")
        return netns.namespace(index)

    # ---- down ------------------------------------------------------------------------

    def down(self, progress: Progress, grace: float = 15.0) -> None:
        """Stop every recorded agent and every process in the recorded namespaces, delete
        the namespaces, veths and the bridge, remove the state (teardown.py).

        Only what the record names is touched; a directory without the marker is refused.
        """
        if not self.state_dir.exists():
            return
        teardown.refuse_unmarked(
            self.state_dir, "`nomadtf dev up --clients N` did not create it; fix NOMADTF_DEV_CLUSTER_DIR or XDG_STATE_HOME"
        )
        recorded_ns = [ns for ns in self.record.get("namespaces") if ns in netns.namespaces()]
        links = list(self.record.get("links"))
        # Collected before anything stops: executors and tasks outlive their agent.
        in_namespaces = {pid for ns in recorded_ns for pid in netns.namespace_pids(ns)}
        first: dict[int, psutil.Process] = {}
        last: dict[int, psutil.Process] = {}
        for comp in self.components():
            proc = comp.process()
            if proc is not None:
                consul_like = comp.name in ("consul", "openbao") or comp.name.startswith("consul-client-")
                target = last if consul_like else first
                target.update((p.pid, p) for p in processes.tree(proc))
        for pid in in_namespaces - set(last):
            try:
                first.setdefault(pid, psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        # Nomad and the tasks first, so they stop while Consul and OpenBao still answer.
        groups = [
            (f"{len(first)} processes: nomad agents and tasks", list(first.values())),
            (f"{len(last)} processes: consul agents and openbao", list(last.values())),
        ]
        teardown.stop_in_order(groups, grace, progress, "nomadtf dev down --cluster")
        netns.remove(recorded_ns, links)
        if recorded_ns or links:
            progress(f"removed {len(recorded_ns)} namespaces and {netns.BRIDGE}")
        teardown.remove_state(self.state_dir)
