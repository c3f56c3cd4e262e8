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

This class only orchestrates; each job has its module: `netns` (the network), `layout`
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
import secrets
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from nomadtf.devstack import (
    agents,
    binaries,
    bootstrap,
    consul_engine,
    controller,
    gpu_plugin,
    layout,
    netns,
    probes,
    processes,
    security,
    teardown,
    wiring,
)
from nomadtf.devstack.docker import Daemon
from nomadtf.devstack.probes import wait_for
from nomadtf.devstack.protocol import Progress, StackApi, Status, StatusRow
from nomadtf.devstack.record import MARKER, Component, Record, claim_state_dir, write_private
from nomadtf.errors import DevStackError


class ClusterStack:
    """The several-client stack in `state_dir` (see the module's docstring)."""

    title = "several-client stack"
    env_command = "nomadtf dev env --cluster"

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.record = Record(
            state_dir / "stack.json",
            defaults={"clients": 0, "gpus": 0, "gpu_clients": [], "namespaces": [], "links": [], "secure": False, "docker": False},
        )
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
        if gpus is None:  # as the running stack has them, or none
            gpus = running.gpus if running else 0
            if gpu_clients is None and running and gpus:
                gpu_clients = running.gpu_clients
        if docker is None:
            docker = running.docker if running else False
        wanted = layout.Shape(clients, gpus, layout.gpu_client_set(clients, gpus, gpu_clients), secure, docker)
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
        taken = netns.taken(clients)
        if taken:
            raise DevStackError(
                f"{', '.join(taken)} already exist{'s' if len(taken) == 1 else ''} but no several-client stack "
                f"recorded {'it' if len(taken) == 1 else 'them'} in {self.state_dir}; delete them "
                "(`ip netns del NAME`, `ip link del NAME`) and retry"
            )
        claim_state_dir(self.state_dir, "NOMADTF_DEV_CLUSTER_DIR")
        self.record.save(clients=clients, gpus=gpus, gpu_clients=list(wanted.gpu_clients), secure=secure, docker=docker)
        started = time.monotonic()
        try:
            bins = self._binaries(progress, gpus, secure)
            self._credentials(progress, clients, secure)
            netns.create(clients, self.record.remember)
            progress(f"network: {netns.BRIDGE} {netns.SERVER_IP}/{netns.SUBNET.prefixlen}, namespaces {netns.namespace(1)}..{netns.namespace(clients)}")
            self._start_server_machine(bins, timeout, progress)
            self._start_clients(bins["consul"], bins["nomad"], range(1, clients + 1), timeout)
            addresses = ", ".join(netns.client_ip(i) for i in range(1, clients + 1))
            progress(f"{clients} nomad clients ready ({addresses}) in {time.monotonic() - started:.1f}s")
            controller.ensure_controller(self, progress, secure=secure)
        except BaseException:
            self.down(lambda _msg: None)
            raise
        return True

    def _binaries(self, progress: Progress, gpus: int, secure: bool) -> dict[str, Path]:
        """The servers' binaries, and the plugins this shape loads (found, or built once)."""
        bins = {name: binaries.find_or_build(name, progress) for name in ("consul", "bao", "nomad")}
        if gpus:
            gpu_plugin.find_or_build(progress)  # into gpu_plugin.plugin_dir(), which the clients load
        if secure:
            consul_engine.find_or_build(progress)  # OpenBao 2 ships no Consul secrets engine
        return bins

    def _credentials(self, progress: Progress, clients: int, secure: bool) -> None:
        """With `secure`, the CA, every agent's certificate and the tokens; else OpenBao's
        dev root token."""
        if not secure:
            write_private(self.token_path, secrets.token_urlsafe(24))
            return
        client_ips = [netns.client_ip(i) for i in range(1, clients + 1)]
        security.SecureState.create(self.secure_state.folder, netns.SERVER_IP, client_ips)
        progress(f"secure: a CA and agent certificates in {self.secure_state.tls_dir}, tokens in {self.secure_state.tokens_path} (0600)")

    def _machine(self, kind: str, index: int = 0, gpus: int = 0) -> wiring.Machine:
        """The machine's description (its folder made, private): configs come from it."""
        desc = layout.machine(kind, index, state_dir=self.state_dir, gpus=gpus)
        if self.shape().secure:
            desc = replace(desc, security=self.secure_state.machine(kind, index))
        if self.shape().docker and kind == "client":
            desc = replace(desc, docker_endpoint=self.daemon(index).host)
        desc.state_dir.mkdir(mode=0o700, exist_ok=True)
        return desc

    def _start_server_machine(self, bins: dict[str, Path], timeout: float, progress: Progress) -> None:
        """Consul server, OpenBao, Nomad server, each bootstrapped once it answers."""
        secure = self.shape().secure
        server = self._machine("server")
        found = layout.urls(secure)

        consul = agents.start_consul(self.state_dir, "consul", bins["consul"], server)
        self.record.put(consul)
        wait_for(lambda: probes.consul_leader(self.api()), timeout, "consul server", consul.log)
        if secure:
            bootstrap.consul_acl_setup(self.api().consul(), self.secure_state)
        progress(f"consul server ready at {found['consul']}" + (" (ACLs: default deny; TLS)" if secure else ""))

        openbao = self._start_openbao(bins["bao"])
        self.record.put(openbao)
        if secure:
            wait_for(lambda: probes.openbao_listening(self.api()), timeout, "openbao", openbao.log)
            bootstrap.openbao_init(self.api().vault(), self.secure_state)
        wait_for(lambda: probes.openbao_active(self.api()), timeout, "openbao", openbao.log)
        vault = self.api().vault(timeout=60)  # with the root token: openbao_init saved it
        nomad_token = bootstrap.configure_openbao(vault)
        if secure:
            bootstrap.register_consul_engine(vault, consul_engine.PLUGIN.path())
            bootstrap.configure_consul_engine(vault, f"{netns.SERVER_IP}:{wiring.CONSUL_HTTPS_PORT}", self.secure_state)
        progress(f"openbao ready at {found['vault']} (KV v2 at secret/, role {wiring.VAULT_ROLE})")

        nomad = agents.start_nomad(self.state_dir, "nomad", bins["nomad"], server, vault_token=nomad_token)
        self.record.put(nomad)
        wait_for(lambda: probes.nomad_leader(self.api()), timeout, "nomad server", nomad.log)
        if secure:
            bootstrap.nomad_acl_bootstrap(self.api().nomad(), self.secure_state)
        progress(f"nomad server ready at {found['nomad']} (UI at {found['nomad']}/ui/)")

    def _start_openbao(self, binary: Path) -> Component:
        address = f"{netns.SERVER_IP}:{wiring.VAULT_PORT}"
        if not self.shape().secure:
            return agents.start_openbao_dev(self.state_dir, binary, address, self.root_token())
        # A real server with a TLS listener, and the Consul engine's plugin directory.
        config = security.openbao_config(address, self.secure_state.pair("openbao")) + consul_engine.openbao_config()
        return agents.start_openbao(self.state_dir, binary, config)

    def _start_clients(self, consul_binary: Path, nomad_binary: Path, indexes: Sequence[int], timeout: float) -> None:
        """Start the Consul and Nomad agents of each client in `indexes` and wait until every
        one is a ready node. Each Nomad client must find its Consul agent when it starts: it
        fingerprints the agent once, then only every 15 s, and without `consul.version` on
        the node no job with a service is placed there."""
        for i in indexes:
            consul_name, _ = layout.agent_names(i)
            self.record.put(agents.start_consul(self.state_dir, consul_name, consul_binary, self._machine("client", i), netns.namespace(i)))
        for i in indexes:
            consul = self.component(layout.agent_names(i)[0])
            wait_for(lambda i=i: probes.consul_node_alive(self.api(), layout.node_name(i)), timeout, f"consul agent {layout.node_name(i)}", consul.log)
        joined = self._start_daemons(indexes, timeout) if self.shape().docker else {}
        for i in indexes:
            _, nomad_name = layout.agent_names(i)
            machine = self._machine("client", i, self.shape().gpus_on(i))
            self.record.put(
                agents.start_nomad(self.state_dir, nomad_name, nomad_binary, machine, namespace=netns.namespace(i), join_pid=joined.get(i))
            )
        for i in indexes:
            self._wait_client(i, timeout)

    def _start_daemons(self, indexes: Sequence[int], timeout: float) -> dict[int, int]:
        """Each client's Docker daemon (one still running from before is kept: `start_client`
        after a node loss), in the client's network namespace; index -> the PID whose mount
        and network namespaces its Nomad client joins. The containers a stopped stack left
        behind are removed: the new Nomad client knows none of them."""
        pids = {}
        for i in indexes:
            name, daemon = f"docker-{layout.node_name(i)}", self.daemon(i)
            comp = next((c for c in self.components() if c.name == name and c.process()), None)
            if comp is None:
                daemon.socket.unlink(missing_ok=True)  # a dead daemon's socket answers nothing
                comp = daemon.start(netns.namespace(i), name=name)
                self.record.put(comp)
                daemon.wait_ready(timeout, comp.log)
                daemon.remove_containers()
            pids[i] = comp.pid
        return pids

    def _wait_client(self, index: int, timeout: float) -> None:
        """Until client `index` is a ready node that has heartbeated at least once."""
        name, gpus = layout.node_name(index), self.shape().gpus_on(index)
        drivers = ("raw_exec", "docker") if self.shape().docker else ("raw_exec",)
        log = self.component(layout.agent_names(index)[1]).log
        api = self.api()
        wait_for(lambda: probes.nomad_node_ready(api, gpus, name, drivers=drivers), timeout, f"nomad client {name}", log)
        # A client sends its first heartbeat up to 10 s after registering (Nomad's fixed
        # initial stagger), later than our short TTL + grace: the server may mark it down
        # once in between. Wait until it has heartbeated, and is ready after that.
        scheme = "https" if self.shape().secure else "http"
        seen = probes.HeartbeatWatch(api, f"{scheme}://{netns.client_ip(index)}:4646")
        wait_for(seen.heartbeated, timeout, f"nomad client {name}'s first heartbeat", log)
        wait_for(lambda: probes.nomad_node_ready(api, gpus, name, drivers=drivers), timeout, f"nomad client {name}", log)

    def start_client(self, index: int, timeout: float = 60.0) -> None:
        """Start client `index`'s Consul and Nomad agents again, with their data dirs (the
        same node comes back), and wait until the node is ready. Its agents must not run
        (tests/faults.py stops them first)."""
        self.client_namespace(index)
        consul = self.component(layout.agent_names(index)[0])
        nomad = self.component(layout.agent_names(index)[1])
        self._start_clients(Path(consul.binary), Path(nomad.binary), [index], timeout)

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
