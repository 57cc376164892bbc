"""An authenticated HA channel connection over asyncio streams (peer or witness)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from asyncio import sslproto
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pairmq.ha import channel as ch
from pairmq.server.tls import TlsContexts


class Link:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 hello: dict[str, Any], codec: ch.MessageReader | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.hello = hello  # what the other side said about itself
        self._codec = codec or ch.MessageReader()
        self._queue: deque[tuple[int, bytes]] = deque()
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def recv(self, timeout: float | None = None) -> tuple[int, bytes]:
        while not self._queue:
            data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
            if not data:
                raise ConnectionError("HA channel closed by the other side")
            self._queue.extend(self._codec.feed(data))
        return self._queue.popleft()

    async def recv_json(self, expected: int, timeout: float | None = None) -> dict[str, Any]:
        kind, payload = await self.recv(timeout)
        if kind == ch.REFUSED:
            raise ch.ChannelError(ch.decode_json(payload).get("reason", "refused"))
        if kind != expected:
            raise ch.ChannelError(f"expected {ch.NAMES.get(expected)}, got {ch.NAMES.get(kind)}")
        return ch.decode_json(payload)

    def send(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    def send_parts(self, parts: list[bytes]) -> None:
        """One message in pieces (a header, then records), written as they are: the
        transport sends them with one vectored write, nothing joined."""
        if not self.writer.is_closing():
            self.writer.writelines(parts)

    def send_json(self, kind: int, obj: dict[str, Any]) -> None:
        self.send(ch.encode_json(kind, obj))

    @property
    def buffered(self) -> int:
        transport = self.writer.transport
        return transport.get_write_buffer_size() if transport else 0

    async def drain(self) -> None:
        await self.writer.drain()

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()


Accepted = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HANDSHAKE_TIMEOUT_S = 5
REFUSALS_EVERY_S = 60.0  # the same refusal of the same host is told once this often


async def listen(accepted: Accepted, host: str, port: int, tls: ssl.SSLContext | None,
                 refused: Callable[[str, str], None]) -> asyncio.Server:
    """A listener of the HA channel or the witness. With `tls`, each connection's TLS
    handshake runs first, and `accepted` only sees a peer whose certificate the CA signed;
    `refused(peer, why)` is told of the others (the same refusal of the same host once
    every REFUSALS_EVERY_S: a peer retries every heartbeat). asyncio's own TLS listener
    (and uvloop's) drops them without a word, so each connection gets asyncio's TLS
    protocol with a waiter of ours; upgrading a plain connection later (start_tls) would
    race with the peer's first TLS bytes, which a plain stream's buffer may hold."""
    if tls is None:
        return await asyncio.start_server(accepted, host, port, reuse_address=True)
    loop = asyncio.get_running_loop()
    handshakes: set[asyncio.Task[None]] = set()
    refusals: dict[tuple[str, str], float] = {}  # (host, why) -> when last told

    class Secured(asyncio.StreamReaderProtocol):
        """Streams over the TLS transport, once the handshake succeeded."""

        transport: asyncio.BaseTransport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self.transport = transport

    class PeerTls(sslproto.SSLProtocol):
        peer = "?"  # known once connected: a refusal names it

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.peer = _address(transport.get_extra_info("peername"))
            super().connection_made(transport)

    async def handshake(waiter: asyncio.Future[None], protocol: Secured,
                        reader: asyncio.StreamReader, tls_protocol: PeerTls) -> None:
        try:
            await waiter
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            if isinstance(e, ssl.SSLError):
                why = _tls_reason(e)
            elif isinstance(e, ConnectionError):
                why = "the other side ended it (does it trust this side's certificate?)"
            else:
                why = str(e) or "no answer in time"
            peer = tls_protocol.peer
            now = time.monotonic()
            said = (peer.rpartition(":")[0], why)  # a peer that retries: once a minute
            if now - refusals.get(said, -REFUSALS_EVERY_S) >= REFUSALS_EVERY_S:
                if len(refusals) >= 1000:  # many hosts: forget the oldest half
                    for key in sorted(refusals, key=refusals.__getitem__)[:500]:
                        del refusals[key]
                refusals[said] = now
                refused(peer, f"TLS handshake failed: {why}")
            return
        transport = protocol.transport
        assert isinstance(transport, asyncio.WriteTransport)
        await accepted(reader, asyncio.StreamWriter(transport, protocol, reader, loop))

    def connection() -> PeerTls:
        waiter = loop.create_future()
        reader = asyncio.StreamReader()
        protocol = Secured(reader)
        tls_protocol = PeerTls(loop, protocol, tls, waiter, server_side=True,
                               ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        task = loop.create_task(handshake(waiter, protocol, reader, tls_protocol))
        handshakes.add(task)
        task.add_done_callback(handshakes.discard)
        return tls_protocol

    return await loop.create_server(connection, host, port, reuse_address=True)


def logged_refusals(log: logging.Logger, what: str) -> Callable[[str, str], None]:
    """`listen`'s `refused`: a WARNING naming the peer (`what`: "HA connection")."""
    return lambda peer, why: log.warning("Refused %s from %s: %s", what, peer, why)


def _address(peer: Any) -> str:
    return f"{peer[0]}:{peer[1]}" if peer else "?"


async def accept_link(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: str,
                      hello: dict[str, Any], timeout: float) -> Link:
    """Listener side: challenge, check the proof, prove ourselves back."""
    nonce = ch.new_nonce()
    writer.write(ch.encode_json(ch.CHALLENGE, {"nonce": nonce}))
    link = Link(reader, writer, {})
    proof = await link.recv_json(ch.PROOF, timeout)
    if not ch.check_proof(secret, nonce, "connector", proof.get("proof")):
        writer.write(ch.encode_json(ch.REFUSED, {"reason": "authentication failed: the HA "
                                                 "secrets differ"}))
        await _close_soon(writer)
        raise ch.ChannelError("authentication failed: wrong shared secret")
    their_nonce = proof.get("nonce")
    if not isinstance(their_nonce, str):
        raise ch.ChannelError("no nonce in the proof")
    link.hello = proof.get("hello") or {}
    mismatch = ch.pair_mismatch(hello, link.hello)
    if mismatch:
        writer.write(ch.encode_json(ch.REFUSED, {"reason": mismatch}))
        await _close_soon(writer)
        raise ch.ChannelError(mismatch)
    writer.write(ch.encode_json(ch.WELCOME, {"proof": ch.proof(secret, their_nonce, "listener"),
                                             "hello": hello}))
    return link


async def open_link(host: str, port: int, secret: str, hello: dict[str, Any],
                    timeout: float, tls: ssl.SSLContext | None = None) -> Link:
    """Connector side (over TLS with `tls`): answer the challenge, then check the
    listener's proof."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=tls), timeout)
    except ssl.SSLError as e:
        raise ch.ChannelError(f"TLS handshake failed: {_tls_reason(e)}") from None
    link = Link(reader, writer, {})
    try:
        try:
            challenge = await link.recv_json(ch.CHALLENGE, timeout)
        except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError) as e:
            # TLS 1.3: the listener checks this server's certificate after our side of the
            # handshake is done; its refusal is an alert, or just the end of the connection
            if tls is None:
                raise
            said = _tls_reason(e) if isinstance(e, ssl.SSLError) else "closed the connection"
            raise ch.ChannelError(f"TLS: the other side {said} before its challenge: it "
                                  "refuses this server's certificate unless its [tls] ca "
                                  "signed it") from None
        nonce = ch.new_nonce()
        writer.write(ch.encode_json(ch.PROOF, {
            "proof": ch.proof(secret, str(challenge.get("nonce")), "connector"),
            "nonce": nonce, "hello": hello}))
        welcome = await link.recv_json(ch.WELCOME, timeout)
        if not ch.check_proof(secret, nonce, "listener", welcome.get("proof")):
            raise ch.ChannelError("the other side does not know the shared secret")
    except BaseException:
        writer.close()
        raise
    link.hello = welcome.get("hello") or {}
    return link


async def _close_soon(writer: asyncio.StreamWriter) -> None:
    try:
        await asyncio.wait_for(writer.drain(), 1)
    except (OSError, TimeoutError):
        pass
    writer.close()


class HasTls(Protocol):
    """A server whose [ha] tls may be on: its contexts (server/tls.py) and its config."""

    tls: TlsContexts | None
    config: Any


def peer_tls(server: HasTls, purpose: str) -> ssl.SSLContext | None:
    """The context for the HA channel or the witness ([ha] tls), or None (plaintext)."""
    if server.tls is None or not server.config.tls:
        return None
    return server.tls.listener(purpose) if purpose == "peer_server" \
        else server.tls.current(purpose)


def _tls_reason(error: ssl.SSLError) -> str:
    """What an SSLError says, without OpenSSL's file and line."""
    return getattr(error, "verify_message", None) or error.reason or str(error)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
