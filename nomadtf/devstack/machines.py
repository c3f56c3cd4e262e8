"""Starting the several-client stack's machines, for cluster.py's `up` and `start_client`:
their binaries and credentials, the server machine (Consul server, OpenBao, Nomad server, each bootstrapped once it
answers), then each client's Consul agent, Docker daemon and Nomad client in its network
namespace, until every node is ready and has heartbeated.

Usage:
    machines = Machines(stack)                # a ClusterStack whose record and shape are saved
    bins = machines.binaries(progress, gpus=2, secure=True)
    machines.credentials(progress, clients=3, secure=True)
    machines.start_server(bins, timeout, progress)
    machines.start_clients(bins["consul"], bins["nomad"], range(1, 4), timeout)
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nomadtf.devstack import (
    agents,
    binaries,
    bootstrap,
    consul_engine,
    gpu_plugin,
    layout,
    netns,
    probes,
    security,
    wiring,
)
from nomadtf.devstack.probes import wait_for
from nomadtf.devstack.protocol import Progress
from nomadtf.devstack.record import Component, write_private


class Machines:
    """The several-client stack's machines started, each recorded in its record."""

    def __init__(self, stack: Any):
        self.stack = stack  # the ClusterStack (cluster.py imports this module: no import back)

    def binaries(self, progress: Progress, gpus: int, secure: bool) -> dict[str, Path]:
        """The servers' binaries, and the plugins this shape loads (found, or built once)."""
        bins = {name: binaries.find_or_build(name, progress) for name in ("consul", "bao", "nomad")}
        if gpus:
            gpu_plugin.find_or_build(progress)  # into gpu_plugin.plugin_dir(), which the clients load
        if secure:
            consul_engine.find_or_build(progress)  # OpenBao 2 ships no Consul secrets engine
        return bins

    def credentials(self, progress: Progress, clients: int, secure: bool) -> None:
        """With `secure`, the CA, every agent's certificate and the tokens; else OpenBao's
        dev root token."""
        if not secure:
            write_private(self.stack.token_path, secrets.token_urlsafe(24))
            return
        client_ips = [netns.client_ip(i) for i in range(1, clients + 1)]
        security.SecureState.create(self.stack.secure_state.folder, netns.SERVER_IP, client_ips)
        progress(f"secure: a CA and agent certificates in {self.stack.secure_state.tls_dir}, tokens in {self.stack.secure_state.tokens_path} (0600)")

    def describe(self, kind: str, index: int = 0, gpus: int = 0) -> wiring.Machine:
        """The machine's description (its folder made, private): configs come from it."""
        desc = layout.machine(kind, index, state_dir=self.stack.state_dir, gpus=gpus)
        if self.stack.shape().secure:
            desc = replace(desc, security=self.stack.secure_state.machine(kind, index))
        if self.stack.shape().docker and kind == "client":
            desc = replace(desc, docker_endpoint=self.stack.daemon(index).host)
        desc.state_dir.mkdir(mode=0o700, exist_ok=True)
        return desc

    def start_server(self, bins: dict[str, Path], timeout: float, progress: Progress) -> None:
        """Consul server, OpenBao, Nomad server, each bootstrapped once it answers."""
        secure = self.stack.shape().secure
        server = self.describe("server")
        found = layout.urls(secure)

        consul = agents.start_consul(self.stack.state_dir, "consul", bins["consul"], server)
        self.stack.record.put(consul)
        wait_for(lambda: probes.consul_leader(self.stack.api()), timeout, "consul server", consul.log)
        if secure:
            wait_for(lambda: probes.consul_acl_ready(self.stack.api()), timeout, "consul server's ACLs", consul.log)
            bootstrap.consul_acl_setup(self.stack.api().consul(), self.stack.secure_state)
        progress(f"consul server ready at {found['consul']}" + (" (ACLs: default deny; TLS)" if secure else ""))

        openbao = self.start_openbao(bins["bao"])
        self.stack.record.put(openbao)
        if secure:
            wait_for(lambda: probes.openbao_listening(self.stack.api()), timeout, "openbao", openbao.log)
            bootstrap.openbao_init(self.stack.api().vault(), self.stack.secure_state)
        wait_for(lambda: probes.openbao_active(self.stack.api()), timeout, "openbao", openbao.log)
        vault = self.stack.api().vault(timeout=60)  # with the root token: openbao_init saved it
        nomad_token = bootstrap.configure_openbao(vault)
        if secure:
            bootstrap.register_consul_engine(vault, consul_engine.PLUGIN.path())
            bootstrap.configure_consul_engine(vault, f"{netns.SERVER_IP}:{wiring.CONSUL_HTTPS_PORT}", self.stack.secure_state)
        progress(f"openbao ready at {found['vault']} (KV v2 at secret/, role {wiring.VAULT_ROLE})")

        nomad = agents.start_nomad(self.stack.state_dir, "nomad", bins["nomad"], server, vault_token=nomad_token)
        self.stack.record.put(nomad)
        wait_for(lambda: probes.nomad_leader(self.stack.api()), timeout, "nomad server", nomad.log)
        if secure:
            bootstrap.nomad_acl_bootstrap(self.stack.api().nomad(), self.stack.secure_state)
        progress(f"nomad server ready at {found['nomad']} (UI at {found['nomad']}/ui/)")

    def start_openbao(self, binary: Path) -> Component:
        address = f"{netns.SERVER_IP}:{wiring.VAULT_PORT}"
        if not self.stack.shape().secure:
            return agents.start_openbao_dev(self.stack.state_dir, binary, address, self.stack.root_token())
        # A real server with a TLS listener, and the Consul engine's plugin directory.
        config = security.openbao_config(address, self.stack.secure_state.pair("openbao")) + consul_engine.openbao_config()
        return agents.start_openbao(self.stack.state_dir, binary, config)

    def start_clients(self, consul_binary: Path, nomad_binary: Path, indexes: Sequence[int], timeout: float) -> None:
        """Start the Consul and Nomad agents of each client in `indexes` and wait until every
        one is a ready node. Each Nomad client must find its Consul agent when it starts: it
        fingerprints the agent once, then only every 15 s, and without `consul.version` on
        the node no job with a service is placed there."""
        for i in indexes:
            consul_name, _ = layout.agent_names(i)
            self.stack.record.put(agents.start_consul(self.stack.state_dir, consul_name, consul_binary, self.describe("client", i), netns.namespace(i)))
        for i in indexes:
            consul = self.stack.component(layout.agent_names(i)[0])
            wait_for(lambda i=i: probes.consul_node_alive(self.stack.api(), layout.node_name(i)), timeout, f"consul agent {layout.node_name(i)}", consul.log)
        joined = self.start_daemons(indexes, timeout) if self.stack.shape().docker else {}
        for i in indexes:
            _, nomad_name = layout.agent_names(i)
            machine = self.describe("client", i, self.stack.shape().gpus_on(i))
            self.stack.record.put(
                agents.start_nomad(self.stack.state_dir, nomad_name, nomad_binary, machine, namespace=netns.namespace(i), join_pid=joined.get(i))
            )
        for i in indexes:
            self.wait_client(i, timeout)

    def start_daemons(self, indexes: Sequence[int], timeout: float) -> dict[int, int]:
        """Each client's Docker daemon (one still running from before is kept: `start_client`
        after a node loss), in the client's network namespace; index -> the PID whose mount
        and network namespaces its Nomad client joins. The containers a stopped stack left
        behind are removed: the new Nomad client knows none of them."""
        pids = {}
        for i in indexes:
            name, daemon = f"docker-{layout.node_name(i)}", self.stack.daemon(i)
            comp = next((c for c in self.stack.components() if c.name == name and c.process()), None)
            if comp is None:
                daemon.socket.unlink(missing_ok=True)  # a dead daemon's socket answers nothing
                comp = daemon.start(netns.namespace(i), name=name)
                self.stack.record.put(comp)
                daemon.wait_ready(timeout, comp.log)
                daemon.remove_containers()
            pids[i] = comp.pid
        return pids

    def wait_client(self, index: int, timeout: float) -> None:
        """Until client `index` is a ready node that has heartbeated at least once."""
        name, gpus = layout.node_name(index), self.stack.shape().gpus_on(index)
        drivers = ("raw_exec", "docker") if self.stack.shape().docker else ("raw_exec",)
        log = self.stack.component(layout.agent_names(index)[1]).log
        api = self.stack.api()
        wait_for(lambda: probes.nomad_node_ready(api, gpus, name, drivers=drivers), timeout, f"nomad client {name}", log)
        # A client sends its first heartbeat up to 10 s after registering (Nomad's fixed
        # initial stagger), later than our short TTL + grace: the server may mark it down
        # once in between. Wait until it has heartbeated, and is ready after that.
        scheme = "https" if self.stack.shape().secure else "http"
        seen = probes.HeartbeatWatch(api, f"{scheme}://{netns.client_ip(index)}:4646")
        wait_for(seen.heartbeated, timeout, f"nomad client {name}'s first heartbeat", log)
        wait_for(lambda: probes.nomad_node_ready(api, gpus, name, drivers=drivers), timeout, f"nomad client {name}", log)
