"""Certificates for the TLS tests, made by pairmq's local CA (pairmq/cli/local_ca.py): the
pair's CA, a foreign CA, and the server flags that turn TLS on."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from pairmq.cli.local_ca import Issued, LocalCA


@dataclass(frozen=True)
class Pki:
    ca: LocalCA  # the one the servers trust
    foreign: LocalCA  # another one: what it signs must be refused
    server: Issued

    @property
    def ca_file(self) -> str:
        return str(self.ca.cert_path)

    def server_flags(self, issued: Issued | None = None, client_auth: str = "none"
                     ) -> list[str]:
        """Flags of a server with [tls] from this CA (stomp_tls and the rest are given
        apart)."""
        issued = issued or self.server
        return ["--tls-cert", str(issued.cert), "--tls-key", str(issued.key),
                "--tls-ca", self.ca_file, "--tls-client-auth", client_auth]


def make_pki(directory: Path, ca_name: str = "pairmq test CA") -> Pki:
    ca = LocalCA(directory / "ca", ca_name)
    return Pki(ca, LocalCA(directory / "foreign", "some other CA"), ca.issue("server"))


def client_context(ca_file: str, issued: Issued | None = None,
                   version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    """What a third-party client would set up: trust `ca_file`, show `issued` if given."""
    context = ssl.create_default_context(cafile=ca_file)
    if issued is not None:
        context.load_cert_chain(issued.cert, issued.key)
    if version is not None:
        context.minimum_version = context.maximum_version = version
    return context
