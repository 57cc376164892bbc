"""The blocking client's I/O: its socket, the one thread that opens and reads it and keeps
time (heart-beats, retries), and the writes any thread makes of what the engine produced.

The blocking client (client/blocking.py) and this thread call the engine under one lock;
the thread notifies the lock's condition after each batch it applies, and hands what the
batch finished (outbox rows forwarded or renumbered, failover events) to the client.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable

from pairmq.client.engine import Engine
from pairmq.client.errors import ClientError
from pairmq.client.link import Link
from pairmq.client.options import Address, ClientOptions
from pairmq.client.results import FailoverEvent
from pairmq.client.tls import TlsSocket, client_context, tls_failure

log = logging.getLogger("pairmq.client")

READ_BYTES = 256 * 1024

# (outbox rows forwarded, failover events, outbox rows renumbered): after every batch
AfterBatch = Callable[[list[int], list[FailoverEvent], list[tuple[int, dict[str, str]]]], None]


class BlockingIO:
    """The socket of one blocking client, and its I/O thread."""

    def __init__(self, engine: Engine, lock: threading.Lock, cond: threading.Condition,
                 options: ClientOptions, after_batch: AfterBatch) -> None:
        self._engine = engine
        self._lock = lock  # the engine's (the client's)
        self._cond = cond  # ... and its condition
        self.options = options
        self._after_batch = after_batch
        self._write_lock = threading.Lock()
        self._socket: tuple[int, socket.socket | TlsSocket] | None = None
        self._tls = client_context(options)  # None: plaintext
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="pairmq-client", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end (unless it is the caller: a failover listener may
        close the client)."""
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ------------------------------------------------------------ writing (any thread)

    def flush(self, block: bool = True) -> None:
        """Write what the engine produced, in order, on its current socket."""
        engine = self._engine
        while True:
            if not self._write_lock.acquire(blocking=block):
                return
            try:
                while True:
                    with self._lock:
                        socket_id, data = engine.take_output()
                        current = self._socket
                    if not data:
                        break
                    if current is None or current[0] != socket_id:
                        continue  # that socket is gone: the engine writes again as needed
                    try:
                        current[1].sendall(data)
                    except OSError as e:
                        with self._cond:
                            if engine.wants_socket(socket_id):
                                engine.lost(f"write failed: {e}", time.monotonic())
                            self._cond.notify_all()
                        self.wake()
            finally:
                self._write_lock.release()
            with self._lock:
                if not engine.has_output():
                    return

    def wake(self) -> None:
        """Make the thread decide again now (it may be waiting for the socket)."""
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:
            log.exception("pairmq client I/O thread failed")
            with self._cond:
                self._engine.give_up(ClientError(f"internal client error: {e!r}"),
                                     time.monotonic())
                self._cond.notify_all()
        finally:
            self._close_socket()
            with self._cond:
                self._cond.notify_all()

    def _loop(self) -> None:
        engine = self._engine
        while True:
            now = time.monotonic()
            with self._cond:
                engine.tick(now)
                if self._socket is not None and not engine.wants_socket(self._socket[0]):
                    self._close_socket()
                plan = None if self._socket is not None else engine.next_attempt(now)
                link = engine.link
                deadline = engine.next_deadline()
                forwarded = engine.take_forwarded()
                restamped = engine.take_restamped()
                events = engine.take_events()
                self._cond.notify_all()
            self._after_batch(forwarded, events, restamped)
            if link in (Link.CLOSED, Link.FAILED):
                return
            self.flush(block=False)
            if self._socket is None:
                if plan is not None:
                    self._attempt(*plan)
                else:
                    self._sleep(0.05)
                continue
            self._read(deadline)

    def _attempt(self, address: Address, at: float) -> None:
        delay = at - time.monotonic()
        if delay > 0:
            self._sleep(delay)
            return  # decided again: the client may have been closed meanwhile
        with self._lock:
            self._engine.trying(address)
        sock: socket.socket | TlsSocket
        try:
            sock = socket.create_connection(address, timeout=self.options.connect_timeout / 1000)
        except OSError as e:
            with self._cond:
                self._engine.attempt_failed(address, str(e) or type(e).__name__,
                                            time.monotonic())
            return
        if self._tls is not None:
            sock = TlsSocket(sock, self._tls, address[0])
            try:
                sock.handshake(self.options.connect_timeout / 1000)
            except OSError as e:
                sock.close()
                with self._cond:
                    self._engine.attempt_failed(address, tls_failure(e), time.monotonic())
                return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.options.call_timeout / 1000)
        with self._cond:
            if self._engine.link is not Link.CONNECTING:
                sock.close()
                return
            self._engine.opened(address, time.monotonic())
            self._socket = (self._engine.socket_id, sock)
        self.flush()

    def _read(self, deadline: float | None) -> None:
        assert self._socket is not None
        socket_id, sock = self._socket
        timeout = 1.0 if deadline is None else max(0.0, min(deadline - time.monotonic(), 1.0))
        # decrypted bytes may wait in the TLS layer, which the socket does not show
        pending = isinstance(sock, TlsSocket) and sock.pending()
        try:
            readable, _, _ = select.select([sock, self._wake_r], [], [],
                                           0.0 if pending else timeout)
        except (OSError, ValueError):
            readable = [sock]
        if pending and sock not in readable:
            readable.append(sock)
        if self._wake_r in readable:
            try:
                self._wake_r.recv(4096)
            except OSError:
                pass
        if sock not in readable:
            return
        try:
            data = sock.recv(READ_BYTES)
            why = "the server closed the connection"
        except OSError as e:
            data = b""
            why = f"connection error: {e}"
        if data is None:
            return  # part of a TLS record: the rest comes with the next read
        with self._cond:
            if self._engine.wants_socket(socket_id):
                if data:
                    self._engine.receive(data, time.monotonic())
                else:
                    self._engine.lost(why, time.monotonic())
            self._cond.notify_all()

    def _sleep(self, seconds: float) -> None:
        try:
            select.select([self._wake_r], [], [], min(seconds, 1.0))
            self._wake_r.recv(4096)
        except (OSError, BlockingIOError):
            pass

    def _close_socket(self) -> None:
        current = self._socket
        self._socket = None
        if current is not None:
            try:
                current[1].close()
            except OSError:
                pass
