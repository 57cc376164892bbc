"""Hundreds of thousands of messages through a real server, fast enough for the test suite.

`produce` keeps a window of receipted SENDs in flight on one raw socket and measures how
long each RECEIPT took (SEND written .. RECEIPT read): a producer that is never blocked
sees every receipt quickly. `drain` reads MESSAGE frames with a small parser of its own
(content-length framing) and checks each one's number and exact body in order, with
cumulative client acks. Both fail with a message saying where and what.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

Address = tuple[str, int]
CONNECT = b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\x00"
RECV_BYTES = 1 << 20


def payload(i: int, size: int) -> bytes:
    """A body nobody could mistake for another: sha256-derived bytes, tagged with i."""
    seed = hashlib.sha256(b"%d" % i).digest()
    return (b"%08d:" % i + seed * (size // len(seed) + 1))[:size]


class Frame(NamedTuple):
    command: bytes
    head: bytes  # the header lines, "\n"-separated, as they came
    body: bytes

    def header(self, name: bytes) -> bytes:
        for line in self.head.split(b"\n"):
            key, _, value = line.partition(b":")
            if key == name:
                return value
        raise AssertionError(f"no {name!r} header in {self.command!r} {self.head[:300]!r}")


class Wire:
    """One raw STOMP connection with an input buffer read by position (no copying)."""

    def __init__(self, address: Address, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.sock = socket.create_connection(address, timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self.buf = bytearray()
        self.pos = 0
        self.sock.sendall(CONNECT)
        frame = self.next_frame()
        if frame.command != b"CONNECTED":
            raise AssertionError(f"expected CONNECTED, got {frame!r}")

    def fill(self) -> None:
        if not self.read_more(self.timeout):
            raise AssertionError(f"nothing arrived from the server in {self.timeout} s")

    def read_more(self, timeout: float) -> bool:
        """Read what arrives within `timeout` s into the buffer; False if nothing did."""
        if self.pos:
            del self.buf[:self.pos]
            self.pos = 0
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(RECV_BYTES)
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(self.timeout)
        if not data:
            raise AssertionError("the server closed the connection" + self._error_text())
        self.buf += data
        return True

    def buffered(self) -> Frame | None:
        """The next complete frame already read, or None."""
        buf, pos = self.buf, self.pos
        while pos < len(buf) and buf[pos] in (10, 13):
            pos += 1
        head_end = buf.find(b"\n\n", pos)
        if head_end < 0:
            return None
        at = buf.find(b"\ncontent-length:", pos, head_end)
        if at >= 0:
            end = head_end + 2 + int(buf[at + 16:buf.find(b"\n", at + 1, head_end + 1)])
            if end >= len(buf):
                return None
        else:
            end = buf.find(b"\x00", head_end)
            if end < 0:
                return None
        command, _, head = bytes(buf[pos:head_end]).partition(b"\n")
        frame = Frame(command, head, bytes(buf[head_end + 2:end]))
        self.pos = end + 1
        return frame

    def next_frame(self) -> Frame:
        while True:
            frame = self.buffered()
            if frame is not None:
                return frame
            self.fill()

    def poll(self) -> None:
        """Read what has arrived, without waiting."""
        self.sock.setblocking(False)
        try:
            data = self.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        finally:
            self.sock.settimeout(self.timeout)
        if not data:
            raise AssertionError("the server closed the connection" + self._error_text())
        self.buf += data

    def _error_text(self) -> str:
        at = self.buf.find(b"ERROR")
        return "" if at < 0 else ": " + self.buf[at:at + 500].decode(errors="replace")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


@dataclass
class Produced:
    count: int
    seconds: float
    max_wait_s: float  # the longest any SEND waited for its RECEIPT
    slowest: int  # which one


def produce(address: Address, destination: str, first: int, count: int, size: int = 1024,
            window: int = 400, headers: dict[str, str] | None = None,
            dup_ids: bool = False) -> Produced:
    """Persistent SENDs numbered first..first+count-1 (header x-seq, receipt the number,
    body payload(n)), `window` of them unconfirmed at most; every RECEIPT is checked."""
    extra = "".join(f"{k}:{v}\n" for k, v in (headers or {}).items())
    head = f"SEND\ndestination:{destination}\npersistent:true\n{extra}".encode()
    wire = Wire(address)
    sent_at: deque[float] = deque()
    max_wait, slowest = 0.0, -1
    started = time.monotonic()
    next_seq, confirmed, end = first, first, first + count
    try:
        while confirmed < end:
            room = min(window - (next_seq - confirmed), end - next_seq, 100)
            if room > 0:
                frames = []
                for n in range(next_seq, next_seq + room):
                    dup = b"dup-id:d%d\n" % n if dup_ids else b""
                    body = payload(n, size)
                    frames.append(head + b"x-seq:%d\nreceipt:%d\n%scontent-length:%d\n\n"
                                  % (n, n, dup, len(body)) + body + b"\x00")
                now = time.monotonic()
                wire.sock.sendall(b"".join(frames))
                sent_at.extend([now] * room)
                next_seq += room
                wire.poll()  # the receipts that came meanwhile, without waiting
            frame = wire.buffered()
            if frame is None:
                if room > 0 and next_seq - confirmed < window:
                    continue  # room in the window: keep sending
                frame = wire.next_frame()
            while frame is not None:
                arrived = time.monotonic()
                if frame.command != b"RECEIPT":
                    raise AssertionError(f"after {confirmed - first} receipts, instead of "
                                         f"RECEIPT {confirmed}: {frame!r}")
                rid = int(frame.header(b"receipt-id"))
                if rid != confirmed:
                    raise AssertionError(f"RECEIPT {rid} arrived when {confirmed} was expected")
                waited = arrived - sent_at.popleft()
                if waited > max_wait:
                    max_wait, slowest = waited, rid
                confirmed += 1
                frame = wire.buffered()
        wire.sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
        frame = wire.next_frame()
        assert frame.command == b"RECEIPT", frame
    finally:
        wire.close()
    return Produced(count, time.monotonic() - started, max_wait, slowest)


def drain(address: Address, destination: str, first: int, count: int, size: int = 1024,
          prefetch: int = 1000, ack_every: int = 250) -> float:
    """Receive messages first..first+count-1 in order, each with its exact body (ack:client,
    acknowledged cumulatively), then ACK the last with a receipt and DISCONNECT (what was
    delivered after it and not acknowledged goes back to the queue). Returns the seconds."""
    wire = Wire(address)
    started = time.monotonic()
    wire.sock.sendall((f"SUBSCRIBE\nid:bulk\ndestination:{destination}\nack:client\n"
                       f"prefetch-count:{prefetch}\n\n\x00").encode())
    try:
        for expected in range(first, first + count):
            frame = wire.next_frame()
            if frame.command != b"MESSAGE":
                raise AssertionError(f"expecting message {expected}, got {frame!r}")
            seq = int(frame.header(b"x-seq"))
            if seq != expected:
                raise AssertionError(f"message {seq} arrived where {expected} was expected "
                                     "(out of order, lost or duplicated)")
            if frame.body != payload(seq, size):
                raise AssertionError(f"message {seq} arrived with a different body")
            last = expected == first + count - 1
            if last or (expected - first + 1) % ack_every == 0:
                receipt = b"receipt:acked\n" if last else b""
                wire.sock.sendall(b"ACK\nid:" + frame.header(b"ack") + b"\n" + receipt
                                  + b"\n\x00")
        while True:
            frame = wire.next_frame()
            if frame.command == b"RECEIPT":
                break
            if frame.command != b"MESSAGE":  # later messages may come: left unacknowledged
                raise AssertionError(f"waiting for the last ACK's receipt: {frame!r}")
        wire.sock.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
        while wire.next_frame().command != b"RECEIPT":
            pass
    finally:
        wire.close()
    return time.monotonic() - started
