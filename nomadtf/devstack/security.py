"""ACLs and TLS for the several-client stack (`nomadtf dev up --clients N --secure`): what
it is configured with. Pure but for the files it writes; `bootstrap.py` makes the servers
match (ACL tokens, OpenBao's init and engines).

What a production cluster has, made small: one CA (`tls.py`) signs every agent
certificate; Consul (default deny) and Nomad have ACLs bootstrapped with management tokens
the stack generates; OpenBao runs as a real server (in-memory storage, TLS listener),
initialised and unsealed by `up`; its Consul secrets engine can mint per-job Consul tokens
(`nomadtf acl apply`). Every secret lives in `<state>/secure/` (0700): `tokens.json` (0600)
and the keys (0600). Nothing here prints a token.

    <state>/secure/tls/ca.pem           the CA every client of the stack needs
    <state>/secure/tls/<agent>.pem      certificates (0644) and keys (-key.pem, 0600)
    <state>/secure/tokens.json          management tokens, gossip keys, the unseal key

Usage:
    secure = SecureState.create(state_dir / "secure", server_ip, client_ips)
    secure.machine("client", 2)        # wiring.Security for client-2's agents
    secure.tokens().nomad_management   # the operator's Nomad token
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from nomadtf.devstack import tls, wiring
from nomadtf.devstack.record import write_private
from nomadtf.errors import DevStackError

# The Consul policies of the stack's own agents (never a task's: see nomadtf/job/acl.py), in
# Consul's JSON form of rules (what py-consul sends).
CONSUL_POLICIES: dict[str, dict[str, Any]] = {
    # Every agent registers its node and reads the catalog.
    "nomadtf-dev-agent": {"node_prefix": {"": {"policy": "write"}}, "service_prefix": {"": {"policy": "read"}}},
    # Nomad registers the jobs' services and renders their templates with this one.
    "nomadtf-dev-nomad": {
        "agent_prefix": {"": {"policy": "read"}},
        "node_prefix": {"": {"policy": "read"}},
        "service_prefix": {"": {"policy": "write"}},
        "key_prefix": {"": {"policy": "read"}},
    },
    # OpenBao's Consul secrets engine creates and revokes the tasks' tokens.
    "nomadtf-dev-openbao": {"acl": "write"},
}


@dataclass(frozen=True)
class Tokens:
    consul_management: str
    consul_agent: str
    consul_nomad: str
    consul_openbao: str
    nomad_management: str
    consul_gossip: str
    nomad_gossip: str
    openbao_root: str = ""
    openbao_unseal: str = ""

    def consul_policy_secrets(self) -> dict[str, str]:
        """Each policy of CONSUL_POLICIES -> the SecretID of the token that carries it."""
        return {
            "nomadtf-dev-agent": self.consul_agent,
            "nomadtf-dev-nomad": self.consul_nomad,
            "nomadtf-dev-openbao": self.consul_openbao,
        }


def _uuid() -> str:
    return str(uuid.uuid4())


def _gossip_key() -> str:
    return base64.b64encode(secrets.token_bytes(32)).decode()


class SecureState:
    """The CA, certificates and tokens of one secure stack, in `folder`."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.tls_dir = folder / "tls"
        self.tokens_path = folder / "tokens.json"

    @classmethod
    def create(cls, folder: Path, server_ip: str, client_ips: Sequence[str]) -> SecureState:
        """A new CA in `folder`, a certificate for each agent of the server machine at
        `server_ip` and of client I at client_ips[I-1] (each also for 127.0.0.1 and
        localhost, where a machine's own tasks reach its agents), fresh tokens and gossip keys."""
        state = cls(folder)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca = tls.make_ca(state.tls_dir)
        local = ["127.0.0.1"]
        tls.issue(ca, state.tls_dir, "nomad-server", dns=["server.global.nomad", "localhost"], ips=[server_ip, *local])
        tls.issue(ca, state.tls_dir, "consul-server", dns=["server.dc1.consul", "localhost"], ips=[server_ip, *local])
        tls.issue(ca, state.tls_dir, "openbao", dns=["localhost"], ips=[server_ip, *local])
        for i, ip in enumerate(client_ips, start=1):
            tls.issue(ca, state.tls_dir, f"nomad-client-{i}", dns=["client.global.nomad", "localhost"], ips=[ip, *local])
            tls.issue(ca, state.tls_dir, f"consul-client-{i}", dns=["client.dc1.consul", "localhost"], ips=[ip, *local])
        tokens = Tokens(
            consul_management=_uuid(), consul_agent=_uuid(), consul_nomad=_uuid(), consul_openbao=_uuid(),
            nomad_management=_uuid(), consul_gossip=_gossip_key(), nomad_gossip=_gossip_key(),
        )
        state.save(tokens)
        return state

    def exists(self) -> bool:
        return self.tokens_path.is_file()

    def tokens(self) -> Tokens:
        try:
            return Tokens(**json.loads(self.tokens_path.read_text()))
        except OSError as exc:
            raise DevStackError(f"the secure stack's tokens are missing ({self.tokens_path}); run `nomadtf dev up` again") from exc

    def save_openbao(self, root_token: str, unseal_key: str) -> Tokens:
        """Keep what OpenBao's init returned (its root token, its one unseal key)."""
        tokens = replace(self.tokens(), openbao_root=root_token, openbao_unseal=unseal_key)
        self.save(tokens)
        return tokens

    def save(self, tokens: Tokens) -> None:
        write_private(self.tokens_path, json.dumps(asdict(tokens), indent=2))

    @property
    def ca_file(self) -> Path:
        """The CA certificate, in a directory of its own: the one a docker task mounts (the
        client's host volume nomadtf-ca), without the agents' private keys beside it."""
        public = self.folder / "ca" / "ca.pem"
        if not public.is_file() and (self.tls_dir / "ca.pem").is_file():
            public.parent.mkdir(mode=0o755, exist_ok=True)
            public.write_bytes((self.tls_dir / "ca.pem").read_bytes())
            public.chmod(0o644)
        return public

    def pair(self, name: str) -> tuple[Path, Path]:
        return self.tls_dir / f"{name}.pem", self.tls_dir / f"{name}-key.pem"

    def machine(self, kind: str, index: int = 0) -> wiring.Security:
        """What the agents of the server machine or of client `index` are configured with."""
        tokens = self.tokens()
        suffix = "server" if kind == "server" else f"client-{index}"
        return wiring.Security(
            ca_file=self.ca_file,
            nomad_cert=self.pair(f"nomad-{suffix}"),
            consul_cert=self.pair(f"consul-{suffix}"),
            consul_agent_token=tokens.consul_agent,
            nomad_consul_token=tokens.consul_nomad,
            consul_gossip_key=tokens.consul_gossip,
            nomad_gossip_key=tokens.nomad_gossip if kind == "server" else "",
            consul_management_token=tokens.consul_management if kind == "server" else "",
        )


def openbao_config(address: str, cert: tuple[Path, Path]) -> str:
    """A real (not -dev) OpenBao server: in-memory storage (a dev stack keeps nothing), one
    TLS listener on `address`; it starts sealed and uninitialised."""
    return f"""
storage "inmem" {{}}

listener "tcp" {{
  address       = {wiring.hcl_string(address)}
  tls_cert_file = {wiring.hcl_string(str(cert[0]))}
  tls_key_file  = {wiring.hcl_string(str(cert[1]))}
}}

api_addr = {wiring.hcl_string("https://" + address)}
ui       = false
"""
