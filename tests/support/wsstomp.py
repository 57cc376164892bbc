"""A small STOMP client over WebSocket (aiohttp's client), for exact checks of the
WebSocket listener: every message received is kept as it came (text or binary), and each
must hold exactly one frame or one heart-beat. Every wait is bounded."""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass

import aiohttp

from pairmq.protocol import Frame, FrameParser, serialize

WAIT = 10.0
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")


class Closed(Exception):
    """The server closed the WebSocket."""


@dataclass
class Received:
    kind: aiohttp.WSMsgType  # TEXT or BINARY
    data: bytes
    at: float  # time.monotonic() of its arrival

    @property
    def heartbeat(self) -> bool:
        return self.data in (b"\n", b"\r\n")


class WsStomp:
    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse,
                 version: str = "1.2") -> None:
        self.session = session
        self.ws = ws
        self.version = version
        self.received: list[Received] = []

    @classmethod
    async def open(cls, url: str, protocols: tuple[str, ...] = SUBPROTOCOLS,
                   ssl_context: ssl.SSLContext | None = None) -> WsStomp:
        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(url, protocols=protocols, ssl=ssl_context or True,
                                          autoping=True, max_msg_size=0)
        except BaseException:
            await session.close()
            raise
        return cls(session, ws)

    @property
    def protocol(self) -> str | None:
        """The subprotocol the server chose (None: none)."""
        return self.ws.protocol

    def receive_buffer(self, size: int) -> None:
        """Make the socket's kernel receive buffer `size` bytes (no autotuning: a client
        that stops reading soon stops the server's writes)."""
        sock = self.ws.get_extra_info("socket")
        assert sock is not None, "no socket under the WebSocket"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)

    async def close(self) -> None:
        if not self.ws.closed:
            await self.ws.close()
        await self.session.close()

    async def __aenter__(self) -> WsStomp:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ sending

    async def send_raw(self, data: bytes, binary: bool | None = None) -> None:
        """One WebSocket message, as given (several frames, part of one, a heart-beat): a
        binary one if `binary`, else a text one (None: text when `data` is UTF-8)."""
        if binary is None:
            try:
                data.decode()
            except UnicodeDecodeError:
                binary = True
        if binary:
            await self.ws.send_bytes(data)
        else:
            await self.ws.send_str(data.decode())

    async def send(self, command: str, headers: dict[str, str] | None = None,
                   body: bytes = b"", binary: bool | None = None) -> None:
        await self.send_raw(serialize(Frame(command, headers or {}, body), self.version),
                            binary)

    # ------------------------------------------------------------ receiving

    async def receive(self, timeout: float = WAIT) -> Received:
        """The next message, frame or heart-beat; Closed when the WebSocket ends."""
        msg = await self.ws.receive(timeout)
        if msg.type is aiohttp.WSMsgType.TEXT:
            data = msg.data.encode()
        elif msg.type is aiohttp.WSMsgType.BINARY:
            data = msg.data
        else:
            raise Closed(f"{msg.type.name} {msg.data!r} {msg.extra!r}")
        got = Received(msg.type, data, time.monotonic())
        self.received.append(got)
        return got

    async def frame(self, timeout: float = WAIT) -> Frame:
        """The next frame, heart-beats skipped; its message must hold that frame alone."""
        deadline = time.monotonic() + timeout
        while True:
            got = await self.receive(max(deadline - time.monotonic(), 0.01))
            if not got.heartbeat:
                return one_frame(got.data, self.version)

    async def expect(self, command: str, timeout: float = WAIT) -> Frame:
        """The next frame, which must be a `command` ("": any)."""
        frame = await self.frame(timeout)
        assert not command or frame.command == command, f"expected {command}, got {frame}"
        return frame

    async def closed(self, timeout: float = WAIT) -> None:
        """Wait for the server to close the WebSocket (heart-beats skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = await self.receive(max(deadline - time.monotonic(), 0.01))
            except Closed:
                return
            assert got.heartbeat, f"a frame instead of the close: {got.data!r}"

    # ------------------------------------------------------------ STOMP

    async def connect(self, login: str | None = None, passcode: str | None = None,
                      headers: dict[str, str] | None = None, expect: str = "CONNECTED"
                      ) -> Frame:
        h = {"accept-version": "1.2", "host": "pairmq"}
        if login is not None:
            h["login"] = login
        if passcode is not None:
            h["passcode"] = passcode
        h.update(headers or {})
        await self.send("CONNECT", h)
        frame = await self.expect(expect)
        if frame.command == "CONNECTED":
            self.version = frame.headers.get("version", "1.0")
        return frame


def one_frame(data: bytes, version: str = "1.2") -> Frame:
    """The frame `data` holds; fails unless it holds exactly one, complete."""
    parser = FrameParser(version=version)
    frames = parser.feed(data)
    assert len(frames) == 1 and parser.buffered == 0, \
        f"a WebSocket message must hold one frame, this one holds {len(frames)} " \
        f"(+{parser.buffered} bytes): {data[:200]!r}"
    return frames[0]
