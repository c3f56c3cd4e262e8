"""What nomadtf/servers/vault.py retries and what it does not, without a Vault: a transient error is
retried with backoff within the budget, then named with Vault's address; a TLS failure and
a mistake are said at once. Against a real OpenBao: tests/stack/test_vault.py."""

from __future__ import annotations

import time

import hvac
import pytest
import requests

from nomadtf.errors import VaultError
from nomadtf.servers import vault

CLIENT = hvac.Client(url="http://127.0.0.1:1")


def failing(exc, times=None):
    calls = []

    def call():
        calls.append(time.monotonic())
        if times is None or len(calls) <= times:
            raise exc
        return "read"

    return call, calls


def test_a_transient_error_is_retried_with_backoff_until_it_passes():
    call, calls = failing(requests.Timeout(), times=2)
    assert vault._transient_retry(CLIENT, call, "reading secret/a", budget_s=10) == "read"
    assert len(calls) == 3
    assert calls[1] - calls[0] == pytest.approx(0.5, abs=0.2) and calls[2] - calls[1] == pytest.approx(1.0, abs=0.2)


def test_past_the_budget_the_error_names_vault_and_the_attempts():
    call, calls = failing(requests.ConnectionError())
    started = time.monotonic()
    with pytest.raises(VaultError) as err:
        vault._transient_retry(CLIENT, call, "reading secret/a", budget_s=1.0)
    # 0.5 s after the first, the next wait (1 s) would pass the budget: two attempts.
    assert len(calls) == 2 and time.monotonic() - started < 1.0
    assert str(err.value).startswith(
        "Vault at http://127.0.0.1:1 unreachable reading secret/a: ConnectionError on each of 2 attempts over "
    )
    assert "check vault.address (or VAULT_ADDR)" in str(err.value)


def test_tls_and_mistakes_are_not_retried():
    call, calls = failing(requests.exceptions.SSLError("certificate verify failed"))
    with pytest.raises(VaultError, match=r"TLS with Vault at .* failed reading secret/a \(.*\); set vault.ca_file"):
        vault._transient_retry(CLIENT, call, "reading secret/a", budget_s=10)
    assert len(calls) == 1
    call, calls = failing(hvac.exceptions.Forbidden())
    with pytest.raises(hvac.exceptions.Forbidden):
        vault._transient_retry(CLIENT, call, "reading secret/a", budget_s=10)
    assert len(calls) == 1


def test_nomad_s_token_file_is_read_and_removed_before_any_code_can_read_it(tmp_path):
    """The token reaches the supervisor as secrets/vault_token, never in the environment
    (so never in a container's configuration); unless the job hands it to its code
    (vault.token_for_code), the file is gone once read."""
    from nomadtf.servers.vault import take_token_file

    (tmp_path / "vault_token").write_text("s.nomad-token\n")
    assert take_token_file({"NOMAD_SECRETS_DIR": str(tmp_path)}, keep=True) == "s.nomad-token"
    assert (tmp_path / "vault_token").exists()
    assert take_token_file({"NOMAD_SECRETS_DIR": str(tmp_path)}) == "s.nomad-token"
    assert not (tmp_path / "vault_token").exists()
    assert take_token_file({"NOMAD_SECRETS_DIR": str(tmp_path)}) == ""  # none (any more): the login says so
