"""A local certificate authority, for trying TLS out (`pairmq up`) and for tests: a CA, and
certificates it signs for servers (by host name and IP address) and clients (by user),
as PEM files. Production certificates come from the operator's own CA (docs/security.md).

Needs the `cryptography` package (in the `dev` extra).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

ONE_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    cert: Path  # PEM: the certificate, then the CA's (its chain)
    key: Path  # PEM: its private key

    @property
    def both(self) -> Path:
        """A PEM file with the certificate and the key (a client's keyStorePath)."""
        path = self.cert.with_name(self.cert.stem + "-with-key.pem")
        if not path.exists():
            path.write_bytes(self.cert.read_bytes() + self.key.read_bytes())
            path.chmod(0o600)
        return path


class LocalCA:
    """A CA kept in `directory` (ca.pem, ca.key): created on first use, reused after."""

    def __init__(self, directory: Path, name: str = "pairmq local CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        self.directory = directory
        self.cert_path = directory / "ca.pem"
        key_path = directory / "ca.key"
        directory.mkdir(parents=True, exist_ok=True)
        if self.cert_path.exists() and key_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{key_path} is not the EC key pairmq made: remove "
                                 f"{directory} to make a new local CA")
            self._key = key
            self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            return
        self._key = _new_key()
        subject = _name(name)
        now = datetime.datetime.now(datetime.UTC)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(self._key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - ONE_DAY).not_valid_after(now + 3650 * ONE_DAY)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                  critical=True)
                   .add_extension(x509.KeyUsage(
                       digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, encipher_only=False,
                       decipher_only=False), critical=True))
        self._cert = _sign(builder, self._key)
        _write_key(key_path, self._key)
        self.cert_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
              client: bool = False, days: int = 825, expired: bool = False) -> Issued:
        """A certificate for a server (`hosts`: its names and IP addresses) or, with
        `client`, for a user (its CN); `expired` makes one whose validity ended."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID

        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        start, end = (now - 30 * ONE_DAY, now - ONE_DAY) if expired \
            else (now - ONE_DAY, now + days * ONE_DAY)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        usage = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else \
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (x509.CertificateBuilder().subject_name(_name(name))
                   .issuer_name(self._cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
        if names and not client:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = _sign(builder, self._key)
        stem = self.directory / name.replace(" ", "-")
        cert_path, key_path = stem.with_suffix(".pem"), stem.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM)
                              + self._cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return Issued(cert_path, key_path)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sign(builder, key):
    from cryptography.hazmat.primitives import hashes

    return builder.sign(key, hashes.SHA256())


def _write_key(path: Path, key) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
