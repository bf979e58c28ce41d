"""Keys and certificates: a self-signed CA and server certificate for TLS, and the SuperNodes'
ECDSA key pairs for node authentication."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from .config import LOCAL_HOSTS


def make_certs(
    certs_dir: str | os.PathLike, names: list[str] | tuple[str, ...] = LOCAL_HOSTS, days: int = 365
) -> dict[str, Path]:
    """A self-signed CA and a server certificate signed by it, valid for ``names`` (IP
    addresses and DNS names in the SAN): ``ca.crt``, ``server.pem``, ``server.key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    certs_dir = Path(certs_dir)
    certs_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedpriv"),
            x509.NameAttribute(NameOID.COMMON_NAME, "fedpriv deployment CA"),
        ]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans: list = []
    for name in dict.fromkeys(names):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedpriv"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "fedpriv superlink"),
                ]
            )
        )
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": certs_dir / "ca.crt", "cert": certs_dir / "server.pem", "key": certs_dir / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        paths["key"],
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return paths


def make_node_keys(private_path: str | os.PathLike, public_path: str | os.PathLike) -> None:
    """An ECDSA P-384 key pair in OpenSSH format: the private key for
    ``flower-supernode --auth-supernode-private-key``, the public key for ``flwr supernode register``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    Path(private_path).parent.mkdir(parents=True, exist_ok=True)
    Path(public_path).parent.mkdir(parents=True, exist_ok=True)
    _write_private(
        Path(private_path),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    Path(public_path).write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def verify_server_cert(ca_path: str | os.PathLike, cert_path: str | os.PathLike, name: str) -> None:
    """Raise unless ``cert_path`` chains to the CA of ``ca_path`` and is valid for ``name`` (a
    DNS name or an IP address) as a TLS server certificate."""
    from cryptography import x509
    from cryptography.x509.verification import PolicyBuilder, Store

    ca = x509.load_pem_x509_certificate(Path(ca_path).read_bytes())
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    try:
        subject = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    PolicyBuilder().store(Store([ca])).build_server_verifier(subject).verify(cert, [])
