"""Load-generator processes: raw, pipelined STOMP over plain sockets.

The generator must never be what limits a benchmark, so it does as little as
possible per message: producers send pre-built frames many at a time with one
`sendall`, and consumers find their way through the receive buffer with
`bytearray.find` instead of parsing every header. Each producer and consumer
runs in its own process (`multiprocessing`, fork) and reports its own CPU use.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
from array import array
from dataclasses import dataclass
from typing import Any

from benchmarks.loadgen import cpu_seconds

CONNECT_FRAME = b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\x00"
RECV_SIZE = 256 * 1024
# Flood producers hand the kernel about this many bytes per sendall.
FLOOD_BATCH_BYTES = 128 * 1024
# Paced producers wake up at most this often; they send whatever is due.
PACED_TICK_S = 0.001
# How often blocked reads wake up to look at the stop flag.
POLL_S = 0.1

CONTENT_LENGTH = b"\ncontent-length:"
TS = b"\nts:"


class LoadError(Exception):
    """The server misbehaved (ERROR frame, closed connection, no answer in time)."""


class Stopped(Exception):
    """The orchestrator asked for a stop: not an error of this process."""


def _detach_from_ctrl_c() -> None:
    """Ctrl-C reaches the whole process group; the orchestrator stops us via the stop flag."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass(frozen=True)
class RunShared:
    """What every generator process of one run shares with the orchestrator.

    `stop` is a raw shared byte (no lock: reading it per recv must be cheap);
    `progress[i]` is consumer i's received count, read by the orchestrator to
    know when everything arrived without waiting for results.
    """

    events: Any  # multiprocessing Queue of (kind, role, index, payload)
    start: Any  # multiprocessing Event: producers begin when it is set
    stop: Any  # RawValue("b"): 1 = finish now
    progress: Any  # RawArray("q", consumers)


@dataclass(frozen=True)
class ProducerConfig:
    """One producer: `count` messages to `destination`, flat out (rate None) or paced."""

    index: int
    host: str
    port: int
    destination: str
    count: int
    size: int
    persistent: bool
    rate: float | None
    deadline: float  # time.monotonic() after which the producer gives up
    stall_s: float  # a server that reads nothing from us for this long is stuck


@dataclass(frozen=True)
class ConsumerConfig:
    """One consumer of `destination` with an auto-ack subscription."""

    index: int
    host: str
    port: int
    destination: str
    deadline: float
    sample_every: int = 1  # read the latency of every n-th message


# --- control frames (handshake, receipts): rare, so a plain parser will do ---


def _frame_at(buf: bytearray, pos: int) -> tuple[bytes, dict[str, str], bytes, int] | None:
    """The complete frame starting at `pos` and the index just past it, or None."""
    while pos < len(buf) and buf[pos] in (10, 13):  # heart-beat EOLs
        pos += 1
    hend = buf.find(b"\n\n", pos)
    if hend < 0:
        return None
    lines = bytes(buf[pos:hend]).split(b"\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, _, value = line.rstrip(b"\r").decode("utf-8", "replace").partition(":")
        headers.setdefault(key, value)
    body_start = hend + 2
    if "content-length" in headers:
        end = body_start + int(headers["content-length"])
        if end >= len(buf):
            return None
    else:
        end = buf.find(b"\x00", body_start)
        if end < 0:
            return None
    return lines[0].rstrip(b"\r"), headers, bytes(buf[body_start:end]), end + 1


def _next_frame(buf: bytearray) -> tuple[bytes, dict[str, str], bytes] | None:
    """Remove and return the first complete frame in `buf`, or None if incomplete."""
    frame = _frame_at(buf, 0)
    if frame is None:
        return None
    del buf[: frame[3]]
    return frame[0], frame[1], frame[2]


def _describe(command: bytes, headers: dict[str, str], body: bytes) -> str:
    text = f"{command.decode(errors='replace')} {headers}"
    if body:
        text += f" body={body[:200].decode(errors='replace')!r}"
    return text


def read_frame(
    sock: socket.socket, buf: bytearray, deadline: float, stop: Any = None
) -> tuple[bytes, dict[str, str], bytes]:
    """Read one frame; raise LoadError on timeout, close, or (if given) the stop flag."""
    while True:
        frame = _next_frame(buf)
        if frame is not None:
            return frame
        if stop is not None and stop.value:
            raise LoadError("stopped while waiting for a frame")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LoadError("timed out waiting for a frame from the server")
        sock.settimeout(min(remaining, POLL_S))
        try:
            data = sock.recv(RECV_SIZE)
        except TimeoutError:
            continue
        if not data:
            raise LoadError("server closed the connection")
        buf += data


def expect(
    sock: socket.socket,
    buf: bytearray,
    command: bytes,
    deadline: float,
    stop: Any = None,
    **match: str,
) -> dict[str, str]:
    """Read frames until `command` (with headers `match`) arrives; an ERROR raises."""
    while True:
        cmd, headers, body = read_frame(sock, buf, deadline, stop)
        if cmd == b"ERROR":
            raise LoadError("server sent " + _describe(cmd, headers, body))
        if cmd == command and all(headers.get(k) == v for k, v in match.items()):
            return headers


def open_session(host: str, port: int, deadline: float) -> tuple[socket.socket, bytearray]:
    """Connect anonymously and wait for CONNECTED; returns the socket and leftover bytes."""
    sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
    # Paced sends are small; Nagle plus delayed ACKs would add tens of ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(CONNECT_FRAME)
    buf = bytearray()
    expect(sock, buf, b"CONNECTED", deadline)
    return sock, buf


def server_error(sock: socket.socket, buf: bytearray) -> str:
    """Best effort: the ERROR frame the server sent before closing, if any."""
    try:
        sock.settimeout(0.5)
        while True:
            frame = _next_frame(buf)
            if frame is not None:
                if frame[0] == b"ERROR":
                    return " (server sent " + _describe(*frame) + ")"
                continue
            data = sock.recv(RECV_SIZE)
            if not data:
                return ""
            buf += data
    except (OSError, ValueError):
        return ""


# --- producer ---


def send_all(sock: socket.socket, data: bytes, stop: Any, stall_s: float) -> None:
    """`sendall` that stays responsive: gives up on a stop or a server stalled for stall_s.

    The socket has a POLL_S timeout, so a send blocked by TCP wakes up to check.
    """
    view = memoryview(data)
    send = sock.send
    last = time.monotonic()
    while view:
        try:
            view = view[send(view) :]
        except TimeoutError:
            if stop.value:
                raise Stopped from None
            if time.monotonic() - last > stall_s:
                raise LoadError(f"the server read nothing for {stall_s}s") from None
            continue
        last = time.monotonic()


def frame_parts(destination: str, size: int, persistent: bool) -> tuple[bytes, bytes]:
    """The bytes of a SEND frame before and after the ts value, built once."""
    head = f"SEND\ndestination:{destination}\ncontent-length:{size}\n"
    if persistent:
        head += "persistent:true\n"
    # Any byte but NUL would do; 'x' keeps captured traffic readable.
    return (head + "ts:").encode(), b"\n\n" + b"x" * size + b"\x00"


def producer_main(cfg: ProducerConfig, shared: RunShared) -> None:
    """Process entry point: send cfg.count messages, then report what was sent."""
    result: dict[str, Any] = {"sent": 0, "first_send_ns": 0, "last_send_ns": 0, "cpu_s": 0.0}
    sock: socket.socket | None = None
    buf = bytearray()
    _detach_from_ctrl_c()
    try:
        sock, buf = open_session(cfg.host, cfg.port, cfg.deadline)
        shared.events.put(("ready", "producer", cfg.index, None))
        if not shared.start.wait(max(0.0, cfg.deadline - time.monotonic())):
            raise LoadError("never told to start")
        if shared.stop.value:
            raise Stopped
        cpu0 = cpu_seconds()
        sock.settimeout(POLL_S)
        try:
            try:
                if cfg.rate:
                    _send_paced(sock, cfg, shared, result)
                else:
                    _send_flood(sock, cfg, shared, result)
                # The RECEIPT proves the server has taken in every SEND before it.
                send_all(sock, b"DISCONNECT\nreceipt:bye\n\n\x00", shared.stop, cfg.stall_s)
            except OSError as exc:
                raise LoadError(f"send failed: {exc!r}{server_error(sock, buf)}") from None
            expect(sock, buf, b"RECEIPT", cfg.deadline, shared.stop, **{"receipt-id": "bye"})
        finally:
            result["cpu_s"] = cpu_seconds() - cpu0
    except Stopped:
        pass
    except LoadError as exc:
        if not shared.stop.value:  # after a stop, a missing RECEIPT is no news
            result["error"] = f"producer {cfg.index}: {exc}"
    except Exception as exc:
        result["error"] = f"producer {cfg.index}: {type(exc).__name__}: {exc}"
    finally:
        if sock is not None:
            sock.close()
        shared.events.put(("result", "producer", cfg.index, result))


def _send_flood(
    sock: socket.socket, cfg: ProducerConfig, shared: RunShared, result: dict[str, Any]
) -> None:
    """As fast as TCP takes it: one sendall of ~128 KiB of frames at a time."""
    head, tail = frame_parts(cfg.destination, cfg.size, cfg.persistent)
    batch = max(1, FLOOD_BATCH_BYTES // (len(head) + 20 + len(tail)))
    mono, stop, stall_s = time.monotonic_ns, shared.stop, cfg.stall_s
    sent = 0
    result["first_send_ns"] = mono()
    while sent < cfg.count:
        if stop.value:
            raise Stopped
        k = min(batch, cfg.count - sent)
        now = mono()
        # One ts per batch: every frame in it is handed to the kernel right now.
        send_all(sock, (head + b"%d" % now + tail) * k, stop, stall_s)
        sent += k
        result["sent"] = sent
        result["last_send_ns"] = now


def _send_paced(
    sock: socket.socket, cfg: ProducerConfig, shared: RunShared, result: dict[str, Any]
) -> None:
    """Offer cfg.rate msgs/s: wake every ~1 ms and send what is due by now."""
    assert cfg.rate
    head, tail = frame_parts(cfg.destination, cfg.size, cfg.persistent)
    mono, stop, sleep, stall_s = time.monotonic_ns, shared.stop, time.sleep, cfg.stall_s
    ns_per_msg = 1e9 / cfg.rate
    sent = 0
    now = start = result["first_send_ns"] = mono()
    while sent < cfg.count:
        if stop.value:
            raise Stopped
        now = mono()
        # Message i is due at start + i * ns_per_msg; falling behind means catching up.
        due = min(cfg.count, int((now - start) / ns_per_msg) + 1)
        if due > sent:
            send_all(sock, (head + b"%d" % now + tail) * (due - sent), stop, stall_s)
            sent = due
            result["sent"] = sent
            result["last_send_ns"] = now
        wait_s = (start + sent * ns_per_msg - mono()) / 1e9
        sleep(max(PACED_TICK_S, wait_s))


# --- consumer ---


def consumer_main(cfg: ConsumerConfig, shared: RunShared) -> None:
    """Process entry point: subscribe, count messages and their latency until told to stop."""
    result: dict[str, Any] = {"received": 0, "last_recv_ns": 0, "cpu_s": 0.0}
    latencies = array("q")
    sock: socket.socket | None = None
    _detach_from_ctrl_c()
    try:
        sock, buf = open_session(cfg.host, cfg.port, cfg.deadline)
        sock.sendall(
            f"SUBSCRIBE\nid:0\ndestination:{cfg.destination}\nack:auto\nreceipt:sub\n\n\x00".encode()
        )
        # Only a RECEIPT proves the subscription exists before producers start.
        expect(sock, buf, b"RECEIPT", cfg.deadline, **{"receipt-id": "sub"})
        cpu0 = cpu_seconds()
        shared.events.put(("ready", "consumer", cfg.index, None))
        try:
            _consume(sock, buf, cfg, shared, latencies, result)
        finally:
            result["cpu_s"] = cpu_seconds() - cpu0
    except Exception as exc:
        result["error"] = f"consumer {cfg.index}: {type(exc).__name__}: {exc}"
    finally:
        if sock is not None:
            sock.close()
        result["latencies_ns"] = latencies
        shared.events.put(("result", "consumer", cfg.index, result))


def _consume(
    sock: socket.socket,
    buf: bytearray,
    cfg: ConsumerConfig,
    shared: RunShared,
    latencies: array,
    result: dict[str, Any],
) -> None:
    """The hot loop: frame boundaries from content-length, latency from the ts header.

    Costs a few `find` calls per MESSAGE; anything else (RECEIPT, ERROR, EOLs)
    takes the slow path. Every message in one recv gets the same arrival time,
    taken right after the recv returns: when its bytes reached this process.
    Latency is read from every `sample_every`-th message only.
    """
    find, startswith = buf.find, buf.startswith  # buf is only changed in place
    recv, mono, stop, progress = sock.recv, time.monotonic_ns, shared.stop, shared.progress
    append = latencies.append
    index, every = cfg.index, max(1, cfg.sample_every)
    deadline_ns = int(cfg.deadline * 1e9)
    parent = os.getppid()
    count = 0
    last_ns = 0
    skip = 0  # messages until the next latency sample
    need = 0  # bytes buf must hold before the frame at its start can be complete
    now = mono()
    # Blocking socket with a kernel receive timeout: one recvfrom per wakeup,
    # where a Python-level timeout would add a poll() before every recv.
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, int(POLL_S * 1e6)))
    try:
        while not stop.value:
            n = len(buf)
            if n > need:
                pos = 0
                got = 0
                while True:
                    if startswith(b"MESSAGE\n", pos):
                        hend = find(b"\n\n", pos)
                        if hend < 0:
                            need = 0
                            break
                        cl = find(CONTENT_LENGTH, pos, hend)
                        if cl < 0:
                            raise LoadError("MESSAGE without content-length")
                        end = hend + 2 + int(buf[cl + 16 : find(b"\n", cl + 16)])
                        if end >= n:
                            need = end + 1 - pos
                            break
                        if skip:
                            skip -= 1
                        else:
                            skip = every - 1
                            t = find(TS, pos, hend)
                            if t >= 0:
                                append(now - int(buf[t + 4 : find(b"\n", t + 4)]))
                        got += 1
                        pos = end + 1
                    elif n - pos < 8:  # maybe a MESSAGE cut short
                        need = 0
                        break
                    elif buf[pos] == 10 or buf[pos] == 13:  # heart-beat EOLs
                        pos += 1
                    else:
                        frame = _frame_at(buf, pos)
                        if frame is None:
                            need = 0
                            break
                        if frame[0] == b"ERROR":
                            raise LoadError("server sent " + _describe(*frame[:3]))
                        pos = frame[3]  # RECEIPT or anything else: skipped
                if pos:
                    del buf[:pos]
                if got:
                    count += got
                    last_ns = now
                    progress[index] = count
            try:
                data = recv(RECV_SIZE)
            except (BlockingIOError, TimeoutError):
                if mono() > deadline_ns or os.getppid() != parent:
                    raise LoadError("gave up: deadline passed or orchestrator gone") from None
                continue
            if not data:
                raise LoadError("server closed the connection")
            now = mono()
            buf += data
    finally:
        result["received"] = count
        result["last_recv_ns"] = last_ns
