"""The controller's own Nomad service job (`nomadtf admission deploy`, `nomadtf dev up`). Pure.

Usage:
    api.register(service_job(python="/opt/venv/bin/python", env=service_env(os.environ), tokens=True))
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from nomadtf import wire

if TYPE_CHECKING:
    from nomadtf.job.answers import JobWrite
    from nomadtf.servers.nomad import NomadAPI

METRICS_SERVICE = wire.ADMISSION_SERVICE_JOB  # the Nomad service (provider "nomad") of the replicas' metrics ports
SERVICE_TOKENS_VAR = f"nomad/jobs/{wire.ADMISSION_SERVICE_JOB}"  # its tasks may read it (workload identity)
# Where `deploy --tokens` finds the controller's own tokens (item of the variable -> variable name).
CONTROLLER_TOKEN_ENV = {"nomad_token": "NOMADTF_CONTROLLER_NOMAD_TOKEN", "consul_token": "NOMADTF_CONTROLLER_CONSUL_TOKEN"}


def service_job(
    count: int = 2,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    namespace: str = wire.DEFAULT_NAMESPACE,
    datacenters: tuple[str, ...] = ("*",),
    clients: int = 0,
    tokens: bool = False,
    node_pool: str = "",
) -> dict[str, Any]:
    """The Nomad service job of the admission controller (the body of POST /v1/jobs). Pure.

    `python`: the interpreter on the clients that has nomadtf installed (default: this one;
    then the task also gets this process's PYTHONPATH, so a checkout deploys its own code).
    `env`: what the replicas need to reach Nomad and Consul (addresses, never tokens).
    `clients`: the eligible client nodes (0: unknown), for where the replicas go.
    `tokens`: the replicas read their Nomad and Consul tokens from the Nomad variable
    SERVICE_TOKENS_VAR (`deploy --tokens` writes it), rendered into their environment by a
    template: a job's tasks may read their own job's variables through their workload
    identity, so no token is written into the job itself.
    `node_pool`: the operator's pool where no team's code runs (docs/operations/threat-model.md)."""
    environment = dict(env or {})
    if python is None:
        import nomadtf

        python = sys.executable
        environment.setdefault("PYTHONPATH", str(Path(nomadtf.__file__).resolve().parent.parent))
    task = {
        "Name": "admission",
        "Driver": "raw_exec",
        "Config": {"command": python, "args": ["-m", "nomadtf", "admission", "serve", "--metrics-port", "${NOMAD_PORT_metrics}",
                                               "--metrics-address", "${NOMAD_IP_metrics}"]},  # fmt: skip
        "Env": environment,
        "Resources": {"CPU": 100, "MemoryMB": 128},
        "KillTimeout": 5_000_000_000,
    }
    if tokens:
        task["Templates"] = [
            {
                "EmbeddedTmpl": (
                    f'{{{{ with nomadVar "{SERVICE_TOKENS_VAR}" }}}}'
                    "NOMAD_TOKEN={{ .nomad_token }}\nCONSUL_HTTP_TOKEN={{ .consul_token }}\n{{ end }}"
                ),
                "DestPath": "secrets/tokens.env",
                "Envvars": True,
                "ChangeMode": "restart",  # new tokens: the replica starts again with them
            }
        ]
    group = {
        "Name": "admission",
        "Count": count,
        "Tasks": [task],
        # Each replica's metrics (admission/metrics.py), found through Nomad's own service
        # catalogue (a Prometheus `nomad_sd_configs` job): no Consul rights needed to register.
        "Networks": [{"DynamicPorts": [{"Label": "metrics"}]}],
        "Services": [{"Name": METRICS_SERVICE, "PortLabel": "metrics", "Provider": "nomad", "Tags": ["metrics"]}],
        "RestartPolicy": {"Attempts": 10, "Interval": 600_000_000_000, "Delay": 2_000_000_000, "Mode": "delay"},
    }
    # A standby on its leader's client dies with it. distinct_hosts keeps the replicas on
    # different clients, but it is a hard constraint: with fewer clients than replicas Nomad
    # leaves the rest unplaced (blocked), so a one-client cluster could not deploy two. There
    # (or when the nodes could not be counted) a spread asks for distinct clients where it
    # can and still places every replica.
    if count > 1 and clients >= count:
        group["Constraints"] = [{"Operand": "distinct_hosts", "RTarget": "true"}]
    elif count > 1:
        group["Spreads"] = [{"Attribute": "${node.unique.id}", "Weight": 100}]
    return {
        "Job": {
            "ID": wire.ADMISSION_SERVICE_JOB,
            "Name": wire.ADMISSION_SERVICE_JOB,
            "Type": "service",
            "Namespace": namespace,
            "Datacenters": list(datacenters),
            "Priority": 90,
            "Meta": {wire.META_SERVICE: "admission"},
            "TaskGroups": [group],
            **({"NodePool": node_pool} if node_pool else {}),
        }
    }


def service_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The deployer's way to Nomad and Consul, for the replicas (no tokens)."""
    names = ("NOMAD_ADDR", "NOMAD_REGION", "NOMAD_CACERT", "NOMAD_TLS_SERVER_NAME", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "CONSUL_CACERT")
    return {name: environ[name] for name in names if environ.get(name)}


def deploy(
    api: NomadAPI,
    count: int = 2,
    python: str | None = None,
    tokens: bool = False,
    environ: Mapping[str, str] | None = None,
    on_event: Callable[[str], None] = lambda line: None,
    node_pool: str = "",
) -> JobWrite:
    """Register the controller's service job in `api`'s namespace (with `api`'s token: an
    operator's); with `tokens`, first write the controller's own tokens to SERVICE_TOKENS_VAR:
    CONTROLLER_TOKEN_ENV from `environ` (made from the controller's policies), never the
    operator's.

    GET /v1/nodes (how many clients, for where the replicas go) ; PUT /v1/var/... ; POST /v1/jobs"""
    from nomadtf.client.placement import readable_nodes
    from nomadtf.errors import SpecError

    environ = dict(environ or {})
    # Not countable with this token (0): the replicas are spread, not bound apart.
    clients = len(readable_nodes(api, {"Datacenters": ["*"], **({"NodePool": node_pool} if node_pool else {})})[0])
    if tokens:
        missing = [name for name in CONTROLLER_TOKEN_ENV.values() if not environ.get(name)]
        if missing:
            raise SpecError(
                f"--tokens: {' and '.join(missing)} not set: make a Nomad and a Consul token from the admission controller's "
                "policies (nomadtf acl policies JOB prints them) and export them under these names"
            )
        api.put_variable(SERVICE_TOKENS_VAR, {key: environ[name] for key, name in CONTROLLER_TOKEN_ENV.items()})
        on_event(f"wrote the replicas' tokens to the Nomad variable {SERVICE_TOKENS_VAR} in namespace {api.namespace}")
    job = service_job(count, python, service_env(environ), namespace=api.namespace, clients=clients, tokens=tokens, node_pool=node_pool)
    registered = api.register(job)
    pool = f", node pool {node_pool}" if node_pool else ""
    on_event(f"deployed {wire.ADMISSION_SERVICE_JOB} ({count} replicas) in namespace {api.namespace}{pool} (evaluation {registered.eval_id[:8]})")
    return registered
