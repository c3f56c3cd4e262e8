"""The secret environment of our child: the job's secrets (job.json `secrets`) read from
Vault once per task, one login whose leases and token are renewed until the task exits,
handed to the child as the environment variables the job named and as 0600 files in the
allocation's secrets directory. hvac is imported only for a job that has secrets; no value
is ever logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

from nomadtf.job.spec import JobSpec
from nomadtf.runtime import deadline
from nomadtf.runtime.codeuser import CodeUser

log = logging.getLogger("nomadtf.task")


class SecretEnv:
    """Usage:
    secrets = SecretEnv(spec, alloc.secrets_dir, vault)   # vault: the task's VaultSession, or None
    env = secrets.read_once()   # {} for a job without secrets; VaultError when one cannot be had
    secrets.close()             # stops the renewers; revokes a token we logged in for
    """

    def __init__(self, spec: JobSpec, secrets_dir: Path, vault=None, user: CodeUser | None = None):
        self.spec = spec
        self.user = user  # the code's own uid owns its secret files (codeuser.py)
        self.secrets_dir = secrets_dir
        self.vault = vault  # vault.VaultSession: the task's one Vault login (None: not yet)
        self.env: dict[str, str] = {}
        self.read = False

    def read_once(self) -> dict[str, str]:
        """The child's secret variables, read on the first call only (Vault retried for the
        server retry budget; a missing or forbidden path fails at once: VaultError).

        GET /v1/<mount>/data/<rest> ; GET /v1/<path>  (vault.read_one, per referenced secret)
        """
        if self.read or not self.spec.secrets:
            return self.env
        from nomadtf.servers import vault as vault_api  # hvac only when the job has secrets

        if self.vault is None:
            self.vault = vault_api.VaultSession(self.spec.vault.document, on_error=log.warning, budget_s=deadline.server_retry_s())
        fetched = self.vault.fetch(list(self.spec.secrets), self.secrets_dir)
        self.env, self.read = fetched.env, True
        if self.user is not None:
            for secret in self.spec.secrets:
                if secret.get("file"):
                    self.user.own(self.secrets_dir / secret["file"])
        log.info("read %d secret(s) for the training process (%s)%s", len(self.spec.secrets), ", ".join(
            s.get("env") or f"file {s['file']}" for s in self.spec.secrets), "; leases renewed while we run" if fetched.leases else "")
        return self.env

    def close(self) -> None:
        if self.vault is not None:
            self.vault.close()
