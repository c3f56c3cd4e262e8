"""The secure stack's certificate authority (nomadtf/devstack/tls.py): what each certificate
says (names, addresses, uses), that the CA signed it, and who may read the files. Nothing
talks to the network."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nomadtf.devstack import tls


@pytest.fixture
def ca(tmp_path):
    return tls.make_ca(tmp_path / "tls")


def _cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ca_is_a_ca_that_signs_certificates_and_nothing_below_it_does(ca):
    cert = _cert(ca.cert)
    assert cert.subject == cert.issuer  # self-signed
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "nomadtf dev stack CA"
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.key_encipherment
    cert.verify_directly_issued_by(cert)


def test_a_leaf_names_its_dns_names_and_addresses_and_serves_both_ends(ca, tmp_path):
    pair = tls.issue(ca, tmp_path / "tls", "nomad-server", dns=["server.global.nomad", "localhost"], ips=["198.18.0.1", "127.0.0.1"])
    assert (pair.cert.name, pair.key.name) == ("nomad-server.pem", "nomad-server-key.pem")
    cert = _cert(pair.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["server.global.nomad", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("198.18.0.1"), ipaddress.ip_address("127.0.0.1")]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "server.global.nomad"
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    uses = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(uses) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}  # agents are both


def test_the_ca_signed_every_leaf_and_another_ca_did_not(ca, tmp_path):
    pair = tls.issue(ca, tmp_path / "tls", "consul-client-1", dns=["client.dc1.consul"], ips=["198.18.0.11"])
    leaf, root = _cert(pair.cert), _cert(ca.cert)
    leaf.verify_directly_issued_by(root)
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    assert aki == root.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    stranger = _cert(tls.make_ca(tmp_path / "other").cert)
    with pytest.raises(Exception):  # noqa: B017 - cryptography raises ValueError or InvalidSignature
        leaf.verify_directly_issued_by(stranger)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> None:
    """A TLS handshake between the two contexts in memory (no socket)."""
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    s_side = server.wrap_bio(pipes[0], pipes[1], server_side=True)
    c_side = client.wrap_bio(pipes[2], pipes[3], server_hostname=server_hostname)
    for _ in range(10):
        done = 0
        for side in (c_side, s_side):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        pipes[0].write(pipes[3].read())  # client -> server
        pipes[2].write(pipes[1].read())  # server -> client
        if done == 2:
            return
    raise AssertionError("the handshake did not finish")


def test_a_client_that_trusts_the_ca_completes_a_handshake_for_the_certificates_names(ca, tmp_path):
    """What Consul, Nomad and OpenBao do with the files: the pair as a server's, the CA as a
    client's only trust, the name or address it dialled checked against the certificate."""
    pair = tls.issue(ca, tmp_path / "tls", "openbao", dns=["localhost"], ips=["198.18.0.1"])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pair.cert, pair.key)
    client = ssl.create_default_context(cafile=str(ca.cert))
    _handshake(server, client, "198.18.0.1")
    _handshake(server, client, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _handshake(server, client, "198.18.0.2")
    stranger = ssl.create_default_context(cafile=str(tls.make_ca(tmp_path / "other").cert))
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(server, stranger, "localhost")


def test_keys_are_private_certificates_are_public(ca, tmp_path):
    pair = tls.issue(ca, tmp_path / "tls", "nomad-client-1", dns=["client.global.nomad"])
    assert _mode(ca.key) == _mode(pair.key) == 0o600
    assert _mode(ca.cert) == _mode(pair.cert) == 0o644
    assert _mode(tmp_path / "tls") == 0o700
    key = x509.load_pem_x509_certificate(pair.cert.read_bytes()).public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"


def test_certificates_live_a_month_from_a_few_minutes_ago(ca):
    cert = _cert(ca.cert)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert now - datetime.timedelta(minutes=6) < cert.not_valid_before_utc < now
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == tls.VALIDITY + datetime.timedelta(minutes=5)


def test_issuing_again_replaces_the_pair_and_keeps_it_private(ca, tmp_path):
    first = tls.issue(ca, tmp_path / "tls", "x", dns=["a"])
    before = first.cert.read_bytes()
    first.key.chmod(0o644)
    again = tls.issue(ca, tmp_path / "tls", "x", dns=["b"])
    assert again.cert.read_bytes() != before and _mode(again.key) == 0o600
