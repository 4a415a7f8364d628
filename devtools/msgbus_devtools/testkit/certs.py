"""Certificates made in a test: a CA of its own, a server certificate for 127.0.0.1 and client
certificates, all signed by that CA (the `cryptography` package), as PEM text."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from msgbus.serving import EmbeddedServer


@dataclass(frozen=True)
class Issued:
    cert: str  # PEM
    key: str  # PEM, unencrypted PKCS#8

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """The certificate and key as files (uvicorn reads files)."""
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        cert.write_text(self.cert)
        key.write_text(self.key)
        key.chmod(0o600)
        return cert, key


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


class TestCa:
    """A CA; `server()` and `client()` issue certificates it signs."""

    __test__ = False  # not a pytest class

    def __init__(self, name: str = "msgbus test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = _name(name)
        self.cert = self._sign(x509.CertificateBuilder().subject_name(self._name)
                               .public_key(self._key.public_key())
                               .add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                              critical=True))
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def server(self, host: str = "127.0.0.1") -> Issued:
        return self._issue(host, x509.SubjectAlternativeName([x509.IPAddress(
            ipaddress.ip_address(host))]), ExtendedKeyUsageOID.SERVER_AUTH)

    def client(self, name: str = "msgbus") -> Issued:
        return self._issue(name, x509.SubjectAlternativeName([x509.DNSName(name)]),
                           ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(self, common_name: str, names: x509.SubjectAlternativeName,
               usage: x509.ObjectIdentifier) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._sign(x509.CertificateBuilder().subject_name(_name(common_name))
                          .public_key(key.public_key())
                          .add_extension(names, critical=False)
                          .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        return Issued(cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(key))

    def _sign(self, builder: x509.CertificateBuilder) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        return (builder.issuer_name(self._name)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .sign(self._key, hashes.SHA256()))


@dataclass(frozen=True)
class ServerTls:
    """How a test subscriber serves https: its certificate and key (files), and the CA whose
    client certificates it requires (None: no client certificate asked)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def server(self, app: Any, host: str) -> EmbeddedServer:
        return EmbeddedServer(uvicorn.Config(
            app, host=host, port=0, log_level="warning", access_log=False, lifespan="off",
            ssl_certfile=self.cert_file, ssl_keyfile=self.key_file,
            ssl_ca_certs=str(self.client_ca_file) if self.client_ca_file else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if self.client_ca_file else ssl.CERT_NONE))
