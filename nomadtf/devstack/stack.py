"""The single-node local stack: Consul, OpenBao and Nomad as `-dev` agents on 127.0.0.1
(one Nomad agent that is server and client at once). A `Stack` (protocol.py).

Everything lives under one state directory (`~/.local/state/nomadtf/dev`, $NOMADTF_DEV_DIR):

    <state>/.nomadtf-devstack  marks a directory `up` created: `down` removes no other
    <state>/stack.json     PID, start time, binary and log of each server `up` started; its fake GPUs
                           and MIG slices
    <state>/root-token     the OpenBao root token (0600, random per stack)
    <state>/nomad.hcl      Nomad agent config (consul + vault wiring, the device plugin)
    <state>/<name>.log     each server's output
    <state>/nomad-data/    Nomad's data dir (allocations, task logs)
    <state>/docker.sock    with `up --docker`: the stack's own Docker daemon (docker.py)

Usage:
    stack = DevStack.default()
    stack.up(progress=print, timeout=120, gpus=6, mig=2, docker=True)   # 6 whole GPUs, 2 MIG slices
    stack.env()      # NOMAD_ADDR, CONSUL_HTTP_ADDR, VAULT_ADDR, VAULT_TOKEN (DOCKER_HOST)
    stack.api().nomad().nodes.get_nodes()
    stack.down(progress=print)
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from nomadtf.devstack import (
    agents,
    binaries,
    bootstrap,
    controller,
    gpu_plugin,
    probes,
    processes,
    taskhost,
    teardown,
    wiring,
)
from nomadtf.devstack.docker import Daemon
from nomadtf.devstack.probes import wait_for
from nomadtf.devstack.protocol import Progress, StackApi, Status, StatusRow
from nomadtf.devstack.record import MARKER, Component, Record, adopt_legacy, claim_state_dir, write_private
from nomadtf.errors import DevStackError, PortInUseError

HOST = agents.HOST
CONSUL_PORTS = {"consul http": 8500, "consul dns": 8600, "consul server": 8300, "consul serf": 8301}
VAULT_PORTS = {"openbao http": 8200}
NOMAD_PORTS = {"nomad http": 4646, "nomad rpc": 4647, "nomad serf": 4648}

# Nomad first, so its tasks stop while Consul and OpenBao still answer them.
# Docker after Nomad: the containers Nomad did not stop in time are removed with the daemon.
STOP_ORDER = ("nomad", "docker", "openbao", "consul")

NOMAD_ADDR = f"http://{HOST}:4646"
CONSUL_ADDR = f"{HOST}:8500"
VAULT_ADDR = f"http://{HOST}:8200"


def default_state_dir() -> Path:
    """$NOMADTF_DEV_DIR, else $XDG_STATE_HOME/nomadtf/dev."""
    explicit = os.environ.get("NOMADTF_DEV_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "nomadtf" / "dev"


def port_is_open(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


def describe_gpus(gpus: int, mig: int) -> str:
    """'6 fake NVIDIA GPUs', '6 fake NVIDIA GPUs and 2 MIG slices'. Pure."""
    return f"{gpus} fake NVIDIA GPUs" + (f" and {mig} MIG slices" if mig else "")


def nomad_config(data_dir: Path) -> str:
    """The -dev Nomad agent's config, without the device plugin's lines; its host volumes
    are the namespaces' checkpoint folders."""
    return wiring.nomad_dev_config(data_dir, HOST, CONSUL_ADDR, VAULT_ADDR, taskhost.host_volumes())


def check_ports_free() -> None:
    """Refuse to start where another process holds one of the stack's ports."""
    for label, port in {**CONSUL_PORTS, **VAULT_PORTS, **NOMAD_PORTS}.items():
        if port_is_open(port):
            raise PortInUseError(
                f"port {port} ({label}) on {HOST} is already taken by another process; "
                f"stop it (e.g. `ss -ltnp 'sport = :{port}'` shows which) and retry"
            )



def _offers(gpus: int, mig: int, docker: bool) -> str:
    """What the client offers beyond raw_exec, for `up`'s last line."""
    words = f"; {gpus} fake GPUs ({gpu_plugin.DEFAULT_MODEL})" if gpus else ""
    words += f"; {mig} MIG slices ({gpu_plugin.mig_model()})" if mig else ""
    return words + ("; drivers raw_exec and docker" if docker else "")


class DevStack:
    """The single-node stack in `state_dir` (see the module's docstring)."""

    title = "local stack"
    env_command = "nomadtf dev env"

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.gpus = 0  # fake NVIDIA GPUs the Nomad client advertises (`up --gpus N`)
        self.mig = 0  # and MIG slices beside them, a device group of their own (`up --mig N`)
        self.gpu_inventory: gpu_plugin.GpuInventory | None = None  # real GPUs the plugin advertises instead
        self.docker = False  # a private Docker daemon and Nomad's docker driver (`up --docker`)
        self.daemon = Daemon.for_stack(state_dir)
        self.record = Record(state_dir / "stack.json", defaults={"gpus": 0, "mig": 0, "docker": False})
        self.record_path = self.record.path
        self.token_path = state_dir / "root-token"
        self.marker_path = state_dir / MARKER

    @classmethod
    def default(cls) -> DevStack:
        return cls(default_state_dir())

    # ---- reading state -------------------------------------------------------------

    def components(self) -> list[Component]:
        return self.record.components()

    def is_up(self) -> bool:
        comps = self.components()
        return len(comps) == 3 + self.recorded_docker() and all(c.process() for c in comps)

    def root_token(self) -> str:
        try:
            return self.token_path.read_text().strip()
        except OSError as exc:
            raise DevStackError(f"no local stack at {self.state_dir}; run `nomadtf dev up`") from exc

    def recorded_gpus(self) -> int:
        """The fake GPUs of the stack as `up` recorded it (0 without a record)."""
        return self._recorded_count("gpus")

    def recorded_mig(self) -> int:
        """The fake MIG slices of the stack as `up` recorded it (0 without a record)."""
        return self._recorded_count("mig")

    def _recorded_count(self, key: str) -> int:
        try:
            return int(self.record.get(key) or 0)
        except (OSError, ValueError):
            return 0

    def docker_daemons(self) -> list[Daemon]:
        """The stack's Docker daemon, when it has one (`up --docker`)."""
        return [self.daemon] if self.recorded_docker() else []

    def recorded_docker(self) -> bool:
        """Whether the recorded stack has its own Docker daemon."""
        try:
            return bool(self.record.get("docker"))
        except (OSError, ValueError):
            return False

    def api(self) -> StackApi:
        """Plain HTTP on 127.0.0.1, no ACLs; OpenBao's root token once `up` chose it."""
        token = self.token_path.read_text().strip() if self.token_path.is_file() else None
        return StackApi(NOMAD_ADDR, f"http://{CONSUL_ADDR}", VAULT_ADDR, vault_token=token)

    def env(self) -> dict[str, str]:
        env = {
            "NOMAD_ADDR": NOMAD_ADDR,
            "CONSUL_HTTP_ADDR": CONSUL_ADDR,
            "VAULT_ADDR": VAULT_ADDR,
            "VAULT_TOKEN": self.root_token(),
        }
        if self.recorded_docker():
            env["DOCKER_HOST"] = self.daemon.host
        return env

    def status(self) -> Status:
        """One row per server (never the token); the fake GPUs after them."""
        addresses = {"consul": f"http://{CONSUL_ADDR}", "openbao": VAULT_ADDR, "nomad": NOMAD_ADDR, "docker": self.daemon.host}
        rows = tuple(
            StatusRow(
                component=comp.name,
                state="running" if comp.process() else "stopped",
                pid=comp.pid,
                address=addresses.get(comp.name, ""),
                log=comp.log,
            )
            for comp in self.components()
        )
        gpus, mig = (self.recorded_gpus(), self.recorded_mig()) if rows else (0, 0)
        footer = f"nomad client: {describe_gpus(gpus, mig)} (device plugin {gpu_plugin.PLUGIN_NAME})" if gpus or mig else None
        return Status(rows, footer=footer)

    # ---- up --------------------------------------------------------------------------

    def up(
        self,
        progress: Progress,
        *,
        timeout: float = 120.0,
        gpus: int | None = None,
        clients: int = 1,
        gpu_clients: Sequence[int] | None = None,
        secure: bool = False,
        docker: bool | None = None,
        mig: int | None = None,
    ) -> bool:
        """Start the stack. Returns False when it was already up (a no-op). `gpus`: fake
        NVIDIA GPUs on the Nomad client through the project's device plugin (None: as the
        last `up` of this object, else none); `mig`: fake MIG slices beside them, listed as
        nomad-device-nvidia 1.1 lists slices (`gpu_plugin.mig_model`; None: likewise); a
        running stack with other counts than those given is an error. `docker`: a private
        Docker daemon and Nomad's docker driver beside raw_exec (None: as the last `up` of
        this object). One client, no ACLs: more clients, GPUs on some of them, or ACLs and
        TLS are the several-client stack's."""
        if gpu_clients is not None:
            raise DevStackError("--gpu-clients is for the several-client stack: add --clients N (2 or more)")
        if clients != 1 or secure:
            raise DevStackError("the single-node stack has one Nomad client and no ACLs: `--clients N` or `--secure` is the several-client stack")
        self.gpus = self.gpus if gpus is None else gpus
        self.mig = self.mig if mig is None else mig
        self.docker = self.docker if docker is None else docker
        adopted = adopt_legacy(self.record, self.marker_path)
        if adopted:
            self._record(adopted)
        if self.is_up():
            running = (self.recorded_gpus(), self.recorded_mig())
            wanted = (running[0] if gpus is None else gpus, running[1] if mig is None else mig)
            if wanted != running:
                raise DevStackError(
                    f"the running local stack has {describe_gpus(*running)}, not {describe_gpus(*wanted)}; "
                    f"`nomadtf dev down --single`, then `nomadtf dev up --gpus {wanted[0]}"
                    + (f" --mig {wanted[1]}`" if wanted[1] else "`")
                )
            if docker and not self.recorded_docker():
                raise DevStackError("the running local stack has no Docker daemon; `nomadtf dev down`, then `nomadtf dev up --docker`")
            self.gpus, self.mig = running
            self.docker = self.recorded_docker()
            controller.ensure_controller(self, progress)
            return False
        if self.components():
            progress("a previous stack is partly running; stopping it first")
            self.down(progress)
        check_ports_free()
        claim_state_dir(self.state_dir, "NOMADTF_DEV_DIR")
        bins = {name: binaries.find_or_build(name, progress) for name in ("consul", "bao", "nomad")}
        plugin = gpu_plugin.find_or_build(progress) if self.gpus or self.mig else None
        token = secrets.token_urlsafe(24)
        write_private(self.token_path, token)
        api = self.api()
        started: list[Component] = []
        try:
            started.append(agents.start_consul_dev(self.state_dir, bins["consul"]))
            self._record(started)
            wait_for(lambda: probes.consul_leader(api), timeout, "consul", started[-1].log)
            progress(f"consul ready at http://{CONSUL_ADDR}")

            started.append(agents.start_openbao_dev(self.state_dir, bins["bao"], f"{HOST}:8200", token))
            self._record(started)
            wait_for(lambda: probes.openbao_active(api), timeout, "openbao", started[-1].log)
            nomad_token = bootstrap.configure_openbao(api.vault())
            progress(f"openbao ready at {VAULT_ADDR} (KV v2 at secret/, role {wiring.VAULT_ROLE})")

            if self.docker:
                started.append(self.daemon.start())
                self._record(started)
                self.daemon.wait_ready(timeout, started[-1].log)
                progress(f"docker ready at {self.daemon.host} (images in {self.daemon.data_root})")

            started.append(self._start_nomad(bins["nomad"], nomad_token, plugin))
            self._record(started)
            drivers = ("raw_exec", "docker") if self.docker else ("raw_exec",)
            wait_for(lambda: probes.nomad_node_ready(api, self.gpus + self.mig, drivers=drivers), timeout, "nomad", started[-1].log)
            progress(f"nomad ready at {NOMAD_ADDR} (UI at {NOMAD_ADDR}/ui/){_offers(self.gpus, self.mig, self.docker)}")
            controller.ensure_controller(self, progress)
        except BaseException:
            self.down(lambda _msg: None)
            raise
        return True

    def _start_nomad(self, binary: Path, vault_token: str, plugin: Path | None = None) -> Component:
        data_dir = self.state_dir / "nomad-data"
        data_dir.mkdir(exist_ok=True)
        config = self.state_dir / "nomad.hcl"
        extra = self.plugin_hcl(plugin.parent) if plugin else ""
        extra += self.daemon.plugin_hcl() if self.docker else ""
        write_private(config, nomad_config(data_dir) + extra)
        return agents.start_nomad_dev(self.state_dir, binary, config, vault_token)

    def plugin_hcl(self, plugin_dir: Path) -> str:
        """The device plugin's lines of the Nomad client config."""
        if self.gpu_inventory is not None:
            return self.gpu_inventory.plugin_hcl(plugin_dir)
        models = gpu_plugin.stack_groups(self.gpus, self.mig) if self.mig else None
        return gpu_plugin.client_plugin_hcl(plugin_dir, self.gpus, seed="nomadtf-dev", models=models)

    def _record(self, comps: list[Component]) -> None:
        self.record.save(
            components=[asdict(c) for c in comps],
            gpus=self.gpus or self.recorded_gpus(),
            mig=self.mig or self.recorded_mig(),
            docker=self.docker or self.recorded_docker(),
        )

    def restart_consul(self, progress: Progress, timeout: float = 60.0) -> None:
        """Stop and start the Consul agent alone (a -dev agent forgets its catalog and KV:
        fault-injection tests use this to prove watches and claims survive it)."""
        consul_comp = self.record.component("consul")
        running = consul_comp.process()
        if running is not None:
            processes.stop(processes.tree(running), 10.0)
        restarted = agents.start_consul_dev(self.state_dir, Path(consul_comp.binary))
        self.record.put(restarted)
        wait_for(lambda: probes.consul_leader(self.api()), timeout, "consul", restarted.log)
        progress(f"consul restarted (pid {restarted.pid})")

    # ---- down ------------------------------------------------------------------------

    def down(self, progress: Progress, grace: float = 15.0) -> None:
        """Stop what `up` started and everything it spawned, then remove the state directory
        (teardown.py: only recorded processes and their descendants; a directory without
        the marker is refused and left as it is)."""
        if not self.state_dir.exists():
            return
        teardown.refuse_unmarked(
            self.state_dir,
            "`nomadtf dev up` did not create it. If NOMADTF_DEV_DIR or XDG_STATE_HOME points there "
            "by mistake, fix it; if an older nomadtf started a stack there, `nomadtf dev up` takes it "
            "over while all of it runs, or stop the PIDs in its stack.json and delete the directory yourself",
        )
        comps = sorted(self.components(), key=lambda c: STOP_ORDER.index(c.name))
        if any(c.name == "docker" and c.process() for c in comps):
            nomad_comp = next((c for c in comps if c.name == "nomad"), None)
            running = nomad_comp.process() if nomad_comp else None
            if running is not None:  # Nomad first: it would restart the containers removed under it
                processes.stop(processes.tree(running), grace)
            removed = self.daemon.remove_containers()
            if removed:
                progress(f"removed {removed} containers of the stack's Docker daemon")
        # Every tree is collected before anything stops (teardown.py says why).
        groups = []
        for comp in comps:
            proc = comp.process()
            if proc is not None:
                tree = processes.tree(proc)
                groups.append((f"{comp.name} (pid {comp.pid}) and {len(tree) - 1} processes it started", tree))
        teardown.stop_in_order(groups, grace, progress, "nomadtf dev down")
        teardown.remove_state(self.state_dir)
