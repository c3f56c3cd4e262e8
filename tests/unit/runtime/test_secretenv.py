"""The child's secret environment (nomadtf.runtime.secretenv): read once per task, names
logged and never values, a failure left for the next try. Vault itself is played by a
stand-in here; the real OpenBao reads are in tests/stack/test_vault.py."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from nomadtf.errors import VaultError
from nomadtf.job.spec import JobSpec
from nomadtf.job.validate import normalize
from nomadtf.runtime.secretenv import SecretEnv

BASE = {"name": "j", "entrypoint": {"script": "t.py"}, "roles": {"chief": {"count": 1}, "worker": {"count": 1}, "ps": {"count": 1}}, "vault": {"policies": ["team"]}}
REFS = [{"path": "secret/team/s3", "key": "access", "env": "AWS_KEY"}, {"path": "secret/team/s3", "key": "cert", "file": "s3.pem"}]


@dataclass
class Fetched:
    env: dict
    leases: list = field(default_factory=list)


class Vault:
    """What SecretEnv asks of vault.VaultSession."""

    def __init__(self, fail: int = 0):
        self.fetches: list = []
        self.fail = fail
        self.closed = False

    def fetch(self, refs, secrets_dir):
        self.fetches.append((refs, secrets_dir))
        if self.fail:
            self.fail -= 1
            raise VaultError("Vault refused secret secret/team/s3: permission denied")
        return Fetched({"AWS_KEY": "AKIA-not-to-be-logged"}, leases=[{"lease_id": "l"}])

    def close(self):
        self.closed = True


def test_a_job_without_secrets_reads_nothing_and_logs_in_nowhere(tmp_path):
    secrets = SecretEnv(JobSpec.from_normalized(normalize(BASE)), tmp_path)
    assert secrets.read_once() == {} and secrets.vault is None
    secrets.close()


def test_secrets_are_read_once_and_only_their_names_are_logged(tmp_path, caplog):
    vault = Vault()
    secrets = SecretEnv(JobSpec.from_normalized(normalize({**BASE, "secrets": REFS})), tmp_path, vault)
    with caplog.at_level(logging.INFO, logger="nomadtf.task"):
        assert secrets.read_once() == {"AWS_KEY": "AKIA-not-to-be-logged"}
        assert secrets.read_once() is secrets.env  # a recovery's new child: no second read
    assert len(vault.fetches) == 1 and vault.fetches[0][1] == tmp_path
    assert "read 2 secret(s) for the training process (AWS_KEY, file s3.pem); leases renewed while we run" in caplog.text
    assert "AKIA" not in caplog.text
    secrets.close()
    assert vault.closed


def test_a_secret_that_cannot_be_had_is_an_error_and_the_next_start_tries_again(tmp_path):
    vault = Vault(fail=1)
    secrets = SecretEnv(JobSpec.from_normalized(normalize({**BASE, "secrets": REFS})), tmp_path, vault)
    with pytest.raises(VaultError, match="permission denied"):
        secrets.read_once()
    assert secrets.env == {} and not secrets.read
    assert secrets.read_once() == {"AWS_KEY": "AKIA-not-to-be-logged"} and len(vault.fetches) == 2
