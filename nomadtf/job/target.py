"""The Nomad a job is rendered for: its version, parsed and compared, and the rendering
decisions that follow from it. Pure (reading the version from a server is `nomad.py`'s
`NomadAPI.agent_version`).

Nomad 1.6.1 is the release this project runs end to end (the newest MPL-2.0 one it can
build); 1.7 to 2.0.5 are rendered for and checked against the structs of the MPL-2.0
`github.com/hashicorp/nomad/api` module (tools/nomadapi-check), never run here. What changes
with the version (docs/nomad-versions.md):

- 1.7: workload identities for Vault: a task's `vault { role }` and a `vault_default`
  identity (audience vault.io) replace the Nomad servers' Vault token; the token workflow
  stays until 1.9, only for jobs that ask for it (`vault.workflow = "token"`).
- 1.8: the group's `disconnect` block replaces max_client_disconnect and friends.
- 1.10: the token workflow is gone (`vault.policies` is kept in the API structs and dropped
  silently); templates that read Consul need the task's `consul` block and identity.

Usage:
    target = resolve("2.0.5", source="--nomad-version")
    target.rendering.vault_identity      # True
    target.notes                         # ("Nomad 2.1.0 is newer than ...", ...) for unknown ones
    str(target.version)                  # "2.0.5", what the job's Meta records
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nomadtf.errors import SpecError

ENV_NOMAD_VERSION = "NOMADTF_NOMAD_VERSION"

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")


@dataclass(frozen=True, order=True)
class NomadVersion:
    """major.minor.patch; a pre-release (1.10.0-beta.1) sorts before its release, and build
    metadata (+ent) is dropped. Compared as tuples, so `v >= NomadVersion(1, 10)` reads as
    the changelog does."""

    major: int
    minor: int
    patch: int = 0
    # "~" sorts after every pre-release label: a release is newer than its betas.
    prerelease: str = "~"

    @classmethod
    def parse(cls, text: str) -> NomadVersion:
        match = _VERSION.fullmatch(text.strip())
        if not match:
            raise SpecError(f"Nomad version {text!r}: write it as Nomad prints it, e.g. 1.6.1 or 2.0.5")
        major, minor, patch, pre = match.groups()
        return cls(int(major), int(minor), int(patch or 0), pre or "~")

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        return text if self.prerelease == "~" else f"{text}-{self.prerelease}"


BASELINE = NomadVersion(1, 6, 1)  # run end to end here; what a rendering without a target is for
NEWEST_KNOWN = NomadVersion(2, 0, 5)  # the newest release whose API structs were checked
OLDEST_SUPPORTED = NomadVersion(1, 6, 0)

VAULT_IDENTITY_FROM = NomadVersion(1, 7, 0)
DISCONNECT_BLOCK_FROM = NomadVersion(1, 8, 0)
# disconnect.stop_on_client_after: before 1.10.2 a client that must stop two allocations in one
# timeout sends to its own one-slot channel and deadlocks (seen here on 1.6.1's
# stop_after_client_disconnect; fixed by hashicorp/nomad#25946, released in 1.10.2).
CLIENT_STOP_FIXED_IN = NomadVersion(1, 10, 2)
TOKEN_WORKFLOW_REMOVED_IN = NomadVersion(1, 10, 0)
CONSUL_BLOCK_FOR_TEMPLATES_FROM = NomadVersion(1, 10, 0)

# The workload identity a task's vault block logs in with (Nomad's name for it), its
# audience (what `nomad setup vault` binds the auth role to) and life. Nomad renews it.
VAULT_IDENTITY_NAME = "vault_default"
VAULT_AUDIENCE = "vault.io"
CONSUL_IDENTITY_NAME = "consul_default"
CONSUL_AUDIENCE = "consul.io"
IDENTITY_TTL = "1h"


@dataclass(frozen=True)
class Rendering:
    """What the templates do differently for one Nomad version: decisions, no versions."""

    vault_identity: bool  # `vault { role }` + a vault_default identity, no policies
    vault_token_workflow_available: bool  # `vault { policies }` still means something
    disconnect_block: bool  # the group's disconnect block (never the fields it replaced)
    client_stop: bool  # a cut-off client stops the tasks itself (disconnect.stop_on_client_after)
    consul_block_for_templates: bool  # templates that read Consul need consul {} + identity


def rendering_for(version: NomadVersion, workflow: str | None = None) -> Rendering:
    """The decisions for `version`; `workflow` is job.json's `vault.workflow` ("token":
    the 1.6 way, which 1.7 to 1.9 still offer; "identity"; None: the version's own way)."""
    token_available = version < TOKEN_WORKFLOW_REMOVED_IN
    if workflow == "token":
        identity = False
    elif workflow == "identity":
        identity = True
    else:
        identity = version >= VAULT_IDENTITY_FROM
    return Rendering(
        vault_identity=identity,
        vault_token_workflow_available=token_available,
        disconnect_block=version >= DISCONNECT_BLOCK_FROM,
        client_stop=version >= CLIENT_STOP_FIXED_IN,
        consul_block_for_templates=version >= CONSUL_BLOCK_FOR_TEMPLATES_FROM,
    )


@dataclass(frozen=True)
class Target:
    """The Nomad a job is for: `version` as the server or the user gave it, `rendering_version`
    the one whose rendering it gets (the newest known for newer or odd versions), and where
    the version came from ("server", "--nomad-version", NOMADTF_NOMAD_VERSION, "cluster profile")."""

    version: NomadVersion
    rendering_version: NomadVersion
    source: str
    notes: tuple[str, ...] = ()
    # Why nobody said it: Nomad answered but would not say its version and no setting names
    # one, so a submission would assume the baseline (cluster_facts). "" when someone said it
    # (or when Nomad did not answer at all: nothing can be submitted then).
    unread: str = ""

    @property
    def assumed(self) -> bool:
        return bool(self.unread)

    def rendering(self, workflow: str | None = None) -> Rendering:
        return rendering_for(self.rendering_version, workflow)


def resolve(text: str, source: str) -> Target:
    """A Target for the version `text` said by `source`: SpecError when it is not a version
    or older than 1.6; a version newer than the newest one checked gets that one's
    rendering and a note saying so."""
    version = NomadVersion.parse(text)
    if version < OLDEST_SUPPORTED:
        raise SpecError(f"Nomad {version} ({source}): nomadtf renders for Nomad {OLDEST_SUPPORTED} and later")
    if version > NEWEST_KNOWN:
        note = (
            f"Nomad {version} ({source}) is newer than {NEWEST_KNOWN}, the newest release nomadtf was checked against; "
            f"rendering for {NEWEST_KNOWN}"
        )
        return Target(version, NEWEST_KNOWN, source, (note,))
    return Target(version, version, source)


def oldest_server(versions: list[str], source: str) -> Target:
    """The target for a cluster whose servers run `versions`: the oldest, since Nomad
    turns a feature on only once every server has it (an upgrade in progress renders for
    the servers not yet upgraded); a note says when they differ."""
    parsed = sorted({NomadVersion.parse(text) for text in versions})
    found = resolve(str(parsed[0]), source)
    if len(parsed) == 1:
        return found
    note = f"Nomad's servers run {', '.join(map(str, parsed))}; rendering for the oldest, {parsed[0]}"
    return Target(found.version, found.rendering_version, source, (*found.notes, note))


def workflow_problems(workflow: str | None, target: Target) -> list[str]:
    """job.json's `vault.workflow` against the target: the token workflow is gone from 1.10,
    workload identities for Vault came in 1.7."""
    version = target.rendering_version
    if workflow == "token" and version >= TOKEN_WORKFLOW_REMOVED_IN:
        return [
            f"vault.workflow: Nomad {target.version} has no token workflow (removed in {TOKEN_WORKFLOW_REMOVED_IN}); "
            "remove vault.workflow: tasks log in with their workload identity and vault.role"
        ]
    if workflow == "identity" and version < VAULT_IDENTITY_FROM:
        return [f"vault.workflow: workload identities for Vault need Nomad {VAULT_IDENTITY_FROM}+, the target is {target.version}"]
    return []
