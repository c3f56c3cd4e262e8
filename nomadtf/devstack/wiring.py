"""The agents' configuration files, as pure functions of addresses and directories.

One source for every config the project writes for Nomad and Consul: the single-node dev
agent (`stack.py`), the several-client cluster on this machine (`cluster.py`), and the same
files for real machines (`nomadtf dev config`, which `vagrant/provision.sh` runs). A
`Machine` says what one machine of such a cluster is; `nomad_config` and `consul_config`
give its two files. Nothing here reads the machine or touches a file; the callers write
the returned text.

Usage:
    text = nomad_server_config(data_dir, bind="198.18.0.1",
                               consul_address="198.18.0.1:8500", vault_address="http://198.18.0.1:8200")
    text = nomad_client_config(data_dir, name="client-1", bind="198.18.0.11", servers=["198.18.0.1:4647"],
                               network_interface="eth0", consul_address="127.0.0.1:8500",
                               vault_address="http://198.18.0.1:8200", node_class="nomadtf-client-1",
                               meta={"nomadtf_client": "1"})
    text = consul_server_config(data_dir, node_name="server", bind="198.18.0.1", client="198.18.0.1")
    text = consul_client_config(data_dir, node_name="client-1", bind="198.18.0.11", client="127.0.0.1",
                                join=["198.18.0.1"])

    client = Machine("client", "198.18.0.12", ("198.18.0.1",), Path("/var/lib/nomadtf/client-2"), index=2)
    nomad_config(client), consul_config(client)     # the two files of client-2
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nomadtf.devstack.gpu_plugin import client_plugin_hcl, hcl_string
from nomadtf.devstack.taskhost import docker_plugin_hcl, host_volume_lines, host_volumes

# The Vault token role the servers create task tokens from (bootstrap.NOMAD_CLUSTER_ROLE).
VAULT_ROLE = "nomad-cluster"
# Where a task (and its Nomad client) finds the Consul agent of its own machine.
LOCAL_CONSUL = "127.0.0.1:8500"
CONSUL_HTTP_PORT = 8500
NOMAD_RPC_PORT = 4647
VAULT_PORT = 8200

_META_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Heartbeats:
    """How fast the Nomad servers declare a silent client down.

    A client heartbeats every TTL, which the server picks in [min_ttl, 2 * min_ttl) while
    few nodes are registered; it marks the node down `grace` after a missed one, so a dead
    client is `down` within min_ttl * 2 + grace. `failover_ttl` is the TTL every node gets
    when a server becomes leader (Nomad's default, 5 minutes, would hide a client that dies
    right after a server restart).
    """

    min_ttl: str = "2s"
    grace: str = "5s"
    failover_ttl: str = "30s"


FAST_HEARTBEATS = Heartbeats()

CONSUL_HTTPS_PORT = 8501
# Every `nomadtf task` keeps about three HTTP connections to its node's Consul agent (two
# blocking watches and its session renewals), all from one address. Consul refuses more than
# 200 per client address by default (HTTP 429): about 60 tasks on one machine.
CONSUL_MAX_CONNS_PER_CLIENT = 1024


@dataclass(frozen=True)
class Security:
    """What one machine's agents need for ACLs and TLS (the secure stack, `dev up --secure`).

    `ca_file` signs every certificate; `nomad_cert`/`consul_cert` are this machine's agent
    certificates (pairs of cert and key paths); the tokens are Consul ACL tokens: the
    agent's own (node registration), the one Nomad uses for services, and on the server
    machine the management token Consul is bootstrapped with. The gossip keys encrypt Serf.
    Configs that carry tokens or keys must be written 0600 (the callers do).
    """

    ca_file: Path
    nomad_cert: tuple[Path, Path]
    consul_cert: tuple[Path, Path]
    consul_agent_token: str
    nomad_consul_token: str
    consul_gossip_key: str
    nomad_gossip_key: str = ""  # servers only
    consul_management_token: str = ""  # the server machine only


def _tls_block(security: Security) -> str:
    cert, key = security.nomad_cert
    return f"""
acl {{
  enabled = true
}}

tls {{
  http = true
  rpc  = true
  ca_file   = {hcl_string(str(security.ca_file))}
  cert_file = {hcl_string(str(cert))}
  key_file  = {hcl_string(str(key))}
  # Servers and clients prove their role by certificate name (server.global.nomad, ...).
  verify_server_hostname = true
  # API callers authenticate with ACL tokens; they need the CA, not a client certificate.
  verify_https_client = false
}}
"""


def _meta_block(meta: Mapping[str, str]) -> list[str]:
    lines = []
    for key, value in sorted(meta.items()):
        if not _META_KEY.match(key):
            raise ValueError(f"meta key {key!r} is not a plain identifier")
        lines.append(f"    {key} = {hcl_string(str(value))}")
    return ["  meta {", *lines, "  }"] if lines else []


def _raw_exec_block() -> str:
    return """
plugin "raw_exec" {
  config {
    enabled = true
  }
}
"""


def _consul_block(address: str, security: Security | None = None) -> str:
    if security is None:
        return f"""
consul {{
  address = {hcl_string(address)}
}}
"""
    return f"""
consul {{
  address    = {hcl_string(address)}
  ssl        = true
  verify_ssl = true
  ca_file    = {hcl_string(str(security.ca_file))}
  token      = {hcl_string(security.nomad_consul_token)}
}}
"""


def _vault_block(address: str | None, *, server: bool, security: Security | None = None) -> str:
    # Servers create task tokens from the role (their own token comes in VAULT_TOKEN);
    # clients only need the address to hand tokens to tasks and renew them.
    if address is None:
        return ""  # a cluster without Vault: jobs with secrets cannot be placed there
    role = f"\n  create_from_role = {hcl_string(VAULT_ROLE)}" if server else ""
    ca = f"\n  ca_file          = {hcl_string(str(security.ca_file))}" if security else ""
    return f"""
vault {{
  enabled          = true
  address          = {hcl_string(address)}{role}{ca}
}}
"""


def nomad_dev_config(data_dir: Path, bind: str, consul_address: str, vault_address: str, volumes: Mapping[str, tuple[Path, bool]] | None = None) -> str:
    """The single-node `nomad agent -dev` (server and client in one) of `nomadtf dev up`."""
    volume_lines = "\n".join(host_volume_lines(volumes or {}))
    return f"""
data_dir  = "{data_dir}"
bind_addr = "{bind}"
log_level = "INFO"

client {{
  enabled = true
  # Tasks of the dev stack see PATH of the interpreter that started it, so
  # `python3 -m nomadtf` inside raw_exec tasks finds this installation.
  # Past gc_max_allocs (default 50) the client deletes a finished allocation, logs and all,
  # the moment it ends: one 64-task job would lose its failed tasks' logs.
  gc_max_allocs = 300
{volume_lines}
}}

plugin "raw_exec" {{
  config {{
    enabled = true
  }}
}}

consul {{
  address = "{consul_address}"
}}

vault {{
  enabled          = true
  address          = "{vault_address}"
  create_from_role = "{VAULT_ROLE}"
}}

ui {{
  enabled = true
}}
"""


def _agent_header(name: str, data_dir: Path, bind: str) -> str:
    """The lines every Nomad agent of the several-client stack starts with."""
    return f"""
name      = {hcl_string(name)}
data_dir  = {hcl_string(str(data_dir))}
bind_addr = {hcl_string(bind)}
log_level = "INFO"
"""


def nomad_server_config(
    data_dir: Path,
    bind: str,
    consul_address: str,
    vault_address: str | None,
    *,
    name: str = "server",
    bootstrap_expect: int = 1,
    heartbeats: Heartbeats = FAST_HEARTBEATS,
    security: Security | None = None,
) -> str:
    """A Nomad server-only agent (no client) bound to `bind` alone; no vault block when
    `vault_address` is None; ACLs, TLS and gossip encryption with `security`."""
    gossip = f"\n  encrypt          = {hcl_string(security.nomad_gossip_key)}" if security else ""
    return (
        _agent_header(name, data_dir, bind)
        + f"""
server {{
  enabled          = true
  bootstrap_expect = {int(bootstrap_expect)}{gossip}
  # A lost client is down within seconds, not the production default of minutes.
  min_heartbeat_ttl      = {hcl_string(heartbeats.min_ttl)}
  heartbeat_grace        = {hcl_string(heartbeats.grace)}
  failover_heartbeat_ttl = {hcl_string(heartbeats.failover_ttl)}
}}

client {{
  enabled = false
}}
"""
        + (_tls_block(security) if security else "")
        + _consul_block(consul_address, security)
        + _vault_block(vault_address, server=True, security=security)
        + """
ui {
  enabled = true
}
"""
    )


def nomad_client_config(
    data_dir: Path,
    name: str,
    bind: str,
    servers: Sequence[str],
    network_interface: str,
    consul_address: str,
    vault_address: str | None,
    *,
    node_class: str = "",
    meta: Mapping[str, str] | None = None,
    extra: str = "",
    security: Security | None = None,
    volumes: Mapping[str, tuple[Path, bool]] | None = None,
) -> str:
    """A Nomad client-only agent: registers with `servers`, advertises the address of
    `network_interface` for its allocations, syncs services to its own Consul agent.
    `extra` is appended as is (e.g. `gpu_plugin.client_plugin_hcl`)."""
    client_lines = [
        "client {",
        "  enabled           = true",
        f"  servers           = [{', '.join(hcl_string(s) for s in servers)}]",
        f"  network_interface = {hcl_string(network_interface)}",
    ]
    if node_class:
        client_lines.append(f"  node_class        = {hcl_string(node_class)}")
    client_lines += _meta_block(meta or {})
    client_lines += host_volume_lines(volumes or {})
    client_lines.append("}")
    return (
        _agent_header(name, data_dir, bind)
        + "\n"
        + "\n".join(client_lines)
        + "\n"
        + _raw_exec_block()
        + (_tls_block(security) if security else "")
        + _consul_block(consul_address, security)
        + _vault_block(vault_address, server=False, security=security)
        + extra
    )


def _consul_agent(data_dir: Path, node_name: str, bind: str, client: str, security: Security | None = None) -> dict:
    config = {
        "node_name": node_name,
        "data_dir": str(data_dir),
        "bind_addr": bind,
        "advertise_addr": bind,
        "client_addr": client,
        "log_level": "INFO",
        "disable_update_check": True,
        # Nothing here speaks gRPC (no Connect); keep the ports closed.
        "ports": {"grpc": -1, "grpc_tls": -1},
        "limits": {"http_max_conns_per_client": CONSUL_MAX_CONNS_PER_CLIENT},
    }
    if security is None:
        return config
    cert, key = security.consul_cert
    tokens = {"agent": security.consul_agent_token}
    if security.consul_management_token:
        tokens["initial_management"] = security.consul_management_token
    config.update(
        # HTTPS only: the plain HTTP port is closed.
        ports={"http": -1, "https": CONSUL_HTTPS_PORT, "grpc": -1, "grpc_tls": -1},
        encrypt=security.consul_gossip_key,
        acl={"enabled": True, "default_policy": "deny", "enable_token_persistence": True, "tokens": tokens},
        tls={
            "defaults": {
                "ca_file": str(security.ca_file),
                "cert_file": str(cert),
                "key_file": str(key),
                "verify_incoming": True,
                "verify_outgoing": True,
            },
            "internal_rpc": {"verify_server_hostname": True},
            # API callers authenticate with ACL tokens; they need the CA, not a certificate.
            "https": {"verify_incoming": False},
        },
    )
    return config


def consul_server_config(
    data_dir: Path, node_name: str, bind: str, client: str, *, bootstrap_expect: int = 1, security: Security | None = None
) -> str:
    """A Consul server agent (JSON). `client` is the address its HTTP and DNS listen on."""
    config = {
        **_consul_agent(data_dir, node_name, bind, client, security),
        "server": True,
        "bootstrap_expect": int(bootstrap_expect),
        "ui_config": {"enabled": True},
        # Raft timing for one machine, as `-dev` uses: a leader within a second or two.
        "performance": {"raft_multiplier": 1},
    }
    return json.dumps(config, indent=2) + "\n"


def consul_client_config(
    data_dir: Path, node_name: str, bind: str, client: str, join: Sequence[str], *, security: Security | None = None
) -> str:
    """A Consul client agent (JSON) that joins the servers at `join` (retrying)."""
    config = {
        **_consul_agent(data_dir, node_name, bind, client, security),
        "server": False,
        "retry_join": list(join),
        "retry_interval": "1s",
        # SIGTERM means a planned stop: leave, so the catalog does not keep a failed node.
        "leave_on_terminate": True,
    }
    return json.dumps(config, indent=2) + "\n"


# ---- one machine of a several-client cluster -------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """One machine of a several-client cluster: the server machine (Consul server, Nomad
    server, OpenBao) or client `index` (a Consul client agent and a Nomad client named
    client-<index>, node_class nomadtf-client-<index>, meta nomadtf_client = "<index>" and
    nomadtf_gpu = "true" or "false").

    `servers` are the server machine's addresses (a client joins them; a server machine
    lists its own); `state_dir` holds nomad-data/ and consul-data/; Vault, when `vault`,
    runs on the first server at port 8200. `gpus` fake GPUs need `plugin_dir`.
    """

    kind: str  # "server" or "client"
    address: str
    servers: tuple[str, ...]
    state_dir: Path
    index: int = 0
    network_interface: str = "eth0"
    vault: bool = True
    gpus: int = 0
    plugin_dir: Path | None = None
    security: Security | None = None
    docker_endpoint: str | None = None  # the client's own Docker daemon (DOCKER_HOST form), for the docker driver

    def __post_init__(self) -> None:
        if self.kind not in ("server", "client"):
            raise ValueError(f"a machine is a server or a client, not {self.kind!r}")
        if self.kind == "client" and self.index < 1:
            raise ValueError(f"client index must be 1 or more, not {self.index}")
        if not self.servers:
            raise ValueError("a machine needs the address of the server machine")
        if self.gpus and (self.kind != "client" or self.plugin_dir is None):
            raise ValueError("fake GPUs are for clients, with the plugin's directory")

    @property
    def name(self) -> str:
        return "server" if self.kind == "server" else f"client-{self.index}"

    @property
    def vault_address(self) -> str | None:
        scheme = "https" if self.security else "http"
        return f"{scheme}://{self.servers[0]}:{VAULT_PORT}" if self.vault else None

    @property
    def consul_port(self) -> int:
        return CONSUL_HTTPS_PORT if self.security else CONSUL_HTTP_PORT


def nomad_config(machine: Machine) -> str:
    """The Nomad agent's HCL for `machine`."""
    data_dir = machine.state_dir / "nomad-data"
    if machine.kind == "server":
        consul = f"{machine.address}:{machine.consul_port}"
        return nomad_server_config(
            data_dir, machine.address, consul, machine.vault_address, name=machine.name, security=machine.security
        )
    extra = client_plugin_hcl(machine.plugin_dir, machine.gpus, seed=machine.name) if machine.gpus else ""
    extra += docker_plugin_hcl(machine.docker_endpoint) if machine.docker_endpoint else ""
    return nomad_client_config(
        data_dir,
        machine.name,
        machine.address,
        [f"{server}:{NOMAD_RPC_PORT}" for server in machine.servers],
        machine.network_interface,
        f"{LOCAL_CONSUL.split(':')[0]}:{machine.consul_port}",
        machine.vault_address,
        node_class=f"nomadtf-client-{machine.index}",
        # Jobs place by it: `${meta.nomadtf_gpu} = false` keeps a CPU role off the GPU clients.
        meta={"nomadtf_client": str(machine.index), "nomadtf_gpu": "true" if machine.gpus else "false"},
        extra=extra,
        security=machine.security,
        volumes=host_volumes(machine.security.ca_file.parent if machine.security else None),
    )


def consul_config(machine: Machine) -> str:
    """The Consul agent's JSON for `machine`: the server answers HTTP on its own address;
    a client's agent answers on the machine's 127.0.0.1, where its tasks look for it."""
    data_dir = machine.state_dir / "consul-data"
    if machine.kind == "server":
        return consul_server_config(data_dir, machine.name, machine.address, machine.address, security=machine.security)
    local = LOCAL_CONSUL.split(":")[0]
    return consul_client_config(data_dir, machine.name, machine.address, local, list(machine.servers), security=machine.security)
