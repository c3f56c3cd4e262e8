"""The least-privilege ACL policies a nomadtf job needs, as text. Pure.

Four policies, one job (`nomadtf acl policies JOB`), and the admission controller's two,
once per cluster (`nomad_controller_policy`, `consul_controller_rules`):

- **Nomad, the submitter** (one namespace): submit, read, scale and stop the job, read
  its allocations and logs, restart an allocation; read the agent (its version is what the
  job is rendered for, target.py) and the nodes (admission knows the cluster's size: node
  names and resources, never another namespace's jobs). Nothing in other namespaces.
- **Consul, the submitter**: the job's runs' state under `nomadtf/<ns>/` (what `run`,
  `status`, `scale` and `stop --purge` read and write), service reads, the cluster
  profile (profile.py), and read on the admission controller's lead and board. Nothing
  shared is writable: the queue is the namespace's suspended jobs in Nomad.
- **Consul, the job's tasks**: the job's own KV prefix, read on its own services, sessions
  (slot locks) and node reads for health queries. No service registration (Nomad registers
  the services), no other job's keys.
- **Vault, the job's tasks**: read the Consul token path and the job's secrets.

On Nomad 1.7+ (target.py) the tasks' Vault token comes from their workload identity: a
**Vault JWT auth role** per job (`vault_jwt_role`), bound to the claims Nomad signs into the
task's `vault_default` identity (audience vault.io, `nomad_namespace`, `nomad_job_id`),
grants that Vault policy and the ones job.json lists in `vault.policies` (`jwt_role_policies`),
nothing else. The JWT auth method it lives in trusts Nomad's
JWKS; `jwt_auth_config` is its configuration as `nomad setup vault` writes it (once per
cluster).

Consul scopes sessions by node, not by owner: a task can create (and destroy) sessions on
the nodes it may write sessions for. docs/operations/secure-stack.md ("What is and is not protected") says what that allows.

Usage:
    policies = job_policies(load_spec(Path("job.json")))
    policies.nomad_submitter, policies.consul_tasks, ...
    policy_name(spec)      # "nomadtf-<namespace>-<job>-<digest>" (wire.acl_name), what `acl apply` names them
    vault_jwt_role(spec)   # the body of POST /v1/auth/<mount>/role/<policy_name(spec)>
    jwt_auth_config("https://nomad.example:4646")
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from nomadtf import wire
from nomadtf.job import target
from nomadtf.job.spec import JobSpec

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

# Where Nomad's clients log tasks in (their `vault.jwt_auth_backend_path`; Nomad's default).
JWT_AUTH_MOUNT = "jwt-nomad"
# The tasks' token is periodic: Nomad renews it while the task runs and revokes it when the
# task stops (its Consul token's lease dies with it). The explicit maximum caps a token that
# outlives its task: the job's deadline (after which nomadtf stops the job) plus an hour.
JWT_TOKEN_PERIOD = "30m"
JWT_TOKEN_MAX_MARGIN_S = 3600
JWT_SUPPORTED_ALGS = ("RS256", "EdDSA")  # what Nomad's keyring signs with
JWT_DEFAULT_ROLE = "nomad-workloads"  # `nomad setup vault`'s, for jobs that name no role

def policy_name(spec: JobSpec) -> str:
    """The name of the job's policies in Consul and Vault (and of its Consul engine role)."""
    return wire.acl_name(spec.namespace, spec.name)


def owner(spec: JobSpec) -> str:
    """Whose policies these are (wire.acl_owner): `acl apply` overwrites nothing without it."""
    return wire.acl_owner(spec.namespace, spec.name)


def consul_token_path(spec: JobSpec, mount: str = "consul") -> str:
    """Where the tasks read their Consul token: the job's role of a Consul secrets engine."""
    return f"{mount}/creds/{policy_name(spec)}"


# One exact Vault path segment: no glob (`*` matches a suffix, `+` a segment), no `.` or `..`.
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
NEVER_GRANTED = ("root",)


def _path_problem(path: str) -> str:
    parts = path.split("/")
    if len(parts) < 2 or any(part in ("", ".", "..") for part in parts):
        return "is not one exact path (an empty, '.' or '..' segment)"
    if not all(_PATH_SEGMENT.fullmatch(part) for part in parts):
        return "is not one exact path (Vault reads '*' and '+' as globs over many; letters, digits, '_', '-' and '.' only)"
    return ""


def grant_problems(spec: JobSpec, allowed_policies: tuple[str, ...] | list[str] = ()) -> list[str]:
    """What `acl apply` (and `acl policies`) refuses to grant, one line per field naming the
    fix; [] when everything it would write is the job's own: exact paths for the Consul token
    and each secret (a glob or `..` would become read on other teams' paths), and Vault
    policies beyond the job's own only from the operator's allowlist (the cluster profile's
    `vault_policy_allowlist`, or `--allow-policy`). Pure."""
    problems = []
    path = spec.discovery.consul_token_path
    if path and (why := _path_problem(path)):
        problems.append(f"discovery.consul_token_path: {path!r} {why}; name the job's own, e.g. {consul_token_path(spec)}")
    for index, ref in enumerate(spec.secrets):
        if why := _path_problem(ref["path"]):
            problems.append(f"secrets[{index}].path: {ref['path']!r} {why}; name the secret's own path, e.g. secret/<team>/<name>")
    own = policy_name(spec)
    for name in spec.vault.policies:
        if name == own:
            continue
        if name in NEVER_GRANTED:
            problems.append(f"vault.policies: {name!r} is never granted to a job's tasks; remove it")
        elif name not in allowed_policies:
            problems.append(f"vault.policies: {name!r} is not on the operator's allowlist; the operator adds it to the cluster profile's "
                            f"vault_policy_allowlist, or passes --allow-policy {name}")  # fmt: skip
    return problems


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
    """The job's namespace's capabilities, agent read (`GET /v1/agent/self` says the
    server's version, so the job is rendered for the Nomad it goes to) and node read."""
    caps = ", ".join(_q(c) for c in NOMAD_SUBMITTER_CAPABILITIES)
    # node read: GET /v1/nodes?resources=true, how admission tells "never" from "not now".
    # host_volume: a docker task mounts its namespace's checkpoint folder read-write and the
    # CA directory read-only, and no other team's folder (render.docker_host_mounts).
    return (
        f"namespace {_q(namespace)} {{\n  capabilities = [{caps}]\n}}\n"
        "agent {\n  policy = \"read\"\n}\nnode {\n  policy = \"read\"\n}\n"
        f"host_volume {_q(wire.checkpoint_volume(namespace))} {{\n  policy = \"write\"\n}}\n"
        f"host_volume {_q(wire.CA_VOLUME)} {{\n  policy = \"read\"\n}}\n"
    )


def consul_hcl(rules: dict[str, Any]) -> str:
    """Consul rules in their JSON form (what the API and py-consul take) as HCL text."""
    lines = []
    for kind, entries in rules.items():
        for name, rule in entries.items():
            lines.append(f"{kind} {_q(name)} {{ policy = {_q(rule['policy'])} }}")
    return "\n".join(lines) + "\n"


def consul_submitter_rules(namespace: str) -> dict[str, Any]:
    """`run`, `status`, `scale` and `stop --purge`: the state of every run in the namespace;
    whether an admission controller leads and the board it publishes (a queued run's place).
    Nothing of the admission controller's is writable: no lead, no board, no sessions (the
    queue itself is the namespace's suspended jobs in Nomad)."""
    prefix = wire.kv_job_prefix(namespace, "").rstrip("/") + "/"
    return {
        "key": {
            wire.KV_CLUSTER_PROFILE: {"policy": "read"},
            wire.KV_ADMISSION_LEADER: {"policy": "read"},
            wire.KV_ADMISSION_BOARD: {"policy": "read"},
        },
        "key_prefix": {prefix: {"policy": "write"}},
        "service_prefix": {"": {"policy": "read"}},
        "node_prefix": {"": {"policy": "read"}},
    }


# The admission controller's Nomad capabilities in every namespace: read the jobs, their
# allocations and scaling events, resume (scale) suspended runs and suspend a preempted one,
# and signal a run it preempts to checkpoint (alloc-lifecycle). No submit-job: it can neither
# register nor edit a job body, nor stop one.
NOMAD_CONTROLLER_CAPABILITIES = ("list-jobs", "read-job", "scale-job", "read-job-scaling", "alloc-lifecycle")


def nomad_controller_policy() -> str:
    """The controller's token: every namespace's jobs to read and scale, node read (the
    capacity it admits against). Nothing else."""
    caps = ", ".join(_q(c) for c in NOMAD_CONTROLLER_CAPABILITIES)
    return f"namespace \"*\" {{\n  capabilities = [{caps}]\n}}\nnode {{\n  policy = \"read\"\n}}\n"


def consul_controller_rules() -> dict[str, Any]:
    """The controller's Consul token: its lead and its board (nobody else writes them), the
    runs' state under `nomadtf/` (a run given back after its gang timeout starts afresh:
    its keys are cleared), its own session; the operator's sharing policy, read only."""
    return {
        "key": {
            wire.KV_ADMISSION_LEADER: {"policy": "write"}, wire.KV_ADMISSION_BOARD: {"policy": "write"},
            wire.KV_ADMISSION_POLICY: {"policy": "read"},
        },
        "key_prefix": {"nomadtf/": {"policy": "write"}},
        "session_prefix": {"": {"policy": "write"}},
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


def vault_tasks_policy(
    spec: JobSpec, token_path: str = "", kv_v2_mounts: tuple[str, ...] = ("secret",), consul_token: bool = True
) -> str:
    """Read on the Consul token path (`token_path`, else the job's discovery.consul_token_path,
    else its engine role's; none when `consul_token` is False: a Consul without ACLs needs no
    token) and on every secret the job names (KV v2 paths get their `data/` segment). The
    first line, a comment, names the job (`owner`)."""
    blocks = [f"# {owner(spec)}\n"]
    for path, capability in vault_grants(spec, token_path, kv_v2_mounts, consul_token):
        block = f"path {_q(path)} {{\n  capabilities = [\"{capability}\"]\n}}\n"
        if block not in blocks:
            blocks.append(block)
    return blocks[0] + "\n".join(blocks[1:])


def vault_grants(spec: JobSpec, token_path: str = "", kv_v2_mounts: tuple[str, ...] = ("secret",),
                 consul_token: bool = True) -> list[tuple[str, str]]:  # fmt: skip
    """(Vault API path, capability) for everything the job's Vault policy grants (vault_tasks_policy)."""
    def api_path(path: str) -> str:
        mount, _, rest = path.partition("/")
        return f"{mount}/data/{rest}" if mount in kv_v2_mounts else path

    token_path = token_path or spec.discovery.consul_token_path or consul_token_path(spec)
    grants = list(dict.fromkeys((api_path(path), "read") for path in [token_path] * consul_token + [ref["path"] for ref in spec.secrets]))
    if consul_token and token_path.split("/", 1)[0] not in kv_v2_mounts:
        # A task revokes its own Consul token's lease when it ends (and no other lease).
        grants.append((f"sys/leases/revoke/{token_path}/*", "update"))
    return grants


def grant_lines(spec: JobSpec, token_path: str, jwt_role: bool) -> list[str]:
    """What `acl apply` wrote, one grant a line, for the operator to read."""
    lines = [f"Vault {capability} on {path}" for path, capability in vault_grants(spec, token_path, consul_token=bool(token_path))]
    if token_path:
        for kind, rules in consul_tasks_rules(spec).items():
            lines += [f"Consul {kind} {name or '(any)'}: {rule['policy']}" for name, rule in rules.items()]
    if jwt_role:
        lines.append(f"Vault JWT role: policies {', '.join(jwt_role_policies(spec))} to {spec.namespace}/{spec.name}'s workload identities")
    return lines


def jwt_role_policies(spec: JobSpec) -> list[str]:
    """What the job's JWT auth role grants: the job's own Vault policy, then every policy
    job.json lists in `vault.policies`. Nomad 1.10+ drops a job's own policies, so the role
    is where what the job asks for is granted, and the operator reviews it there."""
    return list(dict.fromkeys([policy_name(spec), *spec.vault.policies]))


def vault_jwt_role(spec: JobSpec) -> dict[str, Any]:
    """The Vault JWT auth role a job's tasks log in with on Nomad 1.7+ (POST
    /v1/auth/<mount>/role/<name>): only a Nomad workload identity for Vault (audience
    vault.io) of this job in this namespace is accepted, and the token grants
    `jwt_role_policies`. The claims mapped into the token's metadata are what Vault's audit
    log then shows of each login."""
    return {
        "role_type": "jwt",
        "bound_audiences": [target.VAULT_AUDIENCE],
        "bound_claims_type": "string",
        "bound_claims": {"nomad_namespace": spec.namespace, "nomad_job_id": spec.name},
        "user_claim": "/nomad_job_id",
        "user_claim_json_pointer": True,
        "claim_mappings": {"nomad_namespace": "nomad_namespace", "nomad_job_id": "nomad_job_id", "nomad_task": "nomad_task"},
        "token_type": "service",
        "token_policies": jwt_role_policies(spec),
        "token_period": JWT_TOKEN_PERIOD,
        "token_explicit_max_ttl": f"{spec.recovery.deadline_ns // 10**9 + JWT_TOKEN_MAX_MARGIN_S}s",
    }


def jwt_auth_config(nomad_address: str, issuer: str | None = None, jwks_ca_pem: str | None = None) -> dict[str, Any]:
    """The JWT auth method's configuration (POST /v1/auth/<mount>/config) as `nomad setup
    vault` writes it: Vault verifies identities with Nomad's JWKS (Nomad 1.7+ serves it at
    /.well-known/jwks.json); `bound_issuer` when the Nomad servers set `oidc_issuer` (their
    identities then carry it as `iss`)."""
    config: dict[str, Any] = {
        "jwks_url": nomad_address.rstrip("/") + "/.well-known/jwks.json",
        "jwt_supported_algs": list(JWT_SUPPORTED_ALGS),
        "default_role": JWT_DEFAULT_ROLE,
    }
    if jwks_ca_pem:
        config["jwks_ca_pem"] = jwks_ca_pem
    if issuer:
        config["bound_issuer"] = issuer
    return config


def nomad_vault_agent_config(vault_address: str, mount: str = JWT_AUTH_MOUNT) -> str:
    """The Nomad agents' vault block for workload identities (servers and clients alike;
    each ignores what is not its own). nomadtf's jobs carry their own vault_default
    identity; `default_identity` serves every other job."""
    return (
        "vault {\n"
        "  enabled = true\n"
        f"  address = {_q(vault_address)}\n"
        f"  jwt_auth_backend_path = {_q(mount)}\n"
        "  default_identity {\n"
        f"    aud = [{_q(target.VAULT_AUDIENCE)}]\n"
        f"    ttl = {_q(target.IDENTITY_TTL)}\n"
        "  }\n"
        "}\n"
    )


def job_policies(spec: JobSpec) -> JobPolicies:
    return JobPolicies(
        name=policy_name(spec),
        nomad_submitter=nomad_submitter_policy(spec.namespace),
        consul_submitter=consul_hcl(consul_submitter_rules(spec.namespace)),
        consul_tasks=consul_hcl(consul_tasks_rules(spec)),
        vault_tasks=vault_tasks_policy(spec),
    )
