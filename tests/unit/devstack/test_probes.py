"""Waiting for the stacks' servers (nomadtf/devstack/probes.py) and reaching them
(protocol.StackApi), with no server: what counts as "not yet", what stops the wait at once,
what a timeout says, and that the clients take the stack's settings, never the shell's."""

from __future__ import annotations

import pytest

from nomadtf.devstack import probes
from nomadtf.devstack.protocol import StackApi
from nomadtf.errors import DevStackError

# Nothing listens on port 1 of the loopback: every call is refused at once.
NOWHERE = StackApi("http://127.0.0.1:1", "http://127.0.0.1:1", "http://127.0.0.1:1")


def test_wait_for_returns_once_the_check_holds_asking_again_on_not_yet(tmp_path):
    answers = iter([False, ConnectionError, None, True])

    def check():
        answer = next(answers)
        if answer is ConnectionError:
            probes.consul_leader(NOWHERE)  # a refused connection: requests' error, "not yet"
        return answer

    probes.wait_for(check, 10, "consul", str(tmp_path / "consul.log"))
    assert next(answers, "drained") == "drained"


def test_wait_for_stops_at_once_on_a_bug():
    calls = []

    def check():
        calls.append(1)
        raise KeyError("stats")

    with pytest.raises(KeyError):
        probes.wait_for(check, 10, "nomad", "/nonexistent.log")
    assert calls == [1]


def test_a_timeout_names_the_component_and_shows_the_end_of_its_log(tmp_path):
    log = tmp_path / "nomad.log"
    log.write_text("".join(f"line {i}\n" for i in range(40)))
    with pytest.raises(DevStackError) as err:
        probes.wait_for(lambda: probes.nomad_leader(NOWHERE), 0.5, "nomad server", str(log))
    text = str(err.value)
    assert text.startswith(f"nomad server did not become healthy within 0s; the end of its log ({log}):\n")
    assert text.endswith("  line 39") and "line 25" in text and "line 24" not in text  # the last 15 lines
    with pytest.raises(DevStackError, match=r"\(no log\)"):
        probes.wait_for(lambda: False, 0.3, "consul", str(tmp_path / "missing.log"))


@pytest.mark.parametrize(
    "probe",
    [
        probes.consul_leader,
        lambda api: probes.consul_node_alive(api, "client-1"),
        probes.openbao_listening,
        probes.openbao_active,
        probes.nomad_leader,
        lambda api: probes.nomad_node_ready(api, 0, "client-1"),
        lambda api: probes.HeartbeatWatch(api, api.nomad_url).heartbeated(),
    ],
)
def test_every_probe_of_a_server_that_does_not_answer_is_not_yet(probe):
    with pytest.raises(probes.NOT_YET):
        probe(NOWHERE)


def test_node_statuses_are_empty_while_nomad_does_not_answer():
    assert probes.node_statuses(NOWHERE) == {}


def test_gpus_are_the_nvidia_gpu_instances_of_a_node():
    node = {
        "NodeResources": {
            "Devices": [
                {"Vendor": "nvidia", "Type": "gpu", "Name": "V100", "Instances": [{"ID": "GPU-1"}, {"ID": "GPU-2"}]},
                {"Vendor": "nvidia", "Type": "gpu", "Name": "A100", "Instances": [{"ID": "GPU-3"}]},
                {"Vendor": "amd", "Type": "gpu", "Instances": [{"ID": "x"}]},
                {"Vendor": "nvidia", "Type": "nic", "Instances": [{"ID": "y"}]},
            ]
        }
    }
    assert probes.node_gpu_count(node) == 3
    assert probes.node_gpu_count({}) == probes.node_gpu_count({"NodeResources": None}) == 0


def test_the_clients_take_the_stacks_settings_not_the_shells(monkeypatch, tmp_path):
    for name, value in {
        "NOMAD_ADDR": "http://10.0.0.1:4646", "NOMAD_TOKEN": "shell", "NOMAD_REGION": "elsewhere", "NOMAD_NAMESPACE": "ml",
        "CONSUL_HTTP_ADDR": "10.0.0.1:8500", "CONSUL_HTTP_TOKEN": "shell", "VAULT_ADDR": "http://10.0.0.1:8200",
        "VAULT_TOKEN": "shell", "REQUESTS_CA_BUNDLE": "/nonexistent.pem",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    ca = tmp_path / "ca.pem"
    api = StackApi("https://198.18.0.1:4646", "https://198.18.0.1:8501", "https://198.18.0.1:8200", str(ca), "n", "c", "v")
    nomad = api.nomad()
    assert (nomad.address, nomad.token, nomad.region, nomad.get_namespace(), nomad.verify) == (
        "https://198.18.0.1:4646", "n", "global", "default", str(ca)
    )
    consul = api.consul()
    assert (consul.http.base_uri, consul.token, consul.http.verify) == ("https://198.18.0.1:8501", "c", str(ca))
    assert not consul.http.session.trust_env and not nomad.session.trust_env
    vault = api.vault()
    assert (vault.url, vault.token, vault.adapter._kwargs["verify"]) == ("https://198.18.0.1:8200", "v", str(ca))
    session = api.session()
    assert not session.trust_env and session.verify == str(ca)
    assert {k: session.headers[k] for k in ("X-Nomad-Token", "X-Consul-Token", "X-Vault-Token")} == {
        "X-Nomad-Token": "n", "X-Consul-Token": "c", "X-Vault-Token": "v"
    }
    assert "'v'" not in repr(api)  # OpenBao's root token is kept out of reprs


def test_a_plain_stacks_clients_send_no_token_of_the_shell(monkeypatch):
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "shell")
    monkeypatch.setenv("VAULT_TOKEN", "shell")
    api = StackApi("http://127.0.0.1:4646", "http://127.0.0.1:8500", "http://127.0.0.1:8200")
    assert api.consul().token is None and api.vault().token == "" and api.verify is True
    assert not {"X-Nomad-Token", "X-Consul-Token", "X-Vault-Token"} & set(api.session().headers)
