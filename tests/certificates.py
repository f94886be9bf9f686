"""Certificates made at test time: a CA, and server and client certificates it signs.

EC P-256 keys, quick to make; nothing is read from or downloaded to anywhere but
the test's own folder.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its unencrypted private key, as PEM files."""

    cert: Path
    key: Path


def _name(common_name: str, *more_common_names: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, name)
            for name in (common_name, *more_common_names)
        ]
    )


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class TestCA:
    """A CA whose certificate is `cert` (the file a client or server is told to trust)."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = folder / f"{name}-ca.pem"
        self.cert.write_bytes(self._certificate.public_bytes(serialization.Encoding.PEM))

    def server(self, name: str, ip: str = "127.0.0.1") -> Issued:
        """A server certificate for `ip` (an IP subject alternative name)."""
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))])
        return self._issue(name, ExtendedKeyUsageOID.SERVER_AUTH, san)

    def client(self, common_name: str, *more_common_names: str) -> Issued:
        """A client certificate whose subject is CN=`common_name` (followed by a CN for
        each of `more_common_names`)."""
        return self._issue(common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None, more_common_names)

    def _issue(
        self,
        common_name: str,
        usage: x509.ObjectIdentifier,
        san: x509.SubjectAlternativeName | None,
        more_common_names: tuple[str, ...] = (),
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, *more_common_names))
            .issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.folder / f"{common_name}.pem", self.folder / f"{common_name}-key.pem")
        issued.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(key, issued.key)
        return issued
