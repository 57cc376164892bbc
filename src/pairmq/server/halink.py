"""An authenticated HA channel connection over asyncio streams (peer or witness)."""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any

from pairmq.ha import channel as ch


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
                    timeout: float) -> Link:
    """Connector side: answer the challenge, then check the listener's proof."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    link = Link(reader, writer, {})
    try:
        challenge = await link.recv_json(ch.CHALLENGE, timeout)
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


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
