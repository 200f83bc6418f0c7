"""Certificates for TLS tests, made with ``cryptography`` in a temporary folder: a CA, a server
certificate for 127.0.0.1 and localhost, and client certificates."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "Authority",
    "Issued",
    "Pki",
    "encrypted_key",
    "fingerprint",
    "make_pki",
    "peer_fingerprint",
]

PrivateKey = ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: PrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM."""

    cert: bytes
    key: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        cert_path.write_bytes(self.cert)
        key_path.write_bytes(self.key)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.cert)


class Authority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, name: str = "batching test CA") -> None:
        self.key = _key()
        now = dt.datetime.now(dt.UTC)
        self.name = _name(name)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, *, server: bool) -> Issued:
        """A leaf certificate: for a server (SANs 127.0.0.1 and localhost) or a client."""
        key = _key()
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def encrypted_key(password: bytes) -> bytes:
    """A fresh private key, encrypted with ``password``."""
    return _key_pem(_key(), password)


@dataclass(frozen=True)
class Pki:
    """Files in one folder: the CA, the server's certificate and key, a client's."""

    folder: Path
    authority: Authority
    server: Issued
    client: Issued

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.folder / "server.pem"

    @property
    def key(self) -> Path:
        return self.folder / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.folder / "client.key"

    def client_context(self, *, with_client_cert: bool = False) -> ssl.SSLContext:
        """What a client that trusts this CA uses (and presents the client certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if with_client_cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def make_pki(folder: Path, name: str = "batching test CA") -> Pki:
    """A CA, a server certificate and a client certificate, written to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    authority = Authority(name)
    pki = Pki(
        folder,
        authority,
        authority.issue("batching server", server=True),
        authority.issue("batching client", server=False),
    )
    pki.ca.write_bytes(authority.pem)
    pki.server.write(pki.cert, pki.key)
    pki.client.write(pki.client_cert, pki.client_key)
    return pki


def fingerprint(cert_pem: bytes) -> str:
    """The SHA-256 of a PEM certificate's DER form, in hex."""
    der = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def peer_fingerprint(sock: ssl.SSLSocket) -> str:
    """The SHA-256 of the certificate the peer of ``sock`` presented, in hex."""
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()
