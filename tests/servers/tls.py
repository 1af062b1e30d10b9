"""Certificates for 127.0.0.1, for the servers the specs run over https."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _certificate(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if subject == "127.0.0.1":
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(signer, hashes.SHA256())


def _write(
    cert: Any, cert_file: Path, key: Any | None = None, key_file: Path | None = None
) -> None:
    from cryptography.hazmat.primitives import serialization

    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None and key_file is not None:
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )


def self_signed(cert_file: Path, key_file: Path) -> None:
    """Write a certificate for 127.0.0.1 that is its own CA, and its key, as PEM files."""
    key = _key()
    _write(_certificate("127.0.0.1", key, "127.0.0.1", key, ca=True), cert_file, key, key_file)


def ca_signed(ca_file: Path, cert_file: Path, key_file: Path) -> None:
    """Write a private CA's certificate, and a certificate for 127.0.0.1 it signed with its key."""
    ca_key, key = _key(), _key()
    _write(_certificate("test CA", ca_key, "test CA", ca_key, ca=True), ca_file)
    _write(_certificate("127.0.0.1", key, "test CA", ca_key, ca=False), cert_file, key, key_file)
