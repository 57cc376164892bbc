#!/usr/bin/env python3
"""Throw random and mutated STOMP frames at a real pairmq server.

    python benchmarks/fuzz_campaign.py --frames 100000 --seed 7

The command starts its own server (tests.serverproc) with small limits, then
several threads open connections and send fuzzed byte streams: valid sessions,
valid sessions with mutated frames (bit flips, truncations, removed and
duplicated bytes, odd headers, absurd content-lengths, ...), wholly mutated
streams, limit-breaking frames and plain garbage, split at random points and
ended in different ways (half-close, abortive reset, plain close, waiting for
the server). Meanwhile a well-behaved stomp.py client does send/receive round
trips, which must all succeed. At the end the server must be alive, serve a new
client, and have closed every fuzzed connection (TCP connections and socket fds
back to their baseline).

It prints one JSON line (the summary) and exits 1 if a check failed.
tests/integration/test_fuzz.py runs a short campaign with this same module.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import random
import re
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import stomp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.serverproc import start_server  # noqa: E402

CONNECT_TIMEOUT = 5.0
SEND_TIMEOUT = 5.0
EOF_TIMEOUT = 5.0  # the server must close within this after the client's EOF
ERROR_CLOSE_TIMEOUT = 3.0  # ... and within this after it sent an ERROR
LINGER_IDLE = 0.1
ROUNDTRIP_TIMEOUT = 10.0
FD_SLACK = 4  # non-socket fds the server may open lazily (logs, journals)
MAX_FINDINGS = 40

SERVER_COMMANDS = {"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"}
QUEUES = [f"/queue/fuzz-{i}" for i in range(4)]
TOPICS = [f"/topic/fuzz-{i}" for i in range(2)]
ODD_DESTINATIONS = [
    "/temp-queue/fz",
    "/reply-queue/no-such-token",
    "/bogus/x",
    "queue/fuzz-0",
    "",
    "/queue/",
    "/topic/",
    "/queue/a/b/c",
    "/queue/\u00fcn\u00efc\u00f6de",
    "/queue/" + "q" * 200,
    "/QUEUE/fuzz-0",
]


@dataclass(frozen=True)
class Limits:
    """The server's [limits]; the campaign starts its server with these."""

    max_frame_bytes: int = 65536
    max_headers: int = 50
    max_header_bytes: int = 1024

    def flags(self) -> list[str]:
        return [
            "--max-frame-bytes",
            str(self.max_frame_bytes),
            "--max-headers",
            str(self.max_headers),
            "--max-header-bytes",
            str(self.max_header_bytes),
        ]


# --------------------------------------------------------------------------- frames


def escape(text: str) -> str:
    """STOMP 1.2 header escaping."""
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")


def unescape(text: str) -> str:
    """Lenient 1.2 unescaping (unknown escapes are kept as they are)."""
    if "\\" not in text:
        return text
    out = []
    i = 0
    table = {"n": "\n", "r": "\r", "c": ":", "\\": "\\"}
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in table:
            out.append(table[text[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def build(command: str, headers=(), body: bytes = b"", *, escaped: bool = True) -> bytes:
    lines = [command.encode()]
    for key, value in headers:
        if isinstance(key, bytes) or isinstance(value, bytes):
            k = key if isinstance(key, bytes) else key.encode()
            v = value if isinstance(value, bytes) else value.encode()
            lines.append(k + b":" + v)
        elif escaped:
            lines.append(f"{escape(key)}:{escape(value)}".encode())
        else:
            lines.append(f"{key}:{value}".encode())
    return b"\n".join(lines) + b"\n\n" + body + b"\x00"


@dataclass
class Frame:
    command: str
    headers: dict[str, str]
    body: bytes


class ProtocolViolation(Exception):
    """The server sent bytes that are not a valid STOMP server frame."""

    frames: tuple[Frame, ...] | list[Frame] = ()


class ResponseParser:
    """Incremental parser for what a server sends; strict about structure."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self.buf += data
        frames: list[Frame] = []
        while True:
            try:
                frame = self._next()
            except ProtocolViolation as exc:
                exc.frames = frames  # the good frames before the bad one
                raise
            if frame is None:
                return frames
            frames.append(frame)

    def pending(self) -> bool:
        return any(b not in (10, 13) for b in self.buf)

    def _next(self) -> Frame | None:
        buf = self.buf
        skip = 0
        while skip < len(buf) and buf[skip] in (10, 13):
            skip += 1
        if skip:
            del buf[:skip]
        if not buf:
            return None
        lines: list[bytes] = []
        pos = 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                if len(buf) > 4 * 1024 * 1024:
                    raise ProtocolViolation(f"no end of headers in {bytes(buf[:200])!r}...")
                return None
            line = bytes(buf[pos:nl])
            if line.endswith(b"\r"):
                line = line[:-1]
            pos = nl + 1
            if not line:
                break
            lines.append(line)
        try:
            command = lines[0].decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolViolation(f"command line {lines[0]!r}") from None
        if command not in SERVER_COMMANDS:
            raise ProtocolViolation(f"not a server command: {lines[0][:100]!r}")
        headers: dict[str, str] = {}
        for raw in lines[1:]:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolViolation(f"header not UTF-8: {raw[:200]!r}") from None
            key, sep, value = text.partition(":")
            if not sep:
                raise ProtocolViolation(f"header line without colon: {raw[:200]!r}")
            if command != "CONNECTED":
                key, value = unescape(key), unescape(value)
            headers.setdefault(key, value)
        length = headers.get("content-length")
        if length is not None:
            if not (length.isascii() and length.isdigit()):
                raise ProtocolViolation(f"{command} with content-length {length!r}")
            n = int(length)
            if len(buf) < pos + n + 1:
                return None
            body = bytes(buf[pos : pos + n])
            if buf[pos + n] != 0:
                raise ProtocolViolation(f"{command}: no NUL after content-length {n} body")
            end = pos + n + 1
        else:
            z = buf.find(b"\x00", pos)
            if z < 0:
                return None
            body = bytes(buf[pos:z])
            end = z + 1
        del buf[:end]
        return Frame(command, headers, body)


# --------------------------------------------------------------------------- generation


@dataclass
class Case:
    kind: str
    data: bytes
    frames: int


class Generator:
    """Random sessions, mutated sessions, hostile frames and garbage, from one rng."""

    KINDS = (
        ("valid", 14),
        ("mutated-frame", 38),
        ("mutated-stream", 14),
        ("hostile", 16),
        ("garbage", 10),
        ("pipelined", 8),
    )

    def __init__(self, rng: random.Random, limits: Limits) -> None:
        self.rng = rng
        self.limits = limits
        self._kinds = [k for k, _ in self.KINDS]
        self._weights = [w for _, w in self.KINDS]

    # --- building blocks

    def token(self) -> str:
        rng = self.rng
        alphabet = "abcdefghijklmnopqrstuvwxyz-_0123456789"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))

    def text(self) -> str:
        rng = self.rng
        pool = "abc xyz 123 :\\\n\r\u00e9\u4e2d\U0001f600,;=/"
        return "".join(rng.choice(pool) for _ in range(rng.randint(0, 24)))

    def destination(self) -> str:
        r = self.rng.random()
        if r < 0.72:
            return self.rng.choice(QUEUES)
        if r < 0.85:
            return self.rng.choice(TOPICS)
        return self.rng.choice(ODD_DESTINATIONS)

    def body(self) -> bytes:
        rng = self.rng
        r = rng.random()
        if r < 0.10:
            n = 0
        elif r < 0.62:
            n = rng.randint(1, 64)
        elif r < 0.92:
            n = rng.randint(65, 1024)
        elif r < 0.995:
            n = rng.randint(1025, 8192)
        else:
            n = max(0, self.limits.max_frame_bytes - rng.randint(400, 2000))
        if rng.random() < 0.6:
            return bytes(rng.choices(b"abcdefghij KLMNOP 0123456789\n", k=n))
        return rng.randbytes(n)

    def connect_frame(self) -> bytes:
        """Mostly a CONNECT the server accepts; one in seven is odd."""
        rng = self.rng
        odd = rng.random() < 0.15
        headers: list[tuple[str, str]] = []
        if odd:
            version = rng.choice([None, "2.0", "1.3,9.9", "", "1.2,banana", "1.0"])
            beats = ["x,y", "-5,3", "9" * 25 + ",0", "1", "", "0,0"]
        else:
            version = rng.choice(["1.2", "1.2", "1.2", "1.1,1.2", "1.0,1.1,1.2", "1.1"])
            beats = ["0,0", "0,0", "10000,10000", "0,20000"]
        if version is not None:
            headers.append(("accept-version", version))
        if rng.random() < 0.9:
            headers.append(("host", rng.choice(["localhost", "localhost", "/", "", "vhost"])))
        if rng.random() < 0.6:
            headers.append(("heart-beat", rng.choice(beats)))
        r = rng.random()
        if r < 0.10:
            headers += [("login", "admin"), ("passcode", "secret")]
        elif r < 0.13:
            headers += [("login", "admin"), ("passcode", "wrong")]
        elif r < 0.15:
            headers += [("login", "nobody"), ("passcode", "x")]
        if rng.random() < 0.04:
            headers.append(("client-id", f"fuzz-cid-{rng.randrange(3)}"))
        rng.shuffle(headers)
        return build(rng.choice(["CONNECT", "CONNECT", "STOMP"]), headers, escaped=False)

    def client_frame(self) -> bytes:
        rng = self.rng
        kind = rng.choices(
            [
                "SEND",
                "SUBSCRIBE",
                "UNSUBSCRIBE",
                "ACK",
                "NACK",
                "TX",
                "EOL",
                "CONNECT",
                "DISC",
                "X",
            ],
            [42, 12, 5, 6, 4, 9, 6, 2, 2, 2],
        )[0]
        if kind == "SEND":
            return self.send_frame()
        if kind == "SUBSCRIBE":
            headers = [("destination", self.destination())]
            if rng.random() < 0.95:
                durable = rng.random() < 0.02
                headers.append(
                    ("id", f"d{rng.randrange(2)}" if durable else f"s{rng.randrange(4)}")
                )
                if durable:
                    headers.append(("durable", "true"))
            ack = rng.choice(["auto", "auto", "client", "client-individual", "bogus", None])
            if ack is not None:
                headers.append(("ack", ack))
            if rng.random() < 0.2:
                headers.append(("prefetch-count", rng.choice(["1", "10", "0", "-1", "lots"])))
            return build("SUBSCRIBE", self.maybe_receipt(headers))
        if kind == "UNSUBSCRIBE":
            headers = [("id", f"s{rng.randrange(5)}")] if rng.random() < 0.9 else []
            return build("UNSUBSCRIBE", self.maybe_receipt(headers))
        if kind in ("ACK", "NACK"):
            headers = []
            if rng.random() < 0.9:
                ack_id = rng.choice(["0", "1", str(rng.randrange(10**6)), "nonsense", "", "a:b"])
                headers.append(("id", ack_id))
            if rng.random() < 0.3:
                headers.append(("subscription", f"s{rng.randrange(4)}"))
            if rng.random() < 0.2:
                headers.append(("transaction", f"tx{rng.randrange(3)}"))
            return build(kind, self.maybe_receipt(headers))
        if kind == "TX":
            headers = [("transaction", f"tx{rng.randrange(3)}")] if rng.random() < 0.9 else []
            return build(rng.choice(["BEGIN", "COMMIT", "ABORT"]), self.maybe_receipt(headers))
        if kind == "EOL":
            return rng.choice([b"\n", b"\r\n", b"\n\n\n"])
        if kind == "CONNECT":
            return self.connect_frame()
        if kind == "DISC":
            return build("DISCONNECT", self.maybe_receipt([]))
        return build(rng.choice(["FROB", "send", "MESSAGE", "CONNECTED", "ERROR", "RECEIPT"]), [])

    def maybe_receipt(self, headers: list) -> list:
        if self.rng.random() < 0.3:
            headers.append(("receipt", f"r{self.rng.randrange(1000)}"))
        return headers

    def send_frame(self) -> bytes:
        rng = self.rng
        headers: list[tuple[str, str]] = [("destination", self.destination())]
        if rng.random() < 0.2:
            headers.append(("content-type", "text/plain"))
        for _ in range(rng.choice([0, 0, 0, 1, 2, 5])):
            headers.append((self.token(), self.text()))
        if rng.random() < 0.1:
            headers.append(("persistent", "true"))
        if rng.random() < 0.1:
            headers.append(("priority", rng.choice(["0", "4", "9", "-1", "10", "high", ""])))
        if rng.random() < 0.05:
            now = int(time.time() * 1000)
            headers.append(("expires", rng.choice(["0", str(now - 1000), str(now + 60000), "x"])))
        if rng.random() < 0.04:
            headers.append(("reply-to", "/temp-queue/fz"))
        if rng.random() < 0.08:
            headers.append(("transaction", f"tx{rng.randrange(3)}"))
        body = self.body()
        if b"\x00" in body or rng.random() < 0.5:
            headers.insert(rng.randrange(len(headers) + 1), ("content-length", str(len(body))))
        return build("SEND", self.maybe_receipt(headers), body)

    def session(self, frames: int | None = None) -> list[bytes]:
        rng = self.rng
        out = [self.connect_frame()] if rng.random() < 0.93 else []
        if frames is None:
            frames = rng.choice([0, 1, 1, 2, 2, 3, 4, 6])
        out += [self.client_frame() for _ in range(frames)]
        if rng.random() < 0.25:
            out.append(build("DISCONNECT", [("receipt", "bye")]))
        return out

    # --- hostile frames: the limits and the parser's corner cases

    def odd_header_lines(self) -> list[bytes]:
        lim = self.limits
        values = ["9" * 30, "18446744073709551616", "-1", "abc", "", "1e3", "0x10", "1_0"]
        values += [" 5", "+5", "\u0663", str(lim.max_frame_bytes + 1), "0", "5 "]
        lines = [f"content-length:{v}".encode() for v in values]
        lines += [
            b"receipt:fuzz-receipt",
            b"x:bad\\tescape",
            b"x:trailing\\",
            b"x\\q:1",
            b"x:\xff\xfe",
            b"\xc3\x28:v",
            b"x:\xed\xa0\x80",
            b"x:\xc0\xaf",
            b"no-colon-line",
            b":emptykey",
            b"key:",
            b"destination:/bogus/q",
            b"destination:",
            b"x:nul\x00inside",
            b"transaction:nope",
            b"id:",
            b"ack:bogus",
            b"x:" + b"y" * (lim.max_header_bytes + 10),
        ]
        return lines

    def hostile(self) -> list[bytes]:
        rng = self.rng
        lim = self.limits
        prefix = [self.connect_frame()] if rng.random() < 0.8 else []
        dest = ("destination", rng.choice(QUEUES))
        choice = rng.randrange(9)
        if choice == 0:  # too many headers
            n = lim.max_headers + rng.randint(1, 200)
            frame = build("SEND", [dest] + [(f"h{i}", "v") for i in range(n)], b"x")
        elif choice == 1:  # one header line too long
            frame = build(
                "SEND", [dest, ("x", "y" * (lim.max_header_bytes + rng.randint(1, 5000)))]
            )
        elif choice == 2:  # declared body over the limit, some of it sent
            n = lim.max_frame_bytes + rng.randint(1, 10000)
            sent = rng.choice([0, 100, n // 2, n])
            head = build("SEND", [dest, ("content-length", str(n))])[:-1]
            frame = head + b"b" * sent + (b"\x00" if sent == n else b"")
        elif choice == 3:  # streamed body over the limit, no content-length
            n = lim.max_frame_bytes + rng.randint(1, 10000)
            frame = build("SEND", [dest])[:-1] + b"s" * n + rng.choice([b"", b"\x00"])
        elif choice == 4:  # absurd or malformed content-length
            line = rng.choice(self.odd_header_lines()[:14])
            frame = b"SEND\n" + line + b"\ndestination:/queue/fuzz-0\n\nbody\x00"
        elif choice == 5:  # one odd header line in an otherwise good frame
            frame = build("SEND", [dest], b"hello")
            frame = frame[:5] + rng.choice(self.odd_header_lines()) + b"\n" + frame[5:]
        elif choice == 6:  # odd command lines
            cmd = rng.choice(
                [
                    b"send",
                    b"SEND ",
                    b" SEND",
                    b"SEND\t",
                    b"SENDX",
                    b"SEN",
                    b"\x00",
                    b"SEND\r\r",
                    b"\xff\xfe",
                    b"C" * (lim.max_header_bytes + 100),
                    b"CONNECT\x00",
                ]
            )
            frame = cmd + b"\ndestination:/queue/fuzz-1\n\nodd\x00"
        elif choice == 7:  # the same header many times
            frame = build("SEND", [dest] * rng.randint(2, lim.max_headers + 20), b"dup")
        else:  # only heart-beats, many of them
            frame = rng.choice([b"\n", b"\r\n"]) * rng.randint(1, 5000)
        return [*prefix, frame]

    def garbage(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.5:
            return rng.randbytes(rng.randint(1, 4096))
        tokens = [
            b"SEND",
            b"CONNECT",
            b"SUBSCRIBE",
            b"\n",
            b"\n",
            b"\r\n",
            b":",
            b"\x00",
            b"\\",
            b"destination",
            b"/queue/fuzz-0",
            b"content-length",
            b"99999",
            b"id",
            b"receipt",
            b"\xff",
            b"accept-version:1.2",
            b"ack",
            b"0",
            b"-",
            b" ",
        ]
        return b"".join(rng.choice(tokens) for _ in range(rng.randint(1, 300)))

    # --- mutations

    def mutate(self, data: bytes) -> bytes:
        rng = self.rng
        op = rng.randrange(13)
        n = len(data)
        if n == 0:
            return rng.randbytes(rng.randint(1, 16))
        if op == 0:  # bit flips
            b = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(n)] ^= 1 << rng.randrange(8)
            return bytes(b)
        if op == 1:  # interesting bytes
            b = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(n)] = rng.choice(b"\x00\n\r:\\\xff\x80\xc3 \t")
            return bytes(b)
        if op == 2:  # truncation
            return data[: rng.randrange(n)]
        if op == 3:  # removed bytes
            i = rng.randrange(n)
            return data[:i] + data[i + rng.randint(1, 16) :]
        if op == 4:  # duplicated bytes
            i = rng.randrange(n)
            j = min(n, i + rng.randint(1, 64))
            k = rng.randrange(n + 1)
            return data[:k] + data[i:j] + data[k:]
        if op == 5:  # random bytes inserted
            k = rng.randrange(n + 1)
            return data[:k] + rng.randbytes(rng.randint(1, 32)) + data[k:]
        if op == 6:  # NUL terminator(s) removed
            if rng.random() < 0.5:
                return data.replace(b"\x00", b"")
            i = data.rfind(b"\x00")
            return data if i < 0 else data[:i] + data[i + 1 :]
        if op == 7:  # an odd header line inserted
            nl = data.find(b"\n")
            nl = n if nl < 0 else nl + 1
            return data[:nl] + rng.choice(self.odd_header_lines()) + b"\n" + data[nl:]
        if op == 8:  # command replaced
            nl = data.find(b"\n")
            cmd = rng.choice(
                [b"", b"FROB", b"send", b"SEND ", b"STOMP", b"CONNECT", b"ACK", b"\xff", b"MESSAGE"]
            )
            return cmd + (data[nl:] if nl >= 0 else b"\n")
        if op == 9:  # line ends changed
            r = rng.random()
            if r < 0.4:
                return data.replace(b"\n", b"\r\n")
            if r < 0.7:
                return data.replace(b"\n", b"\r", 1)
            return data.replace(b"\n", b"\n\n", 1)
        if op == 10:  # content-length skewed or made absurd
            value = rng.choice(
                [b"999999999999999999999999", b"-3", b"x", b"", b"0", b"4294967296", b"65535"]
            )
            if re.search(rb"content-length:[^\n]*", data):
                skew = str(rng.randint(-5, 5)).encode()
                new = rng.choice([value, skew.lstrip(b"-")])
                return re.sub(rb"content-length:[^\n]*", b"content-length:" + new, data, count=1)
            return self._insert_line(data, b"content-length:" + value)
        if op == 11:  # repeated (pipelined copies)
            return data * rng.randint(2, 4)
        # spliced with another frame
        other = self.client_frame()
        return data[: rng.randrange(n + 1)] + other[rng.randrange(len(other) + 1) :]

    @staticmethod
    def _insert_line(data: bytes, line: bytes) -> bytes:
        nl = data.find(b"\n")
        nl = len(data) if nl < 0 else nl + 1
        return data[:nl] + line + b"\n" + data[nl:]

    # --- cases

    def case(self) -> Case:
        rng = self.rng
        kind = rng.choices(self._kinds, self._weights)[0]
        if kind == "valid":
            frames = self.session()
        elif kind == "mutated-frame":
            frames = self.session(rng.randint(1, 5))
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                i = rng.randrange(len(frames))
                frames[i] = self.mutate(frames[i])
        elif kind == "mutated-stream":
            frames = self.session()
            data = b"".join(frames)
            for _ in range(rng.randint(1, 3)):
                data = self.mutate(data)
            return Case(kind, data, len(frames))
        elif kind == "hostile":
            frames = self.hostile()
        elif kind == "garbage":
            return Case(kind, self.garbage(), 1)
        else:  # pipelined: many frames on one connection, a few mutated
            frames = self.session(rng.randint(10, 40))
            for _ in range(rng.choice([0, 0, 1, 2])):
                i = rng.randrange(len(frames))
                frames[i] = self.mutate(frames[i])
        return Case(kind, b"".join(frames), len(frames))

    def split(self, data: bytes) -> list[bytes]:
        """Random split points, from none to byte-by-byte stretches."""
        rng = self.rng
        n = len(data)
        r = rng.random()
        if n < 2 or r < 0.55:
            return [data]
        count = rng.randint(1, 4) if r < 0.9 else min(n - 1, rng.randint(5, 40))
        points = sorted(rng.sample(range(1, n), min(count, n - 1)))
        return [data[i:j] for i, j in zip([0, *points], [*points, n], strict=True)]


# --------------------------------------------------------------------------- server metrics


def _processes(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def server_connections(pid: int) -> int:
    """TCP connections (any state but LISTEN) held by the server process tree."""
    total = 0
    for proc in _processes(pid):
        for conn in proc.net_connections(kind="tcp"):
            if conn.status != psutil.CONN_LISTEN:
                total += 1
    return total


def server_fds(pid: int) -> tuple[int, int]:
    """(all open fds, socket fds) of the server process tree."""
    fds = sockets = 0
    for proc in _processes(pid):
        fds += proc.num_fds()
        fd_dir = f"/proc/{proc.pid}/fd"
        if os.path.isdir(fd_dir):
            for name in os.listdir(fd_dir):
                try:
                    if os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                        sockets += 1
                except OSError:
                    pass
    return fds, sockets


def server_rss_mb(pid: int) -> float:
    return round(sum(p.memory_info().rss for p in _processes(pid)) / 2**20, 1)


def wait_for_connections(pid: int, target: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        count = server_connections(pid)
        if count <= target or time.monotonic() >= deadline:
            return count
        time.sleep(0.1)


# --------------------------------------------------------------------------- well-behaved client


class _Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue = queue.Queue()
        self.errors: list[str] = []

    def on_message(self, frame) -> None:
        self.messages.put(frame.body)

    def on_error(self, frame) -> None:
        self.errors.append(frame.headers.get("message", "?"))


class GoodClient:
    """A stomp.py 1.2 client subscribed to a queue of its own."""

    def __init__(self, address: tuple[str, int], persistent: bool = False) -> None:
        self.listener = _Listener()
        self.conn = stomp.Connection12([address], heartbeats=(0, 0), reconnect_attempts_max=1)
        self.conn.set_listener("good", self.listener)
        self.conn.connect(wait=False)
        deadline = time.monotonic() + ROUNDTRIP_TIMEOUT
        while not self.conn.is_connected():
            if time.monotonic() >= deadline or self.listener.errors:
                self.close()
                raise ConnectionError(f"no CONNECTED from the server: {self.listener.errors}")
            time.sleep(0.01)
        self.destination = f"/queue/good-{uuid.uuid4().hex}"
        self.persistent = persistent
        self.conn.subscribe(self.destination, id="good", ack="auto")
        self.count = 0

    def roundtrip(self, timeout: float = ROUNDTRIP_TIMEOUT) -> float:
        """Send one message to our queue and wait for it; returns the latency."""
        self.count += 1
        body = f"rt-{self.count}-{uuid.uuid4().hex}"
        start = time.monotonic()
        headers = {"persistent": "true"} if self.persistent else {}
        self.conn.send(self.destination, body, headers=headers)
        deadline = start + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"round trip {self.count} got no message in {timeout}s")
            try:
                got = self.listener.messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if got == body:
                return time.monotonic() - start
        # (unreachable)

    def close(self) -> None:
        try:
            self.conn.disconnect()
        except Exception:
            pass


def check_good_client(address: tuple[str, int], roundtrips: int = 3, persistent=False) -> None:
    """Connect, send and receive on a queue, disconnect; raises on any failure."""
    client = GoodClient(address, persistent=persistent)
    try:
        for _ in range(roundtrips):
            client.roundtrip()
        if client.listener.errors:
            raise AssertionError(f"ERROR frames: {client.listener.errors}")
    finally:
        client.close()


class RoundTripper(threading.Thread):
    """Round trips, one after the other, until stopped; every one must succeed."""

    def __init__(self, address: tuple[str, int], pause: float = 0.02) -> None:
        super().__init__(name="fuzz-roundtripper", daemon=True)
        self.address = address
        self.pause = pause
        self.stop_event = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.max_latency = 0.0

    def run(self) -> None:
        try:
            client = GoodClient(self.address)
        except Exception as exc:
            self.failures.append(f"connect: {exc!r}")
            return
        try:
            while not self.stop_event.is_set():
                try:
                    latency = client.roundtrip()
                except Exception as exc:
                    self.failures.append(repr(exc))
                    if len(self.failures) > 5 or not client.conn.is_connected():
                        return
                    continue
                self.ok += 1
                self.max_latency = max(self.max_latency, latency)
                self.stop_event.wait(self.pause)
            if client.listener.errors:
                self.failures += [f"ERROR: {m}" for m in client.listener.errors]
        finally:
            client.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(ROUNDTRIP_TIMEOUT + 10)


# --------------------------------------------------------------------------- the campaign


@dataclass
class Result:
    seed: int
    frames_sent: int = 0
    connections: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    stats: collections.Counter = field(default_factory=collections.Counter)
    findings: list[dict] = field(default_factory=list)
    server_alive: bool = True
    conns_before: int = -1
    conns_after: int = -1
    fds_before: int = -1
    fds_after: int = -1
    socket_fds_before: int = -1
    socket_fds_after: int = -1
    rss_mb_before: float = -1.0
    rss_mb_after: float = -1.0
    roundtrips_ok: int = 0
    roundtrip_failures: list[str] = field(default_factory=list)
    roundtrip_max_latency: float = 0.0
    post_check: str = "not run"
    dump: str | None = None

    def summary(self) -> dict:
        s = self.stats
        return {
            "seed": self.seed,
            "frames_sent": self.frames_sent,
            "connections": self.connections,
            "bytes_sent": self.bytes_sent,
            "seconds": round(self.seconds, 1),
            "frames_per_second": round(self.frames_sent / self.seconds) if self.seconds else 0,
            "errors_received": s["recv_ERROR"],
            "receipts_received": s["recv_RECEIPT"],
            "connected_received": s["recv_CONNECTED"],
            "messages_received": s["recv_MESSAGE"],
            "cases_by_kind": {k[5:]: v for k, v in sorted(s.items()) if k.startswith("kind_")},
            "endings": {k[4:]: v for k, v in sorted(s.items()) if k.startswith("end_")},
            "server_closed_while_sending": s["closed_while_sending"],
            "truncated_output_at_close": s["truncated_output"],
            "findings": {k: s[k] for k in FINDING_KINDS},
            "server_alive": self.server_alive,
            "conns_before": self.conns_before,
            "conns_after": self.conns_after,
            "fds_before": self.fds_before,
            "fds_after": self.fds_after,
            "socket_fds_before": self.socket_fds_before,
            "socket_fds_after": self.socket_fds_after,
            "rss_mb_before": self.rss_mb_before,
            "rss_mb_after": self.rss_mb_after,
            "roundtrips_ok": self.roundtrips_ok,
            "roundtrip_failures": len(self.roundtrip_failures),
            "roundtrip_max_latency_ms": round(self.roundtrip_max_latency * 1000, 1),
            "post_check": self.post_check,
            "dump": self.dump,
            "ok": not self.problems(),
        }

    def problems(self) -> list[str]:
        out = []
        if not self.server_alive:
            out.append("server died")
        if self.roundtrip_failures:
            out.append(f"well-behaved client failed: {self.roundtrip_failures[:3]}")
        if self.post_check != "ok":
            out.append(f"client after the campaign: {self.post_check}")
        if self.conns_after > self.conns_before:
            out.append(f"TCP connections {self.conns_before} -> {self.conns_after}")
        if self.socket_fds_after > self.socket_fds_before:
            out.append(f"socket fds {self.socket_fds_before} -> {self.socket_fds_after}")
        if self.fds_after > self.fds_before + FD_SLACK:
            out.append(f"fds {self.fds_before} -> {self.fds_after}")
        for kind in FINDING_KINDS:
            if self.stats[kind]:
                out.append(f"{kind}: {self.stats[kind]}")
        return out


FINDING_KINDS = (
    "connect_failures",  # the server refused or did not accept a connection
    "unparsable_output",  # the server sent bytes that are not a STOMP server frame
    "error_without_message",  # an ERROR frame without a message header
    "frame_after_error",  # a frame followed an ERROR on the same connection
    "error_not_closed",  # no close within ERROR_CLOSE_TIMEOUT after an ERROR
    "no_close_after_eof",  # no close within EOF_TIMEOUT after the client's EOF
    "send_stalled",  # the server stopped reading for SEND_TIMEOUT
)


class Campaign:
    def __init__(
        self,
        address: tuple[str, int],
        *,
        frames: int,
        seed: int,
        limits: Limits,
        workers: int = 4,
        max_seconds: float | None = None,
        alive: Callable[[], bool] = lambda: True,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.address = address
        self.target = frames
        self.seed = seed
        self.limits = limits
        self.workers = workers
        self.max_seconds = max_seconds
        self.alive = alive
        self.progress = progress
        self.lock = threading.Lock()
        self.result = Result(seed)
        self.recent: dict[int, collections.deque] = {}
        self.deadline = float("inf")
        self.dead = False

    def should_stop(self) -> bool:
        return (
            self.dead or self.result.frames_sent >= self.target or time.monotonic() >= self.deadline
        )

    def finding(self, kind: str, worker: int, case: Case, mode: str, detail: str = "") -> None:
        with self.lock:
            self.result.stats[kind] += 1
            if len(self.result.findings) < MAX_FINDINGS:
                self.result.findings.append(
                    {
                        "finding": kind,
                        "worker": worker,
                        "kind": case.kind,
                        "mode": mode,
                        "detail": detail,
                        "data": repr(case.data[:3000]),
                    }
                )

    def run_workers(self) -> None:
        start = time.monotonic()
        if self.max_seconds is not None:
            self.deadline = start + self.max_seconds
        threads = [
            threading.Thread(target=self.worker, args=(i,), name=f"fuzz-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for t in threads:
            t.start()
        last = start
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            if not self.alive():
                self.dead = True
            if self.progress and time.monotonic() - last >= 5:
                last = time.monotonic()
                r = self.result
                self.progress(
                    f"{r.frames_sent} frames, {r.connections} connections, "
                    f"{r.stats['recv_ERROR']} ERRORs, {time.monotonic() - start:.0f}s"
                )
        self.result.seconds = time.monotonic() - start

    def worker(self, index: int) -> None:
        rng = random.Random(f"{self.seed}/{index}")
        gen = Generator(rng, self.limits)
        recent: collections.deque = collections.deque(maxlen=30)
        self.recent[index] = recent
        stats: collections.Counter = collections.Counter()
        while not self.should_stop():
            case = gen.case()
            mode = rng.choices(["eof", "linger", "abort", "close"], [50, 15, 20, 15])[0]
            chunks = gen.split(case.data)
            recent.append((case.kind, mode, case.data))
            stats[f"kind_{case.kind}"] += 1
            stats[f"end_{mode}"] += 1
            self.run_case(index, rng, case, mode, chunks, stats)
            with self.lock:
                self.result.frames_sent += case.frames
                self.result.connections += 1
                self.result.bytes_sent += len(case.data)
                if self.result.connections % 50 == 0:
                    self.result.stats.update(stats)
                    stats.clear()
        with self.lock:
            self.result.stats.update(stats)

    def run_case(self, index, rng, case, mode, chunks, stats) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
        except OSError as exc:
            if self.alive():
                self.finding("connect_failures", index, case, mode, repr(exc))
            else:
                self.dead = True
            return
        state = {"error": False, "after_error": False, "broken": False, "version": "-"}
        parser = ResponseParser()

        def feed(data: bytes) -> None:
            if state["broken"]:
                return
            try:
                frames = parser.feed(data)
                violation = None
            except ProtocolViolation as exc:
                state["broken"] = True
                frames, violation = exc.frames, exc
            for frame in frames:
                stats[f"recv_{frame.command}"] += 1
                if frame.command == "CONNECTED":
                    state["version"] = frame.headers.get("version", "1.0")
                if state["error"] and not state["after_error"]:
                    state["after_error"] = True
                    self.finding("frame_after_error", index, case, mode, frame.command)
                if frame.command == "ERROR":
                    state["error"] = True
                    if not frame.headers.get("message"):
                        self.finding("error_without_message", index, case, mode, repr(frame))
            if violation is not None:
                detail = f"[session version {state['version']}] {violation}"
                self.finding("unparsable_output", index, case, mode, detail)

        def read(until: float, idle: float | None = None, stop_on_error=False) -> bool | None:
            """Read until EOF (True), the deadline or idle time (False), or an ERROR (None)."""
            while True:
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return False
                sock.settimeout(min(remaining, idle) if idle else remaining)
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    if idle:
                        return False
                    continue
                except OSError:
                    return True
                if not data:
                    return True
                feed(data)
                if stop_on_error and state["error"]:
                    return None

        with sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(SEND_TIMEOUT)
            closed_early = False
            try:
                for i, chunk in enumerate(chunks):
                    sock.sendall(chunk)
                    if i and rng.random() < 0.02:
                        time.sleep(rng.random() * 0.005)
            except TimeoutError:
                self.finding("send_stalled", index, case, mode)
                closed_early = True
            except OSError:
                stats["closed_while_sending"] += 1
                closed_early = True

            if closed_early or mode == "eof":
                if not closed_early:
                    try:
                        sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                closed = read(time.monotonic() + EOF_TIMEOUT)
                if not closed:
                    self.finding("no_close_after_eof", index, case, mode)
            elif mode == "linger":
                got = read(time.monotonic() + 2.0, idle=LINGER_IDLE, stop_on_error=True)
                if got is not True and state["error"]:
                    got = read(time.monotonic() + ERROR_CLOSE_TIMEOUT)
                    if not got:
                        self.finding("error_not_closed", index, case, mode)
                if got is not True:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif mode == "abort":
                if rng.random() < 0.5:
                    read(time.monotonic() + rng.random() * 0.01, idle=0.005)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # mode "close": just close
            if mode in ("eof", "linger") and parser.pending() and not state["broken"]:
                stats["truncated_output"] += 1

    def dump_recent(self, path: Path) -> str:
        with path.open("w") as out:
            out.write(f"# seed {self.seed}; last cases of each worker, oldest first\n")
            for index, recent in sorted(self.recent.items()):
                for kind, mode, data in recent:
                    out.write(f"{index}\t{kind}\t{mode}\t{data!r}\n")
        return str(path)


def run_campaign(
    address: tuple[str, int],
    *,
    pid: int,
    frames: int,
    seed: int,
    limits: Limits,
    workers: int = 4,
    max_seconds: float | None = None,
    alive: Callable[[], bool] = lambda: True,
    dump_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Result:
    """Baseline, fuzz (with a round-tripping client alongside), then the checks."""
    campaign = Campaign(
        address,
        frames=frames,
        seed=seed,
        limits=limits,
        workers=workers,
        max_seconds=max_seconds,
        alive=alive,
        progress=progress,
    )
    result = campaign.result
    # warm up whatever the server creates lazily, then take the baseline
    check_good_client(address, roundtrips=2, persistent=True)
    result.conns_before = wait_for_connections(pid, 0, 10.0)
    result.fds_before, result.socket_fds_before = server_fds(pid)
    result.rss_mb_before = server_rss_mb(pid)

    tripper = RoundTripper(address)
    tripper.start()
    try:
        campaign.run_workers()
    finally:
        tripper.stop()
    result.roundtrips_ok = tripper.ok
    result.roundtrip_failures = tripper.failures
    result.roundtrip_max_latency = tripper.max_latency

    result.server_alive = alive()
    if result.server_alive:
        try:
            check_good_client(address)
            result.post_check = "ok"
        except Exception as exc:
            result.post_check = repr(exc)
        result.conns_after = wait_for_connections(pid, result.conns_before, 10.0)
        deadline = time.monotonic() + 5.0
        while True:
            result.fds_after, result.socket_fds_after = server_fds(pid)
            if result.socket_fds_after <= result.socket_fds_before:
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        result.rss_mb_after = server_rss_mb(pid)
    if dump_dir is not None and result.problems():
        result.dump = campaign.dump_recent(dump_dir / f"fuzz-seed{seed}-recent-cases.txt")
    return result


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=100_000, help="frames to send (default 100000)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    ap.add_argument("--workers", type=int, default=4, help="fuzzing threads (default 4)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop early after this")
    ap.add_argument("--max-frame-bytes", type=int, default=Limits.max_frame_bytes)
    ap.add_argument("--max-headers", type=int, default=Limits.max_headers)
    ap.add_argument("--max-header-bytes", type=int, default=Limits.max_header_bytes)
    ap.add_argument("--workdir", type=Path, default=None, help="server data and log (kept)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    limits = Limits(args.max_frame_bytes, args.max_headers, args.max_header_bytes)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pairmq-fuzz-"))

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"fuzz: {line}", file=sys.stderr, flush=True)

    progress(f"seed {seed}, {args.frames} frames, work dir {workdir}")
    srv = start_server(workdir, *limits.flags(), "--user", "admin:secret", name="fuzz")
    try:
        result = run_campaign(
            srv.address,
            pid=srv.proc.pid,
            frames=args.frames,
            seed=seed,
            limits=limits,
            workers=args.workers,
            max_seconds=args.max_seconds,
            alive=srv.alive,
            dump_dir=workdir,
            progress=progress,
        )
    finally:
        alive_at_end = srv.alive()
        srv.stop()
    result.server_alive = result.server_alive and alive_at_end
    summary = result.summary()
    problems = result.problems()
    if problems:
        summary["workdir"] = str(workdir)
        progress("FAILED: " + "; ".join(problems))
        for f in result.findings[:10]:
            progress(f"finding: {json.dumps(f)[:600]}")
        progress("server log tail:\n" + srv.logs()[-3000:])
    elif args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(summary), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
