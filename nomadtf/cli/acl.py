"""`nomadtf acl`: the least-privilege ACL policies a job needs (Nomad, Consul, Vault), and
the cluster profile its operator sets once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nomadtf.cli.common import JobFile, NomadVersion, Vars, err

if TYPE_CHECKING:
    from nomadtf.client.cluster_facts import ClusterFacts
    from nomadtf.job.spec import JobSpec

acl_app = typer.Typer(no_args_is_help=True, help="The least-privilege ACL policies a job needs (Nomad, Consul, Vault).")

JwtMount = Annotated[
    str, typer.Option("--jwt-mount", help="Vault's JWT auth mount for Nomad's workload identities (Nomad 1.7+; the clients' vault.jwt_auth_backend_path)")
]
JwksUrl = Annotated[
    Optional[str], typer.Option("--jwks-url", help="Nomad's JWKS as Vault reaches it; default NOMAD_ADDR/.well-known/jwks.json")
]
Issuer = Annotated[Optional[str], typer.Option("--issuer", help="The Nomad servers' oidc_issuer, if set: Vault binds the identities' iss to it")]


AllowPolicy = Annotated[
    Optional[list[str]],
    typer.Option("--allow-policy", help="A Vault policy beyond the job's own it may list in vault.policies (repeat; adds to the profile's vault_policy_allowlist)"),
]


def _acl_spec(job_file: Path, var: list[str] | None, facts: ClusterFacts, allow: list[str] | None = None, check: bool = True) -> JobSpec:
    """The job's spec for `nomadtf acl`, filled from the cluster profile: before `acl
    apply`, job.json may not list the Vault policy it creates yet, so it is added to the raw
    options before validation. Refused (exit 2, nothing written) when it asks for more than
    its own (acl.grant_problems)."""
    from nomadtf import wire
    from nomadtf.errors import SpecError
    from nomadtf.job import acl
    from nomadtf.job.options import load_options, with_vault_policies
    from nomadtf.job.spec import parse_spec

    raw = facts.fill(load_options(job_file, var or []))
    policy = wire.acl_name(raw["namespace"], raw.get("name", ""))  # acl.policy_name, before there is a JobSpec
    spec = parse_spec(with_vault_policies(raw, [policy]))
    allowed = [*(facts.profile.vault_policy_allowlist if facts.profile else ()), *(allow or [])]
    problems = acl.grant_problems(spec, allowed) if check else []
    if problems:
        raise SpecError(problems)
    return spec


def _identity(spec: JobSpec, facts: ClusterFacts) -> bool:
    """Whether the job's tasks log in to Vault with their workload identity (Nomad 1.7+)."""
    return facts.target is not None and facts.target.rendering(spec.vault.workflow).vault_identity


def _nomad_address_for_jwks(flag: str | None) -> str:
    """The Nomad address Vault fetches the JWKS from (--jwks-url without its path)."""
    if flag:
        return flag.removesuffix("/.well-known/jwks.json")
    return os.environ.get("NOMAD_ADDR", "http://127.0.0.1:4646")


def _jwks_ca_pem() -> str | None:
    path = os.environ.get("NOMAD_CACERT")
    return Path(path).read_text() if path else None


@acl_app.command("policies")
def acl_policies(
    job_file: JobFile,
    var: Vars = None,
    nomad_version: NomadVersion = None,
    jwt_mount: JwtMount = "jwt-nomad",
    jwks_url: JwksUrl = None,
    issuer: Issuer = None,
    allow_policy: AllowPolicy = None,
) -> None:
    """Print the four policies of a job: Nomad and Consul for whoever submits it, Consul and
    Vault for its tasks; for Nomad 1.7+ also the job's Vault JWT auth role, the auth method's
    configuration and the Nomad agents' vault block. Offline."""
    from nomadtf.client import cluster_facts
    from nomadtf.job import acl

    facts = cluster_facts.offline(nomad_version)
    for note in facts.notes:
        err(note)
    spec = _acl_spec(job_file, var, facts, allow_policy)
    policies = acl.job_policies(spec)
    namespace = spec.namespace
    identity = _identity(spec, facts)
    granted = f"granted by the JWT auth role auth/{jwt_mount}/role/{policies.name}" if identity else "list it in vault.policies"
    sections = [
        (f"Nomad policy for the submitter (namespace {namespace})", policies.nomad_submitter),
        ("Consul policy for the submitter", policies.consul_submitter),
        (f"Consul policy for the job's tasks ({policies.name})", policies.consul_tasks),
        (f"Vault policy for the job's tasks ({policies.name}; {granted})", policies.vault_tasks),
    ]
    if identity:
        vault_address = spec.vault.address or os.environ.get("VAULT_ADDR", "http://127.0.0.1:8200")
        sections += [
            (
                f"Vault JWT auth role for the job's tasks (POST /v1/auth/{jwt_mount}/role/{policies.name})",
                json.dumps(acl.vault_jwt_role(spec), indent=2) + "\n",
            ),
            (
                f"Vault JWT auth method, once per cluster (POST /v1/sys/auth/{jwt_mount} type jwt; POST /v1/auth/{jwt_mount}/config)",
                json.dumps(acl.jwt_auth_config(_nomad_address_for_jwks(jwks_url), issuer, "<the PEM of NOMAD_CACERT>" if os.environ.get("NOMAD_CACERT") else None), indent=2) + "\n",
            ),
            ("Nomad agents' vault block, once per cluster (servers and clients)", acl.nomad_vault_agent_config(vault_address, jwt_mount)),
        ]
    sections += [
        ("Nomad policy for the admission controller, once per cluster (nomadtf admission deploy --tokens)", acl.nomad_controller_policy()),
        ("Consul policy for the admission controller, once per cluster", acl.consul_hcl(acl.consul_controller_rules())),
    ]
    for title, text in sections:
        typer.echo(f"# --- {title}")
        typer.echo(text)


@acl_app.command("apply")
def acl_apply(
    job_file: JobFile,
    var: Vars = None,
    nomad_version: NomadVersion = None,
    jwt_mount: JwtMount = "jwt-nomad",
    configure_auth: Annotated[
        bool, typer.Option("--configure-auth", help="Nomad 1.7+: also enable and configure the JWT auth method (once per cluster, as `nomad setup vault`)")
    ] = False,
    jwks_url: JwksUrl = None,
    issuer: Issuer = None,
    allow_policy: AllowPolicy = None,
) -> None:
    """Operator: create the job's task policies and its tasks' Consul token source (needs
    CONSUL_HTTP_TOKEN with acl write and a VAULT_TOKEN that may write policies); for Nomad
    1.7+ also its Vault JWT auth role."""
    from nomadtf.client import acl_setup, cluster_facts
    from nomadtf.job import acl

    facts = cluster_facts.for_operator(nomad_version)
    for note in facts.notes:
        err(note)
    spec = _acl_spec(job_file, var, facts, allow_policy)
    facts.require_target_for(spec)  # 1.6 or 1.7+ decides whether the job's JWT role is written
    jwt = None
    if _identity(spec, facts):
        config = acl.jwt_auth_config(_nomad_address_for_jwks(jwks_url), issuer, _jwks_ca_pem()) if configure_auth else None
        jwt = acl_setup.JwtSetup(jwt_mount, config)
    applied = acl_setup.apply(spec, jwt=jwt)
    if applied.mode == "none":
        err(f"Vault policy {applied.name} written; Consul runs without ACLs: the tasks need no Consul token")
    else:
        how = "a Consul secrets engine role: one leased token per task" if applied.mode == "engine" else "one token kept in Vault's KV"
        err(f"Consul policy and Vault policy {applied.name} written; the tasks' Consul token: {applied.token_path} ({how})")
        err(f"or, once for every job, set consul_token_source = {applied.mode!r} in the cluster profile (`nomadtf acl profile`)")
    if applied.jwt_role:
        granted = ", ".join(acl.jwt_role_policies(spec))
        err(f"Vault JWT auth role {applied.jwt_role} written: this job's identities get {granted}")
    err("granted, and nothing else:")
    for line in acl.grant_lines(spec, applied.token_path, bool(applied.jwt_role)):
        err(f"  {line}")
    typer.echo("add to job.json:")
    settings: dict = {"discovery": {"consul_token_path": applied.token_path}} if applied.token_path else {}
    if not applied.jwt_role:
        settings["vault"] = {"policies": [applied.name]}
    typer.echo(json.dumps(settings, indent=2))


@acl_app.command("revoke")
def acl_revoke(job_file: JobFile, var: Vars = None, nomad_version: NomadVersion = None, jwt_mount: JwtMount = "jwt-nomad") -> None:
    """Operator: delete what `acl apply` created for the job."""
    from nomadtf.client import acl_setup, cluster_facts

    facts = cluster_facts.for_operator(nomad_version)
    spec = _acl_spec(job_file, var, facts, check=False)  # what an older apply granted goes whatever it was
    facts.require_target_for(spec)
    acl_setup.revoke(spec, jwt=acl_setup.JwtSetup(jwt_mount) if _identity(spec, facts) else None)
    err("removed the job's policies and Consul token source")


@acl_app.command("profile")
def acl_profile(
    profile_file: Annotated[Optional[Path], typer.Argument(help="The cluster profile to store (JSON); none: print the stored one", show_default=False)] = None,
) -> None:
    """Operator: the cluster profile every submission reads (Consul KV nomadtf/_cluster/profile):
    the clients' Consul and Vault addresses and CAs, the tasks' token source. See docs/nomad-versions.md."""
    from nomadtf.errors import SpecError
    from nomadtf.job.profile import ClusterProfile
    from nomadtf.servers import consul as discovery

    if profile_file is None:
        text = discovery.read_cluster_profile()
        typer.echo(text if text is not None else "no cluster profile (every setting comes from job.json)")
        return
    try:
        data = json.loads(profile_file.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{profile_file}: not a readable JSON file ({exc})") from exc
    profile = ClusterProfile.from_json(data, str(profile_file))
    discovery.write_cluster_profile(json.dumps(profile.to_json(), indent=2, sort_keys=True))
    err(f"cluster profile written to Consul KV nomadtf/_cluster/profile: {', '.join(sorted(profile.to_json())) or 'empty'}")
