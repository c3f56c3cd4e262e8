"""ACLs and TLS for the several-client stack (`nomadtf dev up --clients N --secure`).

What a production cluster has, made small: one CA (`tls.py`) signs every agent
certificate; Consul (default deny) and Nomad have ACLs bootstrapped with management tokens
the stack generates; OpenBao runs as a real server (file storage, TLS listener),
initialised and unsealed here; its Consul secrets engine can mint per-job Consul tokens
(`nomadtf acl apply`). Every secret lives in `<state>/secure/` (0700): `tokens.json` (0600)
and the keys (0600). Nothing here prints a token.

    <state>/secure/tls/ca.pem           the CA every client of the stack needs
    <state>/secure/tls/<agent>.pem      certificates (0644) and keys (-key.pem, 0600)
    <state>/secure/tokens.json          management tokens, gossip keys, the unseal key

Usage:
    secure = SecureState.create(state_dir / "secure", server_ip, client_ips)
    secure.machine("client", 2)        # wiring.Security for client-2's agents
    api = secure.api()                 # requests.Session: CA + management tokens
    consul_acl_bootstrap(api, consul_url, secure)
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from nomadtf.devstack import tls, wiring
from nomadtf.devstack.stack import _write_private
from nomadtf.errors import DevStackError

# The Consul policies the stack's own agents get (never a task's: see nomadtf/acl.py).
CONSUL_AGENT_POLICY = """
node_prefix "" { policy = "write" }
service_prefix "" { policy = "read" }
"""
# Nomad registers the jobs' services and renders their templates with this one.
CONSUL_NOMAD_POLICY = """
agent_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }
service_prefix "" { policy = "write" }
key_prefix "" { policy = "read" }
"""
# OpenBao's Consul secrets engine creates and revokes the tasks' tokens.
CONSUL_OPENBAO_POLICY = """
acl = "write"
"""


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

    def save(self, tokens: Tokens) -> None:
        _write_private(self.tokens_path, json.dumps(asdict(tokens), indent=2))

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.pem"

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

    def api(self) -> requests.Session:
        """HTTPS to the stack: the CA, and the management token of each server in its header."""
        tokens = self.tokens()
        session = requests.Session()
        session.verify = str(self.ca_file)
        # Otherwise REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from the environment replace the
        # session's CA on every request (requests' precedence), and our CA is never used.
        session.trust_env = False
        session.headers.update(
            {
                "X-Nomad-Token": tokens.nomad_management,
                "X-Consul-Token": tokens.consul_management,
                "X-Vault-Token": tokens.openbao_root,
            }
        )
        return session


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


def _check(resp: requests.Response, what: str) -> requests.Response:
    if resp.status_code >= 400:
        # The body of an ACL call may echo a token: name the call and the status only.
        raise DevStackError(f"{what} failed: HTTP {resp.status_code}")
    return resp


def openbao_initialised(api: requests.Session, url: str) -> bool:
    """GET /v1/sys/health answers 501 while uninitialised, 503 sealed, 200 active."""
    return api.get(f"{url}/v1/sys/health", timeout=2).status_code in (200, 501, 503)


def openbao_init(api: requests.Session, url: str, state: SecureState) -> str:
    """Initialise (one key share) and unseal; the root token and unseal key go to tokens.json.

    PUT /v1/sys/init ; PUT /v1/sys/unseal
    """
    tokens = state.tokens()
    if not tokens.openbao_root:
        body = _check(api.put(f"{url}/v1/sys/init", json={"secret_shares": 1, "secret_threshold": 1}, timeout=30), "openbao init").json()
        tokens = Tokens(**{**asdict(tokens), "openbao_root": body["root_token"], "openbao_unseal": body["keys_base64"][0]})
        state.save(tokens)
    _check(api.put(f"{url}/v1/sys/unseal", json={"key": tokens.openbao_unseal}, timeout=30), "openbao unseal")
    api.headers["X-Vault-Token"] = tokens.openbao_root
    return tokens.openbao_root


def consul_acl_setup(api: requests.Session, url: str, state: SecureState) -> None:
    """The stack's own Consul tokens, with the SecretIDs the agents were configured with.

    PUT /v1/acl/policy ; PUT /v1/acl/token
    """
    tokens = state.tokens()
    for name, rules, secret in (
        ("nomadtf-dev-agent", CONSUL_AGENT_POLICY, tokens.consul_agent),
        ("nomadtf-dev-nomad", CONSUL_NOMAD_POLICY, tokens.consul_nomad),
        ("nomadtf-dev-openbao", CONSUL_OPENBAO_POLICY, tokens.consul_openbao),
    ):
        _check(api.put(f"{url}/v1/acl/policy", json={"Name": name, "Rules": rules}, timeout=10), f"consul policy {name}")
        _check(
            api.put(
                f"{url}/v1/acl/token",
                json={"SecretID": secret, "Description": f"{name} (nomadtf dev stack)", "Policies": [{"Name": name}]},
                timeout=10,
            ),
            f"consul token for {name}",
        )


def nomad_acl_bootstrap(api: requests.Session, url: str, state: SecureState) -> None:
    """Bootstrap Nomad's ACLs with the management token the stack chose.

    POST /v1/acl/bootstrap
    """
    secret = state.tokens().nomad_management
    resp = api.post(f"{url}/v1/acl/bootstrap", json={"BootstrapSecret": secret}, timeout=10)
    if resp.status_code == 400 and "already done" in resp.text.lower():
        return
    _check(resp, "nomad acl bootstrap")


def openbao_consul_engine(api: requests.Session, vault_url: str, consul_address: str, state: SecureState) -> None:
    """Mount OpenBao's Consul secrets engine at consul/, talking to Consul over HTTPS.

    POST /v1/sys/mounts/consul ; POST /v1/consul/config/access
    """
    mounts = _check(api.get(f"{vault_url}/v1/sys/mounts", timeout=10), "openbao mounts").json()
    if "consul/" not in (mounts.get("data") or mounts):
        _check(api.post(f"{vault_url}/v1/sys/mounts/consul", json={"type": "consul"}, timeout=10), "mount consul engine")
    _check(
        api.post(
            f"{vault_url}/v1/consul/config/access",
            json={
                "address": consul_address,
                "scheme": "https",
                "token": state.tokens().consul_openbao,
                "ca_cert": state.ca_file.read_text(),
            },
            timeout=10,
        ),
        "configure the consul engine",
    )
