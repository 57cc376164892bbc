"""TLS for the client (`stomp+ssl://`, sslEnabled, trustStorePath, keyStorePath,
verifyHost): the context both APIs use, and the blocking client's TLS socket.

The blocking client reads in its I/O thread while callers' threads write. An OpenSSL
connection must not be read and written by two threads at once, so `TlsSocket` keeps
OpenSSL on memory buffers (`ssl.MemoryBIO`) under a lock, and moves the encrypted bytes
over the plain socket itself: a writer encrypts and sends under `_send_lock` (records
leave in the order they were made), the reader decrypts what arrived without waiting for
a writer blocked on a full socket.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

from pairmq.client.errors import ConfigurationError
from pairmq.client.options import ClientOptions

READ_BYTES = 256 * 1024


def client_context(options: ClientOptions) -> ssl.SSLContext | None:
    """The TLS context of a client's connections, or None for plaintext."""
    if not options.tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    if options.trust_store_path:
        _exists(options.trust_store_path, "trustStorePath")
        try:
            context.load_verify_locations(cafile=options.trust_store_path)
        except (ssl.SSLError, OSError) as e:
            raise ConfigurationError(f"trustStorePath {options.trust_store_path}: not a PEM "
                                     f"CA file ({e})") from None
    if options.key_store_path:
        _exists(options.key_store_path, "keyStorePath")
        try:
            context.load_cert_chain(options.key_store_path)
        except (ssl.SSLError, OSError) as e:
            raise ConfigurationError(f"keyStorePath {options.key_store_path}: needs a PEM "
                                     f"certificate and its private key ({e})") from None
    context.check_hostname = options.verify_host
    return context


def _exists(path: str, option: str) -> None:
    if not Path(path).is_file():
        raise ConfigurationError(f"{option} {path}: no such file")


class TlsSocket:
    """A connected plain socket with TLS over it, safe for one reader thread and any
    number of writer threads; the parts of the socket API the blocking client uses."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, host: str) -> None:
        self._sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
        self._lock = threading.Lock()  # the SSL object
        self._send_lock = threading.Lock()  # taken before _lock: records leave in order

    def fileno(self) -> int:
        return self._sock.fileno()

    def setsockopt(self, *args: object) -> None:
        self._sock.setsockopt(*args)  # type: ignore[call-overload]

    def settimeout(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)

    def close(self) -> None:
        self._sock.close()

    def handshake(self, timeout: float) -> None:
        """Before the socket is shared: raises ssl.SSLError (a refused certificate, an old
        protocol) or OSError."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                self._send_pending()
                self._sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = self._sock.recv(READ_BYTES)
                if not data:
                    raise ConnectionError("the server closed the connection during the TLS "
                                          "handshake") from None
                self._incoming.write(data)
            else:
                self._send_pending()
                return

    def _send_pending(self) -> None:
        with self._send_lock:
            with self._lock:
                data = self._outgoing.read()
            if data:
                self._sock.sendall(data)

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            with self._lock:
                self._tls.write(data)
                encrypted = self._outgoing.read()
            self._sock.sendall(encrypted)

    def pending(self) -> bool:
        """Whether decrypted bytes wait (the socket may not look readable then)."""
        with self._lock:
            return self._tls.pending() > 0

    def recv(self, size: int) -> bytes | None:
        """What the server sent, decrypted; b"" once it closed; None when the bytes read
        did not complete a TLS record yet (read again when the socket is readable)."""
        with self._lock:
            pending = self._tls.pending()
        data = b"" if pending else self._sock.recv(READ_BYTES)
        with self._lock:
            if data:
                self._incoming.write(data)
            elif not pending:
                self._incoming.write_eof()
            chunks = []
            try:
                while True:
                    chunk = self._tls.read(size)
                    if not chunk:
                        break
                    chunks.append(chunk)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                return b"".join(chunks)
            reply = self._outgoing.pending > 0  # a post-handshake message to answer
        if reply:
            self._send_pending()
        if chunks:
            return b"".join(chunks)
        return b"" if not data and not pending else None


def tls_failure(error: OSError) -> str:
    """Why a connection attempt failed, in words (a refused certificate says which check)."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS: the server's certificate was refused: {error.verify_message}"
    if isinstance(error, ssl.SSLError):
        return f"TLS handshake failed: {error.reason or error}"
    return str(error) or type(error).__name__
