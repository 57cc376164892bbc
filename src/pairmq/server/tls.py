"""TLS for every port of a server and of the witness (issue 19, docs/security.md).

One `[tls]` table (cert, key, ca, client_auth) gives each listener and each connector the
context it needs:

- `stomp`: the STOMP listener (`[server] stomp_tls`); client certificates per
  `client_auth` ("none", "optional", "required"), checked against `ca`;
- `admin`: the management port (`[server] admin_tls`), no client certificates;
- `peer_server` / `peer_client`: the HA channel and the witness (`[ha] tls`), mutual: both
  sides show a certificate from `ca`, and a peer whose certificate another CA signed never
  gets as far as the shared secret. A peer is known by its CA and the secret, not by its
  host name (pairs are often configured by IP address): host names are not checked.

Modern defaults: TLS 1.2 and later, no compression, OpenSSL's default ciphers.

**Reload without a restart** (SIGHUP, `pairmq reload`): `reload()` builds every context
again from the files, and only once all of them load does it put them in place: a bad
file leaves the running ones serving and says which file is wrong. New connections use
the new contexts: a listener keeps the context it was created with, whose SNI callback
hands each new handshake to the current one (OpenSSL then takes the certificate and the
CA store of that one; the client-certificate mode stays the listener's). Connections
already open keep what they negotiated.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLIENT_AUTH = ("none", "optional", "required")
PURPOSES = ("stomp", "admin", "peer_server", "peer_client")


class TlsError(Exception):
    """A certificate, key or CA file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    cert: str  # PEM: the server's certificate, then its chain
    key: str  # PEM: its private key
    ca: str  # PEM: the CA(s) that sign clients' (when asked) and the pair's certificates
    client_auth: str = "none"

    @property
    def configured(self) -> bool:
        return bool(self.cert and self.key)


def _context(server_side: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side
                             else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    return context


def _load_chain(context: ssl.SSLContext, files: TlsFiles) -> None:
    for what, path in (("cert", files.cert), ("key", files.key)):
        if not Path(path).is_file():
            raise TlsError(f"[tls] {what} {path}: no such file")
    try:
        context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as e:
        raise TlsError(f"[tls] cert {files.cert} and key {files.key} cannot be used "
                       f"together: {e}") from None


def _load_ca(context: ssl.SSLContext, files: TlsFiles) -> None:
    if not files.ca:
        raise TlsError("[tls] ca is required: it verifies client certificates and the "
                       "pair's peers")
    if not Path(files.ca).is_file():
        raise TlsError(f"[tls] ca {files.ca}: no such file")
    try:
        context.load_verify_locations(cafile=files.ca)
    except (ssl.SSLError, OSError) as e:
        raise TlsError(f"[tls] ca {files.ca} cannot be used: {e}") from None


def build(files: TlsFiles, purpose: str) -> ssl.SSLContext:
    """A new context for one purpose (see the module's docstring), from the files now."""
    if purpose == "peer_client":
        context = _context(server_side=False)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        _load_chain(context, files)
        _load_ca(context, files)
        return context
    context = _context(server_side=True)
    _load_chain(context, files)
    if purpose == "peer_server":
        context.verify_mode = ssl.CERT_REQUIRED
        _load_ca(context, files)
    elif purpose == "stomp" and files.client_auth != "none":
        context.verify_mode = ssl.CERT_REQUIRED if files.client_auth == "required" \
            else ssl.CERT_OPTIONAL
        _load_ca(context, files)
    return context


class TlsContexts:
    """The contexts of a server (or a witness): built at start, replaced by `reload()`."""

    def __init__(self, files: TlsFiles, purposes: tuple[str, ...] = PURPOSES) -> None:
        self.files = files
        self.purposes = purposes
        self._current = self._build_all(files)
        self._listening: dict[str, ssl.SSLContext] = {}

    def _build_all(self, files: TlsFiles) -> dict[str, ssl.SSLContext]:
        return {purpose: build(files, purpose) for purpose in self.purposes}

    def listener(self, purpose: str) -> ssl.SSLContext:
        """The context to create a listener with: it hands every handshake to the current
        context of `purpose` (so a reload reaches new connections)."""
        context = self._listening.get(purpose)
        if context is None:
            context = build(self.files, purpose)

            def to_current(ssl_object: ssl.SSLObject | ssl.SSLSocket, _name: str | None,
                           _context: ssl.SSLContext) -> None:
                ssl_object.context = self._current[purpose]

            context.sni_callback = to_current
            self._listening[purpose] = context
        return context

    def current(self, purpose: str) -> ssl.SSLContext:
        """The context a new outgoing connection uses."""
        return self._current[purpose]

    def reload(self) -> None:
        """Read the files again; raises TlsError (and keeps the running contexts) if one
        cannot be used."""
        self._current = self._build_all(self.files)


def common_name(peer_cert: dict[str, Any] | None) -> str:
    """The common name of a verified peer certificate (as `getpeercert()` gives it, or the
    transport's "peercert"); "" when there is none."""
    for rdn in (peer_cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def etcd_tls_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """The client context for etcds://: etcd's certificate checked against `ca`, this
    server's certificate offered."""
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    return context
