"""The embedded local cluster: Consul, OpenBao and Nomad as `-dev` agents on 127.0.0.1.

Everything lives under one state directory:

    <state>/.nomadtf-devstack  marks a directory `up` created: `down` removes no other
    <state>/stack.json     PID, start time, binary and log of each server `up` started
    <state>/root-token     the OpenBao root token (0600, random per stack)
    <state>/nomad.hcl      Nomad agent config (consul + vault wiring)
    <state>/<name>.log     each server's output
    <state>/nomad-data/    Nomad's data dir (allocations, task logs)

Usage:
    stack = DevStack.default()
    stack.up(progress=print)
    stack.env()      # NOMAD_ADDR, CONSUL_HTTP_ADDR, VAULT_ADDR, VAULT_TOKEN
    stack.down()
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import requests

from nomadtf.devstack import binaries, gpu_plugin, processes, wiring
from nomadtf.devstack.processes import pid_alive  # noqa: F401 - the one liveness check; tests import it from here
from nomadtf.errors import DevStackError, PortInUseError

Progress = Callable[[str], None]

HOST = "127.0.0.1"
CONSUL_PORTS = {"consul http": 8500, "consul dns": 8600, "consul server": 8300, "consul serf": 8301}
VAULT_PORTS = {"openbao http": 8200}
NOMAD_PORTS = {"nomad http": 4646, "nomad rpc": 4647, "nomad serf": 4648}

# Nomad first, so its tasks stop while Consul and OpenBao still answer them.
STOP_ORDER = ("nomad", "openbao", "consul")
MARKER = ".nomadtf-devstack"
MARKER_TEXT = "created by `nomadtf dev up`; `nomadtf dev down` deletes this directory\n"

NOMAD_ADDR = f"http://{HOST}:4646"
CONSUL_ADDR = f"{HOST}:8500"
VAULT_ADDR = f"http://{HOST}:8200"

# The token role and the Nomad server policy, as the Nomad 1.6 Vault integration documents
# them (legacy token workflow): Nomad holds a periodic token with this policy and derives
# one token per task from the role.
NOMAD_SERVER_POLICY = """
path "auth/token/create/nomad-cluster" { capabilities = ["update"] }
path "auth/token/roles/nomad-cluster" { capabilities = ["read"] }
path "auth/token/lookup-self" { capabilities = ["read"] }
path "auth/token/lookup" { capabilities = ["update"] }
path "auth/token/revoke-accessor" { capabilities = ["update"] }
path "sys/capabilities-self" { capabilities = ["update"] }
path "auth/token/renew-self" { capabilities = ["update"] }
"""
NOMAD_CLUSTER_ROLE = {
    "disallowed_policies": "nomad-server",
    "token_explicit_max_ttl": 0,
    "orphan": True,
    "token_period": 259200,
    "renewable": True,
}


def default_state_dir() -> Path:
    explicit = os.environ.get("NOMADTF_DEV_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "nomadtf" / "dev"


def port_is_open(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


@dataclass
class Component:
    name: str
    pid: int
    binary: str
    log: str
    # psutil's create_time of `pid` at spawn; None in records of older versions, whose
    # processes can no longer be told apart from a PID reused by someone else.
    create_time: float | None = None


class DevStack:
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.gpus = 0  # fake NVIDIA GPUs the Nomad client advertises (`up --gpus N`)
        # When set, the plugin advertises exactly these (real) GPUs instead of `gpus` made-up ones.
        self.gpu_inventory: gpu_plugin.GpuInventory | None = None
        self.record_path = state_dir / "stack.json"
        self.token_path = state_dir / "root-token"
        self.marker_path = state_dir / MARKER

    @classmethod
    def default(cls) -> DevStack:
        return cls(default_state_dir())

    # ---- reading state -------------------------------------------------------------

    def components(self) -> list[Component]:
        if not self.record_path.is_file():
            return []
        data = json.loads(self.record_path.read_text())
        return [Component(**c) for c in data.get("components", [])]

    def _process(self, comp: Component) -> psutil.Process | None:
        """The process `up` started for `comp`, if it still runs (PIDs get reused)."""
        if comp.create_time is None:
            return None
        return processes.find(comp.pid, comp.create_time)

    def _ours(self, comp: Component) -> bool:
        return self._process(comp) is not None

    def is_up(self) -> bool:
        comps = self.components()
        return len(comps) == 3 and all(self._ours(c) for c in comps)

    def root_token(self) -> str:
        try:
            return self.token_path.read_text().strip()
        except OSError as exc:
            raise DevStackError(f"no local stack at {self.state_dir}; run `nomadtf dev up`") from exc

    def env(self) -> dict[str, str]:
        return {
            "NOMAD_ADDR": NOMAD_ADDR,
            "CONSUL_HTTP_ADDR": CONSUL_ADDR,
            "VAULT_ADDR": VAULT_ADDR,
            "VAULT_TOKEN": self.root_token(),
        }

    def status(self) -> list[dict[str, str]]:
        """One row per component; never includes the token."""
        rows = []
        addresses = {"consul": f"http://{CONSUL_ADDR}", "openbao": VAULT_ADDR, "nomad": NOMAD_ADDR}
        for comp in self.components():
            rows.append(
                {
                    "component": comp.name,
                    "pid": str(comp.pid),
                    "state": "running" if self._ours(comp) else "stopped",
                    "address": addresses.get(comp.name, ""),
                    "log": comp.log,
                }
            )
        return rows

    # ---- up --------------------------------------------------------------------------

    def up(self, progress: Progress, timeout: float = 120.0, gpus: int | None = None) -> bool:
        """Start the stack. Returns False when it was already up (a no-op). `gpus`: fake
        NVIDIA GPUs on the Nomad client through the project's device plugin (None: as the
        last `up` of this object, else none)."""
        self.gpus = self.gpus if gpus is None else gpus
        self._adopt_legacy_record()
        if self.is_up():
            running = self.recorded_gpus()
            if gpus is not None and running != gpus:
                raise DevStackError(
                    f"the running local stack has {running} fake GPUs, not {gpus}; "
                    f"`nomadtf dev down`, then `nomadtf dev up --gpus {gpus}`"
                )
            self.gpus = running
            return False
        if self.components():
            progress("a previous stack is partly running; stopping it first")
            self.down(progress)
        self._check_ports_free()
        self._claim_state_dir()
        bins = {name: binaries.find_or_build(name, progress) for name in ("consul", "bao", "nomad")}
        plugin = gpu_plugin.find_or_build(progress) if self.gpus else None
        token = secrets.token_urlsafe(24)
        _write_private(self.token_path, token)
        started: list[Component] = []
        try:
            started.append(self._start_consul(bins["consul"]))
            self._record(started)
            wait_for(lambda: _consul_leader(), timeout, "consul", started[-1].log)
            progress(f"consul ready at http://{CONSUL_ADDR}")

            started.append(self._start_openbao(bins["bao"], token))
            self._record(started)
            wait_for(lambda: _openbao_ready(), timeout, "openbao", started[-1].log)
            nomad_token = configure_openbao(token)
            progress(f"openbao ready at {VAULT_ADDR} (KV v2 at secret/, role nomad-cluster)")

            started.append(self._start_nomad(bins["nomad"], nomad_token, plugin))
            self._record(started)
            wait_for(lambda: _nomad_client_ready(self.gpus), timeout, "nomad", started[-1].log)
            gpus = f"; {self.gpus} fake GPUs ({gpu_plugin.DEFAULT_MODEL})" if self.gpus else ""
            progress(f"nomad ready at {NOMAD_ADDR} (UI at {NOMAD_ADDR}/ui/){gpus}")
        except BaseException:
            self.down(lambda _msg: None)
            raise
        return True

    def _adopt_legacy_record(self) -> None:
        """Take over a running stack that an older nomadtf started: its stack.json has no
        start times and its directory no marker.

        Each recorded process must still run the recorded binary and have started before
        the record was written (so its PID was not reused since); otherwise nothing changes.
        """
        comps = self.components()
        if not comps or self.marker_path.is_file() or any(c.create_time is not None for c in comps):
            return
        # psutil derives start times from a boot time in whole seconds: allow that much.
        written = self.record_path.stat().st_mtime + 1.0
        adopted = []
        for comp in comps:
            try:
                proc = psutil.Process(comp.pid)
                started = proc.create_time()
                if Path(comp.binary).name not in " ".join(proc.cmdline()) or started > written:
                    return
            except psutil.Error:
                return
            adopted.append(replace(comp, create_time=started))
        _write_private(self.marker_path, MARKER_TEXT)
        self._record(adopted)

    def _claim_state_dir(self) -> None:
        claim_state_dir(self.state_dir, "NOMADTF_DEV_DIR")

    def _check_ports_free(self) -> None:
        for label, port in {**CONSUL_PORTS, **VAULT_PORTS, **NOMAD_PORTS}.items():
            if port_is_open(port):
                raise PortInUseError(
                    f"port {port} ({label}) on {HOST} is already taken by another process; "
                    f"stop it (e.g. `ss -ltnp 'sport = :{port}'` shows which) and retry"
                )

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Component:
        return spawn(self.state_dir, name, argv, env)

    def _start_consul(self, binary: Path) -> Component:
        argv = [str(binary), "agent", "-dev", "-bind", HOST, "-client", HOST, "-node", "nomadtf-dev",
                "-hcl", f"limits {{ http_max_conns_per_client = {wiring.CONSUL_MAX_CONNS_PER_CLIENT} }}"]
        return self._spawn("consul", argv, _base_env())

    def _start_openbao(self, binary: Path, token: str) -> Component:
        argv = [str(binary), "server", "-dev", f"-dev-listen-address={HOST}:8200"]
        # The token goes through the environment, not argv, so `ps` never shows it.
        env = {**_base_env(), "BAO_DEV_ROOT_TOKEN_ID": token, "VAULT_DEV_ROOT_TOKEN_ID": token}
        return self._spawn("openbao", argv, env)

    def _start_nomad(self, binary: Path, vault_token: str, plugin: Path | None = None) -> Component:
        data_dir = self.state_dir / "nomad-data"
        data_dir.mkdir(exist_ok=True)
        config = self.state_dir / "nomad.hcl"
        extra = self.plugin_hcl(plugin.parent) if plugin else ""
        _write_private(config, nomad_config(data_dir) + extra)
        argv = [str(binary), "agent", "-dev", "-bind", HOST, "-config", str(config)]
        # Nomad reads its Vault token from VAULT_TOKEN; its client keeps that variable
        # out of every task's environment (env.denylist default).
        env = {**_base_env(), "VAULT_TOKEN": vault_token}
        return self._spawn("nomad", argv, env)

    def plugin_hcl(self, plugin_dir: Path) -> str:
        """The device plugin's lines of the Nomad client config."""
        if self.gpu_inventory is not None:
            return self.gpu_inventory.plugin_hcl(plugin_dir)
        return gpu_plugin.client_plugin_hcl(plugin_dir, self.gpus, seed="nomadtf-dev")

    def recorded_gpus(self) -> int:
        try:
            return int(json.loads(self.record_path.read_text()).get("gpus", 0))
        except (OSError, ValueError):
            return 0

    def _record(self, comps: list[Component]) -> None:
        data = {"components": [c.__dict__ for c in comps], "gpus": self.gpus or self.recorded_gpus()}
        _write_private(self.record_path, json.dumps(data, indent=2))

    def restart_consul(self, progress: Progress, timeout: float = 60.0) -> None:
        """Stop and start the Consul agent alone (a -dev agent forgets its catalog and KV:
        fault-injection tests use this to prove watches and claims survive it)."""
        comps = self.components()
        consul_comp = next(c for c in comps if c.name == "consul")
        running = self._process(consul_comp)
        if running is not None:
            processes.stop(processes.tree(running), 10.0)
        restarted = self._start_consul(Path(consul_comp.binary))
        self._record([restarted if c.name == "consul" else c for c in comps])
        wait_for(lambda: _consul_leader(), timeout, "consul", restarted.log)
        progress(f"consul restarted (pid {restarted.pid})")

    # ---- down ------------------------------------------------------------------------

    def down(self, progress: Progress, grace: float = 15.0) -> None:
        """Stop what `up` started and everything it spawned, then remove the state directory.

        Only the recorded processes (same PID and start time) and their descendants are
        stopped. A directory without the marker is refused and left as it is.
        """
        if not self.state_dir.exists():
            return
        if not self.marker_path.is_file():
            raise DevStackError(
                f"refusing to stop or delete anything in {self.state_dir}: it has no {MARKER}, so "
                "`nomadtf dev up` did not create it. If NOMADTF_DEV_DIR or XDG_STATE_HOME points there "
                "by mistake, fix it; if an older nomadtf started a stack there, `nomadtf dev up` takes it "
                "over while all of it runs, or stop the PIDs in its stack.json and delete the directory yourself"
            )
        comps = sorted(self.components(), key=lambda c: STOP_ORDER.index(c.name))
        # Every tree is collected before anything stops: Nomad's executors and their tasks
        # outlive the agent by design, re-parented to init, where nothing links them to it.
        trees = [(comp, processes.tree(proc)) for comp in comps if (proc := self._process(comp))]
        survivors: list[psutil.Process] = []
        for comp, procs in trees:
            progress(f"stopping {comp.name} (pid {comp.pid}) and {len(procs) - 1} processes it started")
            survivors += processes.stop(procs, grace)
        if survivors:
            pids = ", ".join(str(p.pid) for p in survivors)
            raise DevStackError(f"could not stop pid {pids}; stop them (as their owner) and run `nomadtf dev down` again")
        # Nomad mounts a tmpfs for each task's secrets/ and private/ (as root) and only
        # unmounts them when it garbage-collects the allocation, which a stopped dev agent
        # never does.
        _unmount_under(self.state_dir)
        _remove_tree(self.state_dir)


def nomad_config(data_dir: Path) -> str:
    return wiring.nomad_dev_config(data_dir, HOST, CONSUL_ADDR, VAULT_ADDR)


def claim_state_dir(state_dir: Path, env_var: str) -> None:
    """Create `state_dir` with its marker; refuse a foreign one, which `down` would later
    delete. `env_var` is the variable that chooses the directory (named in the error)."""
    marker = state_dir / MARKER
    if state_dir.exists() and not marker.is_file():
        if not state_dir.is_dir() or any(state_dir.iterdir()):
            raise DevStackError(
                f"{state_dir} exists and was not created by `nomadtf dev up` (no {MARKER} in it); "
                f"point {env_var} at a new directory"
            )
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)
    _write_private(marker, MARKER_TEXT)


def spawn(state_dir: Path, name: str, argv: list[str], env: dict[str, str], binary: str | None = None) -> Component:
    """Start one server in the background, its output in `<state_dir>/<name>.log`.

    `binary` is what the record names (default argv[0]); it differs when argv[0] is a
    launcher that execs it in place (`ip netns exec NS nomad ...`: same PID)."""
    log = state_dir / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=state_dir,
            # Its own session: Ctrl-C in the shell that ran `up` does not stop it.
            start_new_session=True,
        )
    return Component(
        name=name, pid=proc.pid, binary=binary or argv[0], log=str(log), create_time=processes.started_at(proc.pid)
    )


def configure_openbao(root_token: str, address: str = VAULT_ADDR, verify: bool | str = True) -> str:
    """Policy + token role for Nomad, KV v2 at secret/. Returns Nomad's server token.

    Uses: PUT /v1/sys/policies/acl/nomad-server, POST /v1/auth/token/roles/nomad-cluster,
    POST /v1/auth/token/create-orphan
    """
    import hvac

    client = hvac.Client(url=address, token=root_token, verify=verify)
    client.sys.create_or_update_policy("nomad-server", NOMAD_SERVER_POLICY)
    client.adapter.post("/v1/auth/token/roles/nomad-cluster", json=NOMAD_CLUSTER_ROLE)
    mounts = client.sys.list_mounted_secrets_engines()["data"]
    if "secret/" not in mounts:
        client.sys.enable_secrets_engine("kv", path="secret", options={"version": "2"})
    created = client.auth.token.create_orphan(policies=["nomad-server"], period="72h")
    return created["auth"]["client_token"]


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_", "NOMAD_", "CONSUL_"))}
    interpreter_bin = str(Path(sys.executable).parent)
    env["PATH"] = interpreter_bin + os.pathsep + env.get("PATH", "")
    return env


def _write_private(path: Path, text: str) -> None:
    # Written aside and renamed: a concurrent reader (another `up`, `status`) never sees
    # half a stack.json.
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(partial, path)


def wait_for(check: Callable[[], bool], timeout: float, component: str, log: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    # A failed `up` removes its state, log included: the error carries the log's end.
    raise DevStackError(f"{component} did not become healthy within {timeout:.0f}s; the end of its log ({log}):\n{_tail(log)}")


def _tail(path: str, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "  (no log)"
    return "\n".join(f"  {line}" for line in text) or "  (empty)"


def _consul_leader(address: str = CONSUL_ADDR) -> bool:
    # GET /v1/status/leader
    return bool(requests.get(f"http://{address}/v1/status/leader", timeout=2).json())


def _openbao_ready(address: str = VAULT_ADDR) -> bool:
    # GET /v1/sys/health answers 200 only when initialized, unsealed and active
    return requests.get(f"{address}/v1/sys/health", timeout=2).status_code == 200


def _nomad_client_ready(gpus: int = 0) -> bool:
    # GET /v1/nodes?resources=true ; drivers healthy and, with fake GPUs, every one fingerprinted
    nodes = requests.get(f"{NOMAD_ADDR}/v1/nodes", params={"resources": "true"}, timeout=2).json()
    for node in nodes:
        if node.get("Status") != "ready":
            continue
        drivers = node.get("Drivers") or {}
        if drivers.get("raw_exec", {}).get("Healthy") and node_gpu_count(node) >= gpus:
            return True
    return False


def node_gpu_count(node: dict) -> int:
    """GPUs a node offers (its NodeResources' nvidia/gpu device groups)."""
    devices = ((node.get("NodeResources") or {}).get("Devices")) or []
    return sum(len(d.get("Instances") or []) for d in devices if d.get("Vendor") == "nvidia" and d.get("Type") == "gpu")


def _unmount_under(root: Path) -> None:
    """Detach every mount below `root` (deepest first). umount2(MNT_DETACH) via libc."""
    import ctypes

    root_s = str(root.resolve())
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[1].replace("\\040", " ") for line in lines if len(line.split()) > 1]
    inside = sorted((p for p in points if p == root_s or p.startswith(root_s + "/")), key=len, reverse=True)
    if not inside:
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for point in inside:
        if libc.umount2(point.encode(), 2) != 0:  # 2 = MNT_DETACH
            raise DevStackError(f"cannot unmount {point} (errno {ctypes.get_errno()}); unmount it and retry")


def _remove_tree(path: Path) -> None:
    # Called after _unmount_under, which detached what Nomad mounted here (as root, a tmpfs
    # for each task's secrets/ and private/; raw_exec adds no chroot or bind mounts), so
    # only read-only files remain in the way: a recursive delete that makes them writable.
    import shutil

    def fix(func, p, _exc):  # noqa: ANN001 - shutil's onerror signature
        os.chmod(p, 0o700)
        func(p)

    shutil.rmtree(path, onerror=fix)
