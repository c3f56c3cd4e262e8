"""A private certificate authority for the secure local stack (`dev up --clients N --secure`).

One CA signs every certificate of the stack: Consul and Nomad agents (mutual TLS between
them, HTTPS for their APIs) and OpenBao's listener. Consul and Nomad check each other's
role through the names Consul and Nomad expect (`server.dc1.consul`, `server.global.nomad`,
`client.global.nomad`), so an agent with a client certificate cannot pose as a server.

Keys are ECDSA P-256, written 0600; certificates are valid for 30 days (a dev stack lives
hours). Nothing here talks to the network.

Usage:
    ca = make_ca(tls_dir)                                     # ca.pem, ca-key.pem
    pair = issue(ca, tls_dir, "nomad-server", dns=["server.global.nomad", "localhost"],
                 ips=["198.18.0.1", "127.0.0.1"])
    pair.cert, pair.key                                        # paths for agent configs
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    cert: Path
    key: Path


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    path.chmod(mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def make_ca(folder: Path, name: str = "nomadtf dev stack CA") -> Authority:
    """A new self-signed CA in `folder` (ca.pem 0644, ca-key.pem 0600)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    authority = Authority(folder / "ca.pem", folder / "ca-key.pem")
    _write(authority.key, _key_pem(key), 0o600)
    _write(authority.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return authority


def issue(ca: Authority, folder: Path, name: str, dns: Sequence[str] = (), ips: Sequence[str] = ()) -> CertPair:
    """A leaf certificate `name`.pem / `name`-key.pem, signed by `ca`, for both server and
    client authentication (agents are both), with the given DNS names and IP addresses."""
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0] if dns else name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False  # type: ignore[arg-type]
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    pair = CertPair(folder / f"{name}.pem", folder / f"{name}-key.pem")
    _write(pair.key, _key_pem(key), 0o600)
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return pair
