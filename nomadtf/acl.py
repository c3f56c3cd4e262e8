"""The least-privilege ACL policies a nomadtf job needs, as text. Pure.

Four policies, one job (`nomadtf acl policies JOB`):

- **Nomad, the submitter** (one namespace): submit, read, scale and stop the job, read
  its allocations and logs, restart an allocation. Nothing in other namespaces, no node
  or agent rights.
- **Consul, the submitter**: the job's runs' state under `nomadtf/<ns>/` (what `run`,
  `status`, `scale` and `stop --purge` read and write) and service reads.
- **Consul, the job's tasks**: the job's own KV prefix, read on its own services, sessions
  (slot locks) and node reads for health queries. No service registration (Nomad registers
  the services), no other job's keys.
- **Vault, the job's tasks**: read the Consul token path and the job's secrets.

Consul scopes sessions by node, not by owner: a task can create (and destroy) sessions on
the nodes it may write sessions for. README's Security section says what that allows.

Usage:
    policies = job_policies(load_spec(Path("job.json")))
    policies.nomad_submitter, policies.consul_tasks, ...
    policy_name(spec)      # "nomadtf-<namespace>-<job>-<digest>" (wire.acl_name), what `acl apply` names them
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nomadtf import wire
from nomadtf.spec import JobSpec

# What `run`, `status`, `logs`, `scale`, `stop` and `plan` call (nomad.py names each call's
# capability in its 403 message).
NOMAD_SUBMITTER_CAPABILITIES = (
    "list-jobs",
    "read-job",
    "submit-job",
    "scale-job",
    "read-job-scaling",
    "read-logs",
    "read-fs",
    "alloc-lifecycle",
)
CONSUL_TOKEN_ROLE_TTL = "1h"
CONSUL_TOKEN_ROLE_MAX_TTL = "24h"

def policy_name(spec: JobSpec) -> str:
    """The name of the job's policies in Consul and Vault (and of its Consul engine role)."""
    return wire.acl_name(spec.namespace, spec.name)


def owner(spec: JobSpec) -> str:
    """Whose policies these are (wire.acl_owner): `acl apply` overwrites nothing without it."""
    return wire.acl_owner(spec.namespace, spec.name)


def consul_token_path(spec: JobSpec, mount: str = "consul") -> str:
    """Where the tasks read their Consul token: the job's role of a Consul secrets engine."""
    return f"{mount}/creds/{policy_name(spec)}"


def _q(text: str) -> str:
    return json.dumps(text)  # an HCL string is a JSON string


@dataclass(frozen=True)
class JobPolicies:
    name: str
    nomad_submitter: str
    consul_submitter: str
    consul_tasks: str
    vault_tasks: str


def nomad_submitter_policy(namespace: str) -> str:
    caps = ", ".join(_q(c) for c in NOMAD_SUBMITTER_CAPABILITIES)
    return f"namespace {_q(namespace)} {{\n  capabilities = [{caps}]\n}}\n"


def consul_hcl(rules: dict[str, Any]) -> str:
    """Consul rules in their JSON form (what the API and py-consul take) as HCL text."""
    lines = []
    for kind, entries in rules.items():
        for name, rule in entries.items():
            lines.append(f"{kind} {_q(name)} {{ policy = {_q(rule['policy'])} }}")
    return "\n".join(lines) + "\n"


def consul_submitter_rules(namespace: str) -> dict[str, Any]:
    """`run`, `status`, `scale` and `stop --purge`: the state of every run in the namespace."""
    prefix = wire.kv_job_prefix(namespace, "").rstrip("/") + "/"
    return {
        "key_prefix": {prefix: {"policy": "write"}},
        "service_prefix": {"": {"policy": "read"}},
        "node_prefix": {"": {"policy": "read"}},
    }


def consul_tasks_rules(spec: JobSpec) -> dict[str, Any]:
    """The job's own KV prefix, read on its own services, sessions for the slot locks and
    node reads (health queries return nodes). No service writes: Nomad registers them."""
    services = {wire.service_name(spec.namespace, spec.name, role): {"policy": "read"} for role in spec.roles}
    return {
        "key_prefix": {wire.kv_job_prefix(spec.namespace, spec.name): {"policy": "write"}},
        "service": services,
        "session_prefix": {"": {"policy": "write"}},
        "node_prefix": {"": {"policy": "read"}},
    }


def _vault_read_path(path: str) -> str:
    return f"path {_q(path)} {{\n  capabilities = [\"read\"]\n}}\n"


def vault_tasks_policy(spec: JobSpec, token_path: str = "", kv_v2_mounts: tuple[str, ...] = ("secret",)) -> str:
    """Read on the Consul token path (`token_path`, else the job's discovery.consul_token_path,
    else its engine role's) and on every secret the job names (KV v2 paths get their `data/`
    segment). The first line, a comment, names the job (`owner`)."""
    def api_path(path: str) -> str:
        mount, _, rest = path.partition("/")
        return f"{mount}/data/{rest}" if mount in kv_v2_mounts else path

    blocks = [f"# {owner(spec)}\n"]
    token_path = token_path or spec.discovery.consul_token_path or consul_token_path(spec)
    for path in [token_path, *(ref["path"] for ref in spec.secrets)]:
        block = _vault_read_path(api_path(path))
        if block not in blocks:
            blocks.append(block)
    if token_path.split("/", 1)[0] not in kv_v2_mounts:
        # A task revokes its own Consul token's lease when it ends (and no other lease).
        blocks.append(f"path {_q('sys/leases/revoke/' + token_path + '/*')} {{\n  capabilities = [\"update\"]\n}}\n")
    return blocks[0] + "\n".join(blocks[1:])


def job_policies(spec: JobSpec) -> JobPolicies:
    return JobPolicies(
        name=policy_name(spec),
        nomad_submitter=nomad_submitter_policy(spec.namespace),
        consul_submitter=consul_hcl(consul_submitter_rules(spec.namespace)),
        consul_tasks=consul_hcl(consul_tasks_rules(spec)),
        vault_tasks=vault_tasks_policy(spec),
    )
