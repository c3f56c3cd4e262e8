"""What every local stack offers, whichever it is: the single-node `DevStack` (stack.py) and
the several-client `ClusterStack` (cluster.py) are both a `Stack`, so the CLI and the test
fixtures never ask which one they hold (testcontainers' model: each service a class on one
base with start, stop and its connection URL).

    up(progress, ...)    start it (False: it was up already, a no-op)
    down(progress)       stop everything it started and remove its state
    is_up()              every recorded process runs
    status()             a row per process, never a token
    env()                the shell variables that point nomad, consul, bao and nomadtf at it
    api()                where its three servers answer and how to authenticate: a StackApi

Usage:
    api = stack.api()
    api.nomad().nodes.get_nodes()                 # python-nomad
    api.consul().kv.get("nomadtf/")               # py-consul
    api.vault().secrets.kv.v2.read_secret("x")    # hvac
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import consul
import hvac
import nomad
import requests

# How a long step reports what it does: one line at a time (the CLI stamps and prints it).
Progress = Callable[[str], None]

# The region and namespace every stack's Nomad has (Nomad's defaults): named on each call, so
# NOMAD_REGION / NOMAD_NAMESPACE of the caller's shell (which python-nomad reads) never apply.
NOMAD_REGION = "global"
NOMAD_NAMESPACE = "default"


@dataclass(frozen=True)
class StackApi:
    """Where a stack's Nomad, Consul and OpenBao answer, and the operator's credentials:
    the CA that signed them (None: plain HTTP) and a management token for each (None: a
    stack without ACLs). The clients it makes are the project's client libraries, with
    exactly these settings: nothing comes from the caller's environment."""

    nomad_url: str
    consul_url: str
    vault_url: str
    ca_file: str | None = None
    nomad_token: str | None = None
    consul_token: str | None = None
    vault_token: str | None = field(default=None, repr=False)

    @property
    def urls(self) -> dict[str, str]:
        """{"nomad", "consul", "vault"}: the three base URLs."""
        return {"nomad": self.nomad_url, "consul": self.consul_url, "vault": self.vault_url}

    @property
    def verify(self) -> bool | str:
        """What TLS trusts: the stack's CA, or the system's."""
        return self.ca_file or True

    def nomad(self, address: str | None = None, timeout: float = 10.0) -> nomad.Nomad:
        """python-nomad for the Nomad server, or for the agent at `address` (a client's own
        HTTP API, e.g. https://198.18.0.11:4646)."""
        session = requests.Session()
        session.trust_env = False  # no proxy and no REQUESTS_CA_BUNDLE between us and the stack
        return nomad.Nomad(
            address=address or self.nomad_url,
            token=self.nomad_token,
            region=NOMAD_REGION,
            namespace=NOMAD_NAMESPACE,
            verify=self.verify,  # python-nomad's own default is not to verify
            timeout=timeout,
            session=session,
        )

    def consul(self, timeout: float = 10.0) -> consul.Consul:
        """py-consul for the Consul server."""
        parts = urlsplit(self.consul_url)
        client = consul.Consul(host=parts.hostname, port=parts.port, scheme=parts.scheme, verify=self.verify)
        client.http.connections_timeout = timeout
        client.http.session.trust_env = False
        client.token = self.consul_token  # set after: py-consul prefers CONSUL_HTTP_TOKEN to its argument
        return client

    def vault(self, timeout: float = 30.0) -> hvac.Client:
        """hvac for OpenBao (Vault's API)."""
        session = requests.Session()
        session.trust_env = False
        # hvac takes a given session's `verify` over its own argument (hvac issue 991).
        session.verify = self.verify
        # token "" rather than None: hvac would read VAULT_TOKEN from the environment.
        return hvac.Client(url=self.vault_url, token=self.vault_token or "", verify=self.verify, timeout=timeout, session=session)

    def session(self) -> requests.Session:
        """Plain HTTP(S) to the stack as its operator: the CA, and each server's management
        token in its header. For a caller that reaches endpoints without a client library
        (the tests do, to look at the servers as `curl` would)."""
        session = requests.Session()
        session.verify = self.verify
        # Otherwise REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE from the environment replace the
        # session's CA on every request (requests' precedence), and our CA is never used.
        session.trust_env = False
        headers = {"X-Nomad-Token": self.nomad_token, "X-Consul-Token": self.consul_token, "X-Vault-Token": self.vault_token}
        session.headers.update({name: value for name, value in headers.items() if value})
        return session


@dataclass(frozen=True)
class StatusRow:
    """One process of a stack as `status` shows it. `node`: for a Nomad client agent, its
    node's status as the servers see it (ready, down, initializing, unknown), "" for the
    other agents of a stack with several clients, None where there are no nodes to show;
    `gpus`: a Nomad client's fake GPUs."""

    component: str
    state: str  # running | stopped
    pid: int
    address: str
    log: str
    node: str | None = None
    gpus: int | None = None

    @property
    def healthy(self) -> bool:
        return self.state == "running" and self.node in (None, "", "ready")


@dataclass(frozen=True)
class Status:
    """A stack's processes, a line about the whole stack to show before them (`heading`)
    and one to show after (`footer`)."""

    rows: tuple[StatusRow, ...] = ()
    heading: str | None = None
    footer: str | None = None


class Stack(Protocol):
    """A local Nomad + Consul + OpenBao stack (see the module's docstring)."""

    title: str  # what the CLI calls it: "local stack", "several-client stack"
    env_command: str  # the command whose output points a shell at it
    state_dir: Path

    def up(
        self,
        progress: Progress,
        *,
        timeout: float = ...,
        gpus: int | None = None,
        clients: int = ...,
        gpu_clients: Sequence[int] | None = None,
        secure: bool = False,
        docker: bool | None = None,
        mig: int | None = None,
    ) -> bool: ...

    def down(self, progress: Progress, grace: float = 15.0) -> None: ...

    def is_up(self) -> bool: ...

    def status(self) -> Status: ...

    def env(self) -> dict[str, str]: ...

    def api(self) -> StackApi: ...

    # `up --docker`: its docker.Daemon, or one per client; else none. (Not named in the
    # annotation: docker.py imports this module.)
    def docker_daemons(self) -> list: ...
