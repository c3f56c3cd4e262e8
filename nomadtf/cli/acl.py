"""`nomadtf acl`: the least-privilege ACL policies a job needs (Nomad, Consul, Vault)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nomadtf.cli.common import JobFile, Vars, err

if TYPE_CHECKING:
    from nomadtf.spec import JobSpec

acl_app = typer.Typer(no_args_is_help=True, help="The least-privilege ACL policies a job needs (Nomad, Consul, Vault).")


def _acl_spec(job_file: Path, var: list[str] | None) -> JobSpec:
    """The job's spec for `nomadtf acl`: before `acl apply`, job.json may not list the
    Vault policy it creates yet, so it is added to the raw options before validation."""
    from nomadtf import wire
    from nomadtf.spec import load_options, parse_spec, with_vault_policies

    raw = load_options(job_file, var or [])
    policy = wire.acl_name(raw["namespace"], raw.get("name", ""))  # acl.policy_name, before there is a JobSpec
    return parse_spec(with_vault_policies(raw, [policy]))


@acl_app.command("policies")
def acl_policies(job_file: JobFile, var: Vars = None) -> None:
    """Print the four policies of a job: Nomad and Consul for whoever submits it, Consul and
    Vault for its tasks. Offline."""
    from nomadtf import acl

    spec = _acl_spec(job_file, var)
    policies = acl.job_policies(spec)
    namespace = spec.namespace
    sections = (
        (f"Nomad policy for the submitter (namespace {namespace})", policies.nomad_submitter),
        ("Consul policy for the submitter", policies.consul_submitter),
        (f"Consul policy for the job's tasks ({policies.name})", policies.consul_tasks),
        (f"Vault policy for the job's tasks ({policies.name}; list it in vault.policies)", policies.vault_tasks),
    )
    for title, text in sections:
        typer.echo(f"# --- {title}")
        typer.echo(text)


@acl_app.command("apply")
def acl_apply(job_file: JobFile, var: Vars = None) -> None:
    """Operator: create the job's task policies and its tasks' Consul token source (needs
    CONSUL_HTTP_TOKEN with acl write and a VAULT_TOKEN that may write policies)."""
    from nomadtf import acl_setup

    spec = _acl_spec(job_file, var)
    applied = acl_setup.apply(spec)
    how = "a Consul secrets engine role: one leased token per task" if applied.mode == "engine" else "one token kept in Vault's KV"
    err(f"Consul policy and Vault policy {applied.name} written; the tasks' Consul token: {applied.token_path} ({how})")
    typer.echo("add to job.json:")
    typer.echo(json.dumps({"discovery": {"consul_token_path": applied.token_path}, "vault": {"policies": [applied.name]}}, indent=2))


@acl_app.command("revoke")
def acl_revoke(job_file: JobFile, var: Vars = None) -> None:
    """Operator: delete what `acl apply` created for the job."""
    from nomadtf import acl_setup

    acl_setup.revoke(_acl_spec(job_file, var))
    err("removed the job's policies and Consul token source")
