"""`nomadtf task --role ROLE`: the runtime's one entry. `python -m nomadtf task` (what every
allocation runs) and the command line's hidden `task` command both call `run_task`.

It sets the log format, reads the spec and the allocation from what Nomad wrote, logs in to
Vault once (only for a job that reads Vault) and reads the tasks' Consul token there, builds
the Consul discovery and the Supervisor, and turns what ends the task into its exit code.
Like `nomadtf.cli`, it is a process boundary: every NomadtfError becomes one line on stderr
(`error: ...`) and its exit code, anything unexpected one line and 70.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from nomadtf.errors import CannotRecord, NomadtfError, ServerError
from nomadtf.job.taskfile import for_task, read_spec_file
from nomadtf.runtime import deadline
from nomadtf.runtime.alloc import AllocInfo, spec_path
from nomadtf.runtime.supervisor import Supervisor
from nomadtf.servers.consul import ConsulDiscovery
from nomadtf.servers.consulhttp import consul_client

log = logging.getLogger("nomadtf.task")

UNEXPECTED_EXIT = 70  # EX_SOFTWARE, as `nomadtf.cli.main` ends on an unexpected error


def run_task(role: str, *, debug: bool = False) -> int:
    """The task's whole life as ROLE; its exit code. `debug` (`nomadtf --debug task`) lets an
    error through to the caller, traceback and all, as the command line does."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        # Milliseconds: how fast a peer's move is seen and acted on is read from these lines.
        format=f"%(asctime)s.%(msecs)03d nomadtf task {role}: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return _supervise(role)
    except NomadtfError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - one line, as the command line prints it
        if debug:
            raise
        print(f"unexpected error: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return UNEXPECTED_EXIT


def _supervise(role: str) -> int:
    """Build the task's clients and supervisor, run it, and close what it opened.

    Vault: the login (`vault.login`) and, with discovery.consul_token_path, GET /v1/<path>
    """
    environ = dict(os.environ)
    spec = for_task(read_spec_file(spec_path(environ)), environ)
    alloc = AllocInfo.from_environ(environ)
    grant = vault = None
    if spec.discovery.consul_token_path or spec.secrets:
        from nomadtf.servers import vault as vault_api  # hvac only when the job reads Vault

        vault = vault_api.VaultSession(spec.vault.document, on_error=log.warning, budget_s=deadline.server_retry_s())  # one login per task
        if spec.vault.auth == "nomad":
            # Now, before any child starts: Nomad's token file is read and removed
            # (vault.take_token_file). No token at all fails where it always did, later.
            with contextlib.suppress(ServerError):
                vault.client  # noqa: B018
        elif spec.vault.auth == "approle":
            vault_api.approle_ids(environ)  # likewise the AppRole ids' file (secrets/vault_approle)
    try:
        if spec.discovery.consul_token_path:
            try:
                grant = vault_api.ConsulToken.read(vault, spec.discovery.consul_token_path)
            except ServerError as exc:
                # Without its Consul token the task cannot record the failure in Consul.
                raise CannotRecord(f"the tasks' Consul token ({spec.discovery.consul_token_path}): {exc}") from None
            log.info("Consul token read from Vault (%s)%s", grant.path, "; renewed while we run" if grant.lease else "")
        client = consul_client(token=grant.token if grant else None)
        discovery = ConsulDiscovery(spec.name, spec.namespace, client=client, run_id=spec.run_id)
        spec = deadline.counting_from_admission(spec, discovery.admitted_at())
        return Supervisor(spec, role, alloc, discovery, vault=vault).run()
    finally:
        if grant is not None:
            grant.close()
        if vault is not None:
            vault.close()
