"""What the cluster says about itself when a job is submitted: the version of its Nomad
(the rendering's target) and its profile (profile.py). Nothing here prints: what could not
be read is said in `notes`, which the CLI shows.

Order, for `run`, `plan`, `validate` and `acl apply`:
- the target: the server's own version (GET /v1/agent/self); when the agent refuses that
  (a token without agent:read), the oldest alive server's version from the gossip members
  (GET /v1/agent/members, node:read); when neither answers: NOMADTF_NOMAD_VERSION, else
  the profile's `nomad_version`, else Nomad 1.6 with a note saying how to name it. A job
  whose rendering depends on the version (render.version_dependent) is refused instead of
  rendered for that guess (`ClusterFacts.require_target_for`);
- the profile: the file NOMADTF_CLUSTER_PROFILE names, else Consul KV
  (wire.KV_CLUSTER_PROFILE), else none (every setting from job.json and the schema).
Offline (`render`, `acl policies`): --nomad-version, NOMADTF_NOMAD_VERSION, the profile
file's version; no server is asked. `acl apply` / `revoke` take --nomad-version or
NOMADTF_NOMAD_VERSION before asking the server.

Usage:
    facts = at_submission(NomadAPI.from_env(), os.environ)
    spec = parse_spec(facts.fill(load_options(path, overrides)))
    render_job(spec, target=facts.target); facts.notes
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nomadtf import wire
from nomadtf.errors import NomadError, ServerError, SpecError, UnknownNomadVersion
from nomadtf.job import target as target_mod
from nomadtf.job.profile import ClusterProfile, fill_job, offline_target, profile_from_file
from nomadtf.job.render import version_dependent
from nomadtf.job.spec import JobSpec
from nomadtf.servers import consul as discovery
from nomadtf.servers.nomad import NomadAPI

# How to name the target when Nomad will not say it (the notes and the refusal say it).
NAME_THE_VERSION = (
    f"name it: {target_mod.ENV_NOMAD_VERSION}=<the servers' version> (or --nomad-version where the command takes it), "
    "or the cluster profile's nomad_version (`nomadtf acl profile`); or give the token node:read (or agent:read)"
)


@dataclass(frozen=True)
class ClusterFacts:
    target: target_mod.Target | None
    profile: ClusterProfile | None
    notes: list[str] = field(default_factory=list)
    # Nomad did not answer at all when asked its version: what `run` and `plan`, which need
    # it, fail with at once (one line); `validate` goes on offline with the note.
    unreachable: ServerError | None = None

    def fill(self, raw: dict[str, Any]) -> dict[str, Any]:
        """job.json's raw options (spec.load_options) with what the cluster says filled in."""
        return fill_job(raw, self.profile, self.target)

    def require_target_for(self, spec: JobSpec) -> None:
        """Refuse (UnknownNomadVersion, exit 2) to render `spec` for the assumed Nomad 1.6
        when nobody said the version and the job renders differently per version: such a
        guess fails at run time, far from its cause (a task without its Vault token)."""
        if self.target is None or not self.target.assumed:
            return
        reasons = version_dependent(spec)
        if reasons:
            raise UnknownNomadVersion(
                f"could not read Nomad's version ({self.target.unread}), and job {spec.name} renders differently per Nomad version: "
                f"{'; '.join(reasons)}. Nothing was submitted; {NAME_THE_VERSION}"
            )


def read_profile(environ: Mapping[str, str] = os.environ) -> tuple[ClusterProfile | None, list[str]]:
    """The profile from its file, else from Consul KV; a Consul that does not answer or
    refuses the read gives none and a note (a profile that is there but broken fails).

    GET /v1/kv/nomadtf/_cluster/profile
    """
    from_file = profile_from_file(environ)
    if from_file:
        return from_file, []
    try:
        text = discovery.read_cluster_profile()
    except ServerError as exc:
        return None, [f"no cluster profile: {exc}"]
    if text is None:
        return None, []
    source = f"Consul KV {wire.KV_CLUSTER_PROFILE}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SpecError(f"cluster profile ({source}): not JSON ({exc}); its operator rewrites it with `nomadtf acl profile FILE`") from exc
    return ClusterProfile.from_json(data, source), []


def server_target(api: NomadAPI, profile: ClusterProfile | None, environ: Mapping[str, str] = os.environ) -> tuple[target_mod.Target, list[str]]:
    """The server's version; the fallbacks of the module docstring when it cannot be read.

    GET /v1/agent/self ; GET /v1/agent/members when the agent refuses the first
    """
    found, notes, _unreachable = _server_target(api, profile, environ)
    return found, notes


def _server_target(
    api: NomadAPI, profile: ClusterProfile | None, environ: Mapping[str, str]
) -> tuple[target_mod.Target, list[str], ServerError | None]:
    """server_target, and the error when Nomad did not answer at all."""
    try:
        found = target_mod.resolve(api.agent_version(), f"Nomad at {api.address}")
        return found, list(found.notes), None
    except ServerError as exc:
        error = exc
        unread = str(exc) or type(exc).__name__
        refused = isinstance(exc, NomadError) and exc.status is not None  # it answered: the gossip tags may still say
    if refused:
        try:
            versions = api.server_versions()
        except ServerError as exc:
            unread = f"{unread}; {exc}"
        else:
            if versions:
                found = target_mod.oldest_server(versions, f"Nomad's servers at {api.address}, GET /v1/agent/members")
                return found, list(found.notes), None
            unread = f"{unread}; GET /v1/agent/members named no alive server"
    unreachable = None if refused else error
    fallback = offline_target(None, profile, environ)
    if fallback is not None:
        return fallback, [f"could not read Nomad's version ({unread}); rendering for {fallback.version} ({fallback.source})"], unreachable
    # Assumed only where Nomad answered: one that does not cannot take the job either, and
    # `validate` still checks job.json without it.
    baseline = target_mod.Target(target_mod.BASELINE, target_mod.BASELINE, "default", unread=unread if refused else "")
    return baseline, [
        f"could not read Nomad's version ({unread}); rendering for Nomad {target_mod.BASELINE}. On Nomad 1.7+ {NAME_THE_VERSION}"
    ], unreachable


def at_submission(api: NomadAPI, environ: Mapping[str, str] = os.environ) -> ClusterFacts:
    profile, notes = read_profile(environ)
    found, target_notes, unreachable = _server_target(api, profile, environ)
    return ClusterFacts(found, profile, notes + target_notes, unreachable)


def offline(flag: str | None, environ: Mapping[str, str] = os.environ) -> ClusterFacts:
    profile = profile_from_file(environ)
    found = offline_target(flag, profile, environ)
    return ClusterFacts(found, profile, list(found.notes) if found else [])


def for_operator(flag: str | None, environ: Mapping[str, str] = os.environ) -> ClusterFacts:
    """`acl apply` / `revoke`: the profile (file or Consul); the target from --nomad-version
    or NOMADTF_NOMAD_VERSION, else from the server as a submission would.

    GET /v1/kv/nomadtf/_cluster/profile ; GET /v1/agent/self (without a version given)
    """
    profile, notes = read_profile(environ)
    if flag or environ.get(target_mod.ENV_NOMAD_VERSION):
        found = offline_target(flag, profile, environ)
        return ClusterFacts(found, profile, notes + list(found.notes if found else ()))
    found, target_notes = server_target(NomadAPI.from_env(), profile, environ)
    return ClusterFacts(found, profile, notes + target_notes)
