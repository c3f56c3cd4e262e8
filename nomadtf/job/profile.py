"""The cluster profile: what belongs to the cluster rather than to a job, set once by its
operator, so one job.json runs on every cluster.

A data scientist's job.json names the training; where the clients' Consul agent and Vault
answer, which CA signed them, where a job's tasks get their Consul token and what its Vault
policy is called are the cluster's. The operator writes them once (`nomadtf acl profile
FILE`, into Consul KV at wire.KV_CLUSTER_PROFILE, readable by every submitter), and every
`nomadtf run`, `plan`, `validate` and `acl apply` fills the job's unset fields from it. A
field job.json (or `--var`) sets wins. Offline (`render`, `acl policies`) the profile comes
from the file NOMADTF_CLUSTER_PROFILE names, if any.

The profile (every field optional):

    {
      "nomad_version": "2.0.5",                          # when GET /v1/agent/self is refused
      "consul_address": "https://127.0.0.1:8501",        # discovery.consul_address, as the tasks see it
      "consul_ca_file": "/etc/nomadtf/ca.pem",           # discovery.consul_ca_file, on every client
      "vault_address": "https://vault.service:8200",     # vault.address
      "vault_ca_file": "/etc/nomadtf/ca.pem",            # vault.ca_file
      "consul_token_source": "engine",                   # discovery.consul_token_path by `acl apply`'s convention
      "job_vault_policy": true,                          # add the job's own Vault policy to vault.policies
      "vault_policy_allowlist": ["team-a-datasets"]      # Vault policies beyond its own a job may list (`acl apply`)
    }

Naming is nomadtf's: a job's Consul policy, Vault policy, Consul engine role and Vault JWT
auth role are all `nomadtf-<namespace>-<job>-<digest>` (wire.acl_name), which `acl apply`
creates. `consul_token_source` says where that put the tasks' Consul token: "engine"
(`consul/creds/<name>`, one leased token per task) or "kv" (one token at
`secret/nomadtf/consul-tokens/<namespace>/<job>`).

Usage:
    profile = ClusterProfile.from_json(data, source="Consul KV nomadtf/_cluster/profile")
    parse_spec(fill_job(load_options(path, overrides), profile, target))
    read_profile(os.environ)                # file, else Consul KV, else None
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from nomadtf import wire
from nomadtf.errors import SpecError
from nomadtf.job import target as target_mod

ENV_PROFILE_FILE = "NOMADTF_CLUSTER_PROFILE"
TOKEN_SOURCES = ("engine", "kv")
ENGINE_MOUNT = "consul"
KV_TOKEN_PREFIX = "secret/nomadtf/consul-tokens"


@dataclass(frozen=True)
class ClusterProfile:
    nomad_version: str | None = None
    consul_address: str | None = None
    consul_ca_file: str | None = None
    vault_address: str | None = None
    vault_ca_file: str | None = None
    consul_token_source: str | None = None
    job_vault_policy: bool = False
    vault_policy_allowlist: tuple[str, ...] = ()
    code_users: dict[str, str] | None = None  # namespace ("*": any other) -> "uid:gid" the code runs as
    source: str = ""  # where it was read: said in notes and errors, never stored

    @classmethod
    def from_json(cls, data: Any, source: str) -> ClusterProfile:
        """Checked: an object of known fields (did-you-mean for the others), strings where
        strings go, a token source and a Nomad version that mean something."""
        if not isinstance(data, dict):
            raise SpecError(f"cluster profile ({source}): must be a JSON object")
        known = [f.name for f in fields(cls) if f.name != "source"]
        problems = []
        for key in data:
            if key not in known:
                guess = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
                problems.append(f"cluster profile ({source}): unknown key {key!r}" + (f"; did you mean {guess[0]!r}?" if guess else f"; allowed: {', '.join(known)}"))
        for key in known:
            value = data.get(key)
            if key == "code_users":
                if value is not None and (not isinstance(value, dict) or not all(
                        isinstance(v, str) and re.fullmatch(r"[0-9]+(:[0-9]+)?", v) for v in value.values())):
                    problems.append(f'cluster profile ({source}): {key} must map namespaces (or "*") to "uid:gid", like {{"team-a": "10001:10001"}}')
                continue
            if key == "vault_policy_allowlist":
                if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)):
                    problems.append(f"cluster profile ({source}): {key} must be a list of Vault policy names")
                continue
            wanted = bool if key == "job_vault_policy" else str
            if value is not None and (not isinstance(value, wanted) or (wanted is str and not value)):
                problems.append(f"cluster profile ({source}): {key} must be a {'boolean' if wanted is bool else 'non-empty string'}")
        if data.get("consul_token_source") not in (None, *TOKEN_SOURCES):
            problems.append(f"cluster profile ({source}): consul_token_source must be one of {', '.join(TOKEN_SOURCES)}")
        if problems:
            raise SpecError(problems)
        if data.get("nomad_version"):
            target_mod.NomadVersion.parse(data["nomad_version"])
        values = {k: data[k] for k in known if k in data}
        if "vault_policy_allowlist" in values:
            values["vault_policy_allowlist"] = tuple(values["vault_policy_allowlist"] or ())
        return cls(**values, source=source)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "source" and v not in (None, False, ())}
        if "vault_policy_allowlist" in out:
            out["vault_policy_allowlist"] = list(out["vault_policy_allowlist"])
        return out


def consul_token_path(source: str, namespace: str, job: str) -> str:
    """Where `acl apply` keeps a job's tasks' Consul token, for each token source."""
    if source == "engine":
        return f"{ENGINE_MOUNT}/creds/{wire.acl_name(namespace, job)}"
    return f"{KV_TOKEN_PREFIX}/{namespace}/{job}"


def _needs_vault_login_by_nomad(raw: dict[str, Any]) -> bool:
    return (raw.get("vault") or {}).get("auth", "nomad") == "nomad"


def fill_job(raw: dict[str, Any], profile: ClusterProfile | None, target: target_mod.Target | None) -> dict[str, Any]:
    """`raw` job.json (after `--var`, with its namespace) with what the cluster says filled
    into the fields it leaves unset. Pure.

    On a Nomad whose tasks log in to Vault with their identity (1.7+), a job that lists no
    Vault policies gets its own (the policy its JWT auth role grants) so the schema's
    "secrets need a policy" rule is met by the convention, not by a setting."""
    out = copy.deepcopy(raw)
    if not isinstance(out.get("name"), str) or not isinstance(out.get("discovery", {}), dict) or not isinstance(out.get("vault", {}), dict):
        return out  # the schema says what is wrong with it
    namespace = out.get("namespace", wire.DEFAULT_NAMESPACE)
    own_policy = wire.acl_name(namespace, out["name"])
    discovery = dict(out.get("discovery") or {})
    vault = dict(out.get("vault") or {})
    if profile:
        for key, value in (("consul_address", profile.consul_address), ("consul_ca_file", profile.consul_ca_file)):
            if value and key not in discovery:
                discovery[key] = value
        for key, value in (("address", profile.vault_address), ("ca_file", profile.vault_ca_file)):
            if value and key not in vault:
                vault[key] = value
        if profile.consul_token_source and "consul_token_path" not in discovery:
            discovery["consul_token_path"] = consul_token_path(profile.consul_token_source, namespace, out["name"])
        if profile.job_vault_policy and _needs_vault_login_by_nomad(out):
            listed = vault.get("policies") or []
            vault["policies"] = listed + [own_policy] if isinstance(listed, list) and own_policy not in listed else listed
    workflow = vault.get("workflow")
    identity = target is not None and target.rendering(workflow if workflow in ("identity", "token") else None).vault_identity
    if identity and _needs_vault_login_by_nomad(out) and not vault.get("policies"):
        vault["policies"] = [own_policy]
    users = (profile.code_users or {}) if profile else {}
    if users and isinstance(out.get("driver", {}), dict):
        # The operator's alone where it keeps a map: a job naming another team's uid would
        # read that team's files. A namespace the map leaves out gets the driver's default.
        driver = {k: v for k, v in (out.get("driver") or {}).items() if k != "code_user"}
        user = users.get(namespace, users.get("*"))
        out["driver"] = {**driver, "code_user": user} if user else driver
    if discovery:
        out["discovery"] = discovery
    if vault:
        out["vault"] = vault
    return out


def offline_check_fill(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with the most any cluster could fill in (its own Vault policy, the newest Nomad):
    validating that finds every problem of job.json itself before a server is asked anything."""
    anything = ClusterProfile(job_vault_policy=True, source="offline check")
    return fill_job(raw, anything, target_mod.resolve(str(target_mod.NEWEST_KNOWN), "offline check"))


def profile_from_file(environ: Mapping[str, str] = os.environ) -> ClusterProfile | None:
    """The profile in the file NOMADTF_CLUSTER_PROFILE names; None when it names none."""
    path = environ.get(ENV_PROFILE_FILE)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SpecError(f"{ENV_PROFILE_FILE}={path}: cannot read it ({exc.strerror})") from exc
    except ValueError as exc:
        raise SpecError(f"{ENV_PROFILE_FILE}={path}: not JSON ({exc})") from exc
    return ClusterProfile.from_json(data, source=path)


def offline_target(flag: str | None, profile: ClusterProfile | None, environ: Mapping[str, str] = os.environ) -> target_mod.Target | None:
    """The target of an offline command: --nomad-version, else NOMADTF_NOMAD_VERSION, else
    the profile's nomad_version; None (the 1.6 rendering, no Meta) when none says one."""
    if flag:
        return target_mod.resolve(flag, "--nomad-version")
    if environ.get(target_mod.ENV_NOMAD_VERSION):
        return target_mod.resolve(environ[target_mod.ENV_NOMAD_VERSION], target_mod.ENV_NOMAD_VERSION)
    if profile and profile.nomad_version:
        return target_mod.resolve(profile.nomad_version, f"cluster profile {profile.source}")
    return None
