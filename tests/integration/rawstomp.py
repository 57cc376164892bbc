"""A tiny, self-contained STOMP client on a raw socket, for exact wire checks.

Nothing here is clever: frames are written byte for byte as asked, and read back
with a small reader that understands content-length, NUL terminators, EOL
heart-beats (their arrival times are recorded) and header escaping.
Every read has a bounded timeout.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections import deque
from dataclasses import dataclass, field

DEFAULT_TIMEOUT = 5.0

_ESCAPES_12 = {"n": "\n", "c": ":", "\\": "\\", "r": "\r"}
_ESCAPES_11 = {"n": "\n", "c": ":", "\\": "\\"}
_ids = itertools.count(1)


def unique(prefix: str = "r") -> str:
    """A short identifier unique within the test run."""
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns() % 1_000_000}"


def unique_queue(prefix: str = "q") -> tuple[str, str]:
    """A queue of its own: (its name, its destination /queue/NAME)."""
    name = unique(prefix)
    return name, f"/queue/{name}"


class ConnectionClosed(Exception):
    """The server closed the connection."""


class StompError(AssertionError):
    """An ERROR frame arrived where none was expected."""

    def __init__(self, frame: Frame):
        super().__init__(f"unexpected ERROR frame: {frame.headers!r} {frame.body!r}")
        self.frame = frame


@dataclass
class Frame:
    command: str
    headers: dict[str, str]
    body: bytes = b""
    header_list: list[tuple[str, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        body = self.body if len(self.body) < 200 else self.body[:200] + b"..."
        return f"Frame({self.command!r}, {self.headers!r}, {body!r})"


def escape(value: str, version: str) -> str:
    if version == "1.0":
        return value
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    if version == "1.2":
        value = value.replace("\r", "\\r")
    return value


def unescape(value: str, version: str) -> str:
    if version == "1.0" or "\\" not in value:
        return value
    table = _ESCAPES_12 if version == "1.2" else _ESCAPES_11
    out = []
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value) and value[i + 1] in table:
            out.append(table[value[i + 1]])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def encode_frame(
    command: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes | str = b"",
    *,
    version: str = "1.2",
    content_length: bool = True,
) -> bytes:
    """Encode one frame. Headers are escaped for `version` except on CONNECT/STOMP."""
    if isinstance(body, str):
        body = body.encode()
    items = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    no_escape = command in ("CONNECT", "STOMP")
    lines = [command]
    for key, value in items:
        if not no_escape:
            key, value = escape(key, version), escape(str(value), version)
        lines.append(f"{key}:{value}")
    if content_length and body and not any(k == "content-length" for k, _ in items):
        lines.append(f"content-length:{len(body)}")
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


class RawStomp:
    """One raw STOMP connection. Use `connect()` to open one that is already CONNECTED."""

    def __init__(self, address: tuple[str, int], timeout: float = DEFAULT_TIMEOUT):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.version = "1.2"
        self._buf = bytearray()
        self._pending: deque[Frame] = deque()
        self.heartbeats: list[float] = []  # time.monotonic() of every EOL read between frames
        self.eof = False

    # -- writing -----------------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(
        self,
        command: str,
        headers: dict[str, str] | list[tuple[str, str]] | None = None,
        body: bytes | str = b"",
        *,
        content_length: bool = True,
    ) -> None:
        self.send_raw(
            encode_frame(
                command, headers, body, version=self.version, content_length=content_length
            )
        )

    def heartbeat(self) -> None:
        self.send_raw(b"\n")

    # -- reading -----------------------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete frame before the deadline")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no complete frame before the deadline") from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            self.eof = True
            raise ConnectionClosed(str(exc)) from None
        if not data:
            self.eof = True
            raise ConnectionClosed("server closed the connection")
        self._buf += data

    def _parse_one(self) -> Frame | None:
        buf = self._buf
        now = time.monotonic()
        # EOLs between frames are heart-beats.
        while buf[:1] == b"\n" or buf[:2] == b"\r\n":
            del buf[: 1 if buf[:1] == b"\n" else 2]
            self.heartbeats.append(now)
        if not buf or buf == b"\r":
            return None
        end = buf.find(b"\n\n")
        end_crlf = buf.find(b"\r\n\r\n")
        if end_crlf != -1 and (end == -1 or end_crlf < end):
            head, body_start = bytes(buf[:end_crlf]), end_crlf + 4
        elif end != -1:
            head, body_start = bytes(buf[:end]), end + 2
        else:
            return None
        lines = head.decode("utf-8").replace("\r\n", "\n").split("\n")
        command = lines[0]
        header_list: list[tuple[str, str]] = []
        escaped = command != "CONNECTED"
        for line in lines[1:]:
            key, _, value = line.partition(":")
            if escaped:
                key, value = unescape(key, self.version), unescape(value, self.version)
            header_list.append((key, value))
        headers: dict[str, str] = {}
        for key, value in header_list:
            headers.setdefault(key, value)
        if "content-length" in headers:
            length = int(headers["content-length"])
            if len(buf) < body_start + length + 1:
                return None
            body = bytes(buf[body_start : body_start + length])
            if buf[body_start + length] != 0:
                raise AssertionError(f"frame body not followed by NUL: {head!r}")
            del buf[: body_start + length + 1]
        else:
            nul = buf.find(b"\x00", body_start)
            if nul == -1:
                return None
            body = bytes(buf[body_start:nul])
            del buf[: nul + 1]
        return Frame(command, headers, body, header_list)

    def read_frame(self, timeout: float = DEFAULT_TIMEOUT) -> Frame:
        """The next frame (EOL heart-beats are recorded and skipped).

        Raises TimeoutError when none arrives in time, ConnectionClosed on EOF.
        """
        if self._pending:
            return self._pending.popleft()
        deadline = time.monotonic() + timeout
        while True:
            frame = self._parse_one()
            if frame is not None:
                return frame
            self._fill(deadline)

    def expect(self, command: str, timeout: float = DEFAULT_TIMEOUT) -> Frame:
        frame = self.read_frame(timeout)
        if frame.command != command:
            if frame.command == "ERROR":
                raise StompError(frame)
            raise AssertionError(f"expected {command}, got {frame!r}")
        return frame

    def wait_receipt(self, receipt_id: str, timeout: float = DEFAULT_TIMEOUT) -> Frame:
        """Read until RECEIPT receipt-id; other frames (MESSAGEs) are kept for later reads."""
        deadline = time.monotonic() + timeout
        stash: list[Frame] = []
        try:
            while True:
                frame = self.read_frame(max(0.0, deadline - time.monotonic()))
                if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt_id:
                    return frame
                if frame.command == "ERROR":
                    raise StompError(frame)
                stash.append(frame)
        finally:
            self._pending.extendleft(reversed(stash))

    def request(
        self,
        command: str,
        headers: dict[str, str] | None = None,
        body: bytes | str = b"",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Frame:
        """Send a frame with a fresh receipt header and wait for its RECEIPT."""
        rid = unique("raw")
        self.send_frame(command, {**(headers or {}), "receipt": rid}, body)
        return self.wait_receipt(rid, timeout)

    def read_message(self, timeout: float = DEFAULT_TIMEOUT) -> Frame:
        return self.expect("MESSAGE", timeout)

    def bodies_until_quiet(self, quiet: float = 0.3) -> list[bytes]:
        """The body of every MESSAGE that comes until none has come for `quiet` seconds."""
        bodies = []
        while True:
            try:
                bodies.append(self.read_message(quiet).body)
            except TimeoutError:
                return bodies

    def assert_quiet(self, wait: float = 0.3) -> None:
        """Nothing at all arrives within `wait` seconds (else AssertionError naming it)."""
        try:
            frame = self.read_frame(wait)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {frame!r}")

    def read_until_closed(self, timeout: float = DEFAULT_TIMEOUT) -> list[Frame]:
        """Every frame until the server closes; TimeoutError if it has not closed in time."""
        deadline = time.monotonic() + timeout
        frames: list[Frame] = list(self._pending)
        self._pending.clear()
        while True:
            try:
                frame = self._parse_one()
            except (UnicodeDecodeError, ValueError):
                frame = None
            if frame is not None:
                frames.append(frame)
                continue
            try:
                self._fill(deadline)
            except ConnectionClosed:
                return frames

    def is_open(self, timeout: float = 0.2) -> bool:
        """True if the server has not closed the connection (data that arrives is kept)."""
        if self.eof:
            return False
        try:
            self._fill(time.monotonic() + timeout)
        except TimeoutError:
            return True
        except ConnectionClosed:
            return False
        return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawStomp:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(
    address: tuple[str, int],
    *,
    version: str | None = "1.2",
    command: str = "CONNECT",
    host: str | None = "localhost",
    login: str | None = None,
    passcode: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    expect: str | None = "CONNECTED",
) -> tuple[RawStomp, Frame]:
    """Open a socket, send CONNECT (or STOMP) and read the answer.

    `version` is the accept-version header (None: no header). With `expect="CONNECTED"`
    an ERROR raises StompError; with `expect=None` the answer is returned whatever it is.
    """
    client = RawStomp(address, timeout)
    hdrs: dict[str, str] = {}
    if version is not None:
        hdrs["accept-version"] = version
    if host is not None:
        hdrs["host"] = host
    if login is not None:
        hdrs["login"] = login
    if passcode is not None:
        hdrs["passcode"] = passcode
    hdrs.update(headers or {})
    client.send_frame(command, hdrs)
    try:
        frame = client.read_frame(timeout)
    except Exception:
        client.close()
        raise
    if frame.command == "CONNECTED":
        client.version = frame.headers.get("version", "1.0")
    if expect is not None and frame.command != expect:
        client.close()
        if frame.command == "ERROR":
            raise StompError(frame)
        raise AssertionError(f"expected {expect}, got {frame!r}")
    return client, frame
