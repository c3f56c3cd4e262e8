"""What the secure stack is configured with (nomadtf/devstack/security.py): one CA and a
certificate per agent with the names Nomad and Consul check, tokens and gossip keys in a
private file, the agents' own Consul policies, and configs the real nomad and consul accept.
No server runs; bootstrap.py's calls are proven against the real stack (tests/stack)."""

from __future__ import annotations

import base64
import stat
import subprocess
import uuid
from dataclasses import replace

import pytest
from cryptography import x509

from nomadtf.devstack import gobuild, layout, security, wiring
from nomadtf.errors import DevStackError

SERVER_IP = "198.18.0.1"
CLIENT_IPS = ["198.18.0.11", "198.18.0.12"]


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    return security.SecureState.create(tmp_path_factory.mktemp("secure") / "secure", SERVER_IP, CLIENT_IPS)


def _names(path) -> tuple[list[str], list[str]]:
    sans = x509.load_pem_x509_certificate(path.read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return sans.get_values_for_type(x509.DNSName), [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_agent_has_a_certificate_for_its_role_and_its_machines_addresses(state):
    assert _names(state.pair("nomad-server")[0]) == (["server.global.nomad", "localhost"], [SERVER_IP, "127.0.0.1"])
    assert _names(state.pair("consul-server")[0]) == (["server.dc1.consul", "localhost"], [SERVER_IP, "127.0.0.1"])
    assert _names(state.pair("openbao")[0]) == (["localhost"], [SERVER_IP, "127.0.0.1"])
    for i, ip in enumerate(CLIENT_IPS, start=1):
        # A client's certificate can never pose as a server: Nomad and Consul check the role's name.
        assert _names(state.pair(f"nomad-client-{i}")[0]) == (["client.global.nomad", "localhost"], [ip, "127.0.0.1"])
        assert _names(state.pair(f"consul-client-{i}")[0]) == (["client.dc1.consul", "localhost"], [ip, "127.0.0.1"])
    ca = x509.load_pem_x509_certificate(state.ca_file.read_bytes())
    for cert in state.tls_dir.glob("*.pem"):
        if not cert.name.endswith("-key.pem") and cert != state.ca_file:
            x509.load_pem_x509_certificate(cert.read_bytes()).verify_directly_issued_by(ca)


def test_secrets_are_private_files_in_a_private_folder(state):
    assert _mode(state.folder) == 0o700 and _mode(state.tokens_path) == 0o600
    keys = list(state.tls_dir.glob("*-key.pem"))
    assert len(keys) == 1 + 3 + 2 * len(CLIENT_IPS)  # the CA, the server machine's three, two per client
    assert {_mode(k) for k in keys} == {0o600}


def test_tokens_are_fresh_uuids_and_gossip_keys_32_random_bytes(state, tmp_path):
    tokens = state.tokens()
    ids = [tokens.consul_management, tokens.consul_agent, tokens.consul_nomad, tokens.consul_openbao, tokens.nomad_management]
    assert len(set(ids)) == len(ids) and all(uuid.UUID(t).version == 4 for t in ids)
    for key in (tokens.consul_gossip, tokens.nomad_gossip):
        assert len(base64.b64decode(key)) == 32
    assert tokens.consul_gossip != tokens.nomad_gossip
    assert (tokens.openbao_root, tokens.openbao_unseal) == ("", "")  # until `up` initialises OpenBao
    other = security.SecureState.create(tmp_path / "other", SERVER_IP, CLIENT_IPS).tokens()
    assert other.nomad_management != tokens.nomad_management


def test_openbaos_answers_are_kept_beside_the_other_tokens(tmp_path):
    state = security.SecureState.create(tmp_path / "secure", SERVER_IP, CLIENT_IPS[:1])
    before = state.tokens()
    after = state.save_openbao("s.root", "unseal-key")
    assert state.tokens() == after == replace(before, openbao_root="s.root", openbao_unseal="unseal-key")
    assert _mode(state.tokens_path) == 0o600


def test_missing_tokens_say_what_to_do(tmp_path):
    with pytest.raises(DevStackError, match=r"tokens are missing .*run `nomadtf dev up` again"):
        security.SecureState(tmp_path / "nothing").tokens()


def test_only_the_server_machine_gets_the_management_token_and_nomads_gossip_key(state):
    tokens = state.tokens()
    server = state.machine("server")
    assert server.consul_management_token == tokens.consul_management and server.nomad_gossip_key == tokens.nomad_gossip
    assert server.nomad_cert == state.pair("nomad-server") and server.consul_cert == state.pair("consul-server")
    client = state.machine("client", 2)
    assert (client.consul_management_token, client.nomad_gossip_key) == ("", "")
    assert client.nomad_cert == state.pair("nomad-client-2") and client.consul_cert == state.pair("consul-client-2")
    for machine in (server, client):
        assert machine.ca_file == state.ca_file
        assert (machine.consul_agent_token, machine.nomad_consul_token) == (tokens.consul_agent, tokens.consul_nomad)
        assert machine.consul_gossip_key == tokens.consul_gossip


def test_each_agent_policy_has_the_token_the_agents_carry(state):
    tokens = state.tokens()
    assert tokens.consul_policy_secrets() == {
        "nomadtf-dev-agent": tokens.consul_agent,
        "nomadtf-dev-nomad": tokens.consul_nomad,
        "nomadtf-dev-openbao": tokens.consul_openbao,
    }
    assert set(security.CONSUL_POLICIES) == set(tokens.consul_policy_secrets())


def test_the_agents_own_policies_grant_what_each_needs_and_no_more():
    agent, nomad, openbao = (security.CONSUL_POLICIES[f"nomadtf-dev-{n}"] for n in ("agent", "nomad", "openbao"))
    assert agent == {"node_prefix": {"": {"policy": "write"}}, "service_prefix": {"": {"policy": "read"}}}
    # Nomad registers services and reads KV for templates; it writes no key and no node.
    assert nomad["service_prefix"] == {"": {"policy": "write"}} and nomad["key_prefix"] == {"": {"policy": "read"}}
    assert nomad["node_prefix"] == {"": {"policy": "read"}} and "acl" not in nomad
    assert openbao == {"acl": "write"}  # creates and revokes the tasks' tokens; reads nothing else


def test_openbaos_config_is_a_real_server_behind_tls_that_keeps_nothing(state):
    text = security.openbao_config(f"{SERVER_IP}:8200", state.pair("openbao"))
    assert 'storage "inmem" {}' in text
    assert f'address       = "{SERVER_IP}:8200"' in text and f'api_addr = "https://{SERVER_IP}:8200"' in text
    cert, key = state.pair("openbao")
    assert f'tls_cert_file = "{cert}"' in text and f'tls_key_file  = "{key}"' in text
    assert "tls_disable" not in text and "-dev" not in text


def test_the_secure_agent_configs_are_accepted_by_nomad_and_consul(state, tmp_path):
    nomad, consul = gobuild.cache_dir() / "bin" / "nomad", gobuild.cache_dir() / "bin" / "consul"
    if not (nomad.is_file() and consul.is_file()):
        pytest.fail(f"the cached nomad and consul binaries are missing in {nomad.parent}; run scripts/setup")
    for kind, index in (("server", 0), ("client", 1)):
        machine = replace(layout.machine(kind, index, state_dir=tmp_path), security=state.machine(kind, index))
        hcl, json_config = tmp_path / f"{kind}.hcl", tmp_path / f"{kind}.json"
        hcl.write_text(wiring.nomad_config(machine))
        json_config.write_text(wiring.consul_config(machine))
        for check in ([str(nomad), "config", "validate", str(hcl)], [str(consul), "validate", str(json_config)]):
            done = subprocess.run(check, capture_output=True, text=True)
            assert done.returncode == 0, f"{check}:\n{done.stdout}{done.stderr}"
        assert "verify_server_hostname = true" in hcl.read_text()
        assert state.tokens().consul_agent in json_config.read_text()
