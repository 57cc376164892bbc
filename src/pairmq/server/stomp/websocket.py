"""STOMP over WebSocket (`[server] stomp_ws`): ws://HOST:PORT/stomp, or wss:// with
`stomp_ws_tls`, for browsers and JavaScript clients (stompjs), as RabbitMQ's Web STOMP
and ActiveMQ's ws transport serve them (docs/operations.md, "STOMP over WebSocket").

A WebSocket client is served by the same `StompConnection` as a TCP one: login, limits,
heart-beats, receipts, flow control and the pair's refusals are that class's, unchanged.
`WebSocketTransport` stands where the socket's asyncio transport would:

- each WebSocket message received (text or binary) goes to `data_received` as bytes; a
  message may hold part of a frame or several, the parser does not mind;
- what the connection writes is cut into frames (protocol/splitter.py) and each frame
  (or heart-beat) is sent as one WebSocket message, by one writer task, in order: a text
  message when the frame is UTF-8 (every frame but a MESSAGE with a binary body), else
  a binary one, so that any body arrives intact;
- reading paused means the handler stops taking messages (aiohttp then stops reading
  the socket once 128 KiB wait); the writer's queue calls `pause_writing()` and
  `resume_writing()` at the high- and low-water marks the connection sets;
- `close()` sends what is queued, then a WebSocket close; `connection_lost` comes once
  the WebSocket has ended, whoever ended it.

Subprotocols `v12.stomp`, `v11.stomp` and `v10.stomp` are negotiated (the client's first
choice that the server knows); a client that offers none, or none of these, is accepted
all the same, as RabbitMQ does: the CONNECT frame's accept-version decides the version.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from pairmq.protocol.splitter import FrameSplitter
from pairmq.server.config import ServerConfig
from pairmq.server.stomp.connection import StompConnection

log = logging.getLogger("pairmq.websocket")

PATH = "/stomp"
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
CLOSE_TIMEOUT_S = 5.0  # how long a client has to answer the server's close
SHUTDOWN_TIMEOUT_S = 3.0  # a stopping server waits this long for its WebSockets to end
MESSAGE_SLACK = 64 * 1024  # a message may exceed max_frame_bytes by this (EOLs, NUL)


class WebSocketTransport(asyncio.Transport):
    """The asyncio transport a `StompConnection` writes to, over one WebSocket."""

    def __init__(self, ws: web.WebSocketResponse, raw: asyncio.Transport | None) -> None:
        super().__init__()
        self._ws = ws
        self._raw = raw  # the TCP (or TLS) transport under it: peername, ssl_object...
        self._protocol: asyncio.BaseProtocol | None = None
        self._splitter = FrameSplitter()
        self._queue: deque[bytes] = deque()  # frames not sent yet, one per message
        self._size = 0  # their bytes, and those of the one being sent
        self._high = 64 * 1024
        self._low = 16 * 1024
        self._writing_paused = False
        self._closing = False
        self._reading = asyncio.Event()  # set: the handler takes messages
        self._reading.set()
        self._wake = asyncio.Event()  # the writer has something to do

    # ------------------------------------------------------------ what asyncio.Transport offers

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._raw.get_extra_info(name, default) if self._raw is not None else default

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return self._reading.is_set()

    def pause_reading(self) -> None:
        if not self._closing:
            self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._size

    def can_write_eof(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return  # as a closed socket's transport, it takes nothing more
        pieces = self._splitter.feed(data)
        if not pieces:
            return
        self._queue.extend(pieces)
        self._size += sum(map(len, pieces))
        self._wake.set()
        if not self._writing_paused and self._size > self._high:
            self._writing_paused = True
            self._call(self._pause_writing)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        """Send what is queued, then close the WebSocket; connection_lost follows."""
        if self._closing:
            return
        self._closing = True
        self._reading.set()  # the handler goes on receiving, to see the close through
        self._wake.set()

    def abort(self) -> None:
        """Close at once: what is queued is dropped."""
        self._closing = True
        self._queue.clear()
        self._size = 0
        self._reading.set()
        self._wake.set()
        if self._raw is not None:
            self._raw.abort()

    # ------------------------------------------------------------ serving the WebSocket

    async def serve(self, conn: StompConnection) -> None:
        """Serve `conn` until the WebSocket ends (the client's close, the network, or the
        server's close), then tell it: `connection_lost`."""
        self._protocol = conn
        writer = asyncio.ensure_future(self._write())
        error: Exception | None = None
        try:
            conn.connection_made(self)
            conn.protocol = "stomp+wss" if self.get_extra_info("ssl_object") else "stomp+ws"
            log.debug("Connection %d from %s is %s (WebSocket subprotocol %s)", conn.conn_id,
                      conn.peer, conn.protocol, self._ws.ws_protocol or "none")
            error = await self._read(conn)
        finally:
            if not self._closing:  # the client or the network ended it: nothing more to send
                self._closing = True
                self._queue.clear()
            self._wake.set()
            try:
                await asyncio.wait_for(writer, CLOSE_TIMEOUT_S + 1)
            except TimeoutError:
                pass
            finally:
                writer.cancel()
                conn.connection_lost(error)

    async def _read(self, conn: StompConnection) -> Exception | None:
        ws = self._ws
        while True:
            if not self._reading.is_set():
                await self._reading.wait()
            msg = await ws.receive()
            kind = msg.type
            if kind is WSMsgType.TEXT:
                data = msg.data.encode()
            elif kind is WSMsgType.BINARY:
                data = msg.data
            elif kind is WSMsgType.ERROR:
                return msg.data if isinstance(msg.data, Exception) else None
            else:  # CLOSE, CLOSING (the server's close), CLOSED
                return None
            if not self._closing:
                conn.data_received(data)

    async def _write(self) -> None:
        ws = self._ws
        queue = self._queue
        try:
            while True:
                if not queue:
                    if self._closing:
                        break
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                piece = queue.popleft()
                try:
                    await ws.send_str(piece.decode())  # valid UTF-8: a text message
                except UnicodeDecodeError:
                    await ws.send_bytes(piece)
                self._size = max(self._size - len(piece), 0)  # 0 already, after abort()
                if self._writing_paused and self._size <= self._low:
                    self._writing_paused = False
                    self._call(self._resume_writing)
            if not ws.closed:
                await ws.close()
        except (ConnectionError, RuntimeError) as e:  # the client went away meanwhile
            log.debug("WebSocket of %s ended while writing: %s",
                      self.get_extra_info("peername"), e)
            self._raw_close()  # the handler sees it end, if it has not yet
        except Exception:
            log.exception("Internal error while writing to a WebSocket")
            self._raw_close()

    def _raw_close(self) -> None:
        if self._raw is not None and not self._raw.is_closing():
            self._raw.close()

    def _pause_writing(self) -> None:
        protocol = self._protocol
        assert isinstance(protocol, asyncio.Protocol)
        protocol.pause_writing()

    def _resume_writing(self) -> None:
        protocol = self._protocol
        assert isinstance(protocol, asyncio.Protocol)
        protocol.resume_writing()

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("Internal error in a WebSocket connection's flow control")


class WebSocketListener:
    """The WebSocket listener of a server: an aiohttp application with one route."""

    def __init__(self, config: ServerConfig, accept: Callable[[], StompConnection],
                 tls: ssl.SSLContext | None) -> None:
        self.config = config
        self._accept = accept
        self._tls = tls
        self._runner: web.AppRunner | None = None

    @property
    def scheme(self) -> str:
        return "wss" if self._tls is not None else "ws"

    async def start(self, address: str) -> None:
        app = web.Application()
        app.router.add_get(PATH, self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        host, _, port = address.rpartition(":")
        site = web.TCPSite(runner, host, int(port), ssl_context=self._tls,
                           reuse_address=True, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    @property
    def address(self) -> str:
        """HOST:PORT it listens on, its real port ("" when not listening)."""
        if self._runner is None or not self._runner.addresses:
            return ""
        host, port = self._runner.addresses[0][:2]
        return f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}{PATH}"

    async def close(self) -> None:
        """Stop listening, and wait (a little) for the WebSockets still open to end: the
        server closed their connections first, each with an ERROR saying why."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, compress=False, autoping=True,
                                   timeout=CLOSE_TIMEOUT_S,
                                   max_msg_size=self.config.max_frame_bytes + MESSAGE_SLACK)
        ready = ws.can_prepare(request)
        if not ready.ok:
            return web.Response(status=426, headers={"Upgrade": "websocket"},
                                text="STOMP over WebSocket: connect to this URL with a "
                                     "WebSocket client (subprotocol v12.stomp)\n")
        await ws.prepare(request)
        if ready.protocol is None:
            log.debug("WebSocket client %s offered no STOMP subprotocol (%s): accepted",
                      request.remote, request.headers.get("Sec-WebSocket-Protocol", "none"))
        await WebSocketTransport(ws, request.transport).serve(self._accept())
        return ws
