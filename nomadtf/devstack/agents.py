"""Starting the stacks' servers and agents: the command line and environment of each, and
the one way they are started (`spawn`: in the background, in a session of their own, the
output in `<state>/<name>.log`, recorded by PID and start time).

Secrets never go on a command line, where `ps` shows them: the OpenBao dev root token and
Nomad's Vault token go through the environment; agent configs that hold tokens or gossip
keys are written 0600.

Usage:
    consul = start_consul_dev(state_dir, consul_binary)              # the single-node stack
    agent = start_consul(state_dir, "consul-client-2", binary, machine, namespace="ntf-c2")
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nomadtf.devstack import processes, wiring
from nomadtf.devstack.record import Component, write_private

# The single-node stack's agents bind here only: the several-client stack's server machine
# binds 198.18.0.1 (netns.SERVER_IP), so both run side by side.
HOST = "127.0.0.1"


def base_env() -> dict[str, str]:
    """The environment every server starts with: this one without any VAULT_, BAO_, NOMAD_
    or CONSUL_ variable (the caller's shell may point at another cluster), and this
    interpreter's bin directory first on PATH: raw_exec tasks inherit it from the Nomad
    client, so `python3 -m nomadtf` in them finds this installation."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_", "NOMAD_", "CONSUL_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def spawn(
    state_dir: Path,
    name: str,
    argv: list[str],
    env: dict[str, str],
    namespace: str | None = None,
    join_pid: int | None = None,
    host_sys: bool = False,
) -> Component:
    """Start one server in the background, its output in `<state_dir>/<name>.log`; in the
    network namespace `namespace` when given (`ip netns exec` execs it in place: the PID
    recorded is the server's, and the record names the server's binary).

    `host_sys`: in `namespace` with a mount namespace of its own that keeps the host's /sys
    (`ip netns exec` mounts a fresh sysfs over it, which hides /sys/fs/cgroup: dockerd then
    refuses to start). `join_pid`: in the network and mount namespaces of that process
    (`nsenter`, in place too): a Nomad client and its Docker daemon must see the same
    mounts, or the task directories Nomad mounts (secrets/ is a tmpfs) are empty in the
    containers. Mounts made in either stay out of the host's mount table."""
    log = state_dir / f"{name}.log"
    if join_pid is not None:
        launcher = ["nsenter", f"--target={join_pid}", "--mount", "--net", "--"]
    elif namespace and host_sys:
        launcher = ["unshare", "--mount", "--propagation", "slave", "nsenter", f"--net=/run/netns/{namespace}", "--"]
    else:
        launcher = ["ip", "netns", "exec", namespace] if namespace else []
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*launcher, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=state_dir,
            # Its own session: Ctrl-C in the shell that ran `up` does not stop it.
            start_new_session=True,
        )
    return Component(name=name, pid=proc.pid, binary=argv[0], log=str(log), create_time=processes.started_at(proc.pid),
                     start=processes.start_mark(proc.pid))


# ---- the single-node stack: -dev agents on 127.0.0.1 -----------------------------------------


def start_consul_dev(state_dir: Path, binary: Path) -> Component:
    """`consul agent -dev` on 127.0.0.1 (in memory: a restart forgets its catalog and KV)."""
    argv = [str(binary), "agent", "-dev", "-bind", HOST, "-client", HOST, "-node", "nomadtf-dev",
            "-hcl", f"limits {{ http_max_conns_per_client = {wiring.CONSUL_MAX_CONNS_PER_CLIENT} }}"]  # fmt: skip
    return spawn(state_dir, "consul", argv, base_env())


def start_openbao_dev(state_dir: Path, binary: Path, listen: str, root_token: str) -> Component:
    """`bao server -dev` on `listen` (host:port) with `root_token` as its root token:
    initialised, unsealed, in memory."""
    argv = [str(binary), "server", "-dev", f"-dev-listen-address={listen}"]
    env = {**base_env(), "BAO_DEV_ROOT_TOKEN_ID": root_token, "VAULT_DEV_ROOT_TOKEN_ID": root_token}
    return spawn(state_dir, "openbao", argv, env)


def start_nomad_dev(state_dir: Path, binary: Path, config: Path, vault_token: str) -> Component:
    """`nomad agent -dev` (server and client in one) on 127.0.0.1 with `config`. Nomad reads
    its Vault token from VAULT_TOKEN, and its client keeps that variable out of every task's
    environment (env.denylist's default)."""
    argv = [str(binary), "agent", "-dev", "-bind", HOST, "-config", str(config)]
    return spawn(state_dir, "nomad", argv, {**base_env(), "VAULT_TOKEN": vault_token})


# ---- the several-client stack: agents of one machine each ------------------------------------


def start_consul(state_dir: Path, name: str, binary: Path, machine: wiring.Machine, namespace: str | None = None) -> Component:
    """Write `machine`'s Consul config (consul.json in its folder, 0600) and start its agent."""
    config = machine.state_dir / "consul.json"
    write_private(config, wiring.consul_config(machine))
    return spawn(state_dir, name, [str(binary), "agent", "-config-file", str(config)], base_env(), namespace)


def start_nomad(
    state_dir: Path,
    name: str,
    binary: Path,
    machine: wiring.Machine,
    vault_token: str | None = None,
    namespace: str | None = None,
    join_pid: int | None = None,
) -> Component:
    """Write `machine`'s Nomad config (nomad.hcl in its folder, 0600) and start its agent; a
    server gets its Vault token in VAULT_TOKEN. `join_pid`: see `spawn`."""
    config = machine.state_dir / "nomad.hcl"
    write_private(config, wiring.nomad_config(machine))
    env = {**base_env(), "VAULT_TOKEN": vault_token} if vault_token else base_env()
    return spawn(state_dir, name, [str(binary), "agent", "-config", str(config)], env, namespace, join_pid)


def start_openbao(state_dir: Path, binary: Path, config_text: str) -> Component:
    """A real (not -dev) OpenBao server with `config_text` as its config
    (`<state>/openbao/openbao.hcl`): it starts sealed and uninitialised."""
    folder = state_dir / "openbao"
    folder.mkdir(mode=0o700, exist_ok=True)
    config = folder / "openbao.hcl"
    write_private(config, config_text)
    return spawn(state_dir, "openbao", [str(binary), "server", f"-config={config}"], base_env())
