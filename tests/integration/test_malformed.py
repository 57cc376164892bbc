"""Bad input over raw sockets against a real server (docs/stomp.md, "Frames and limits").

For every bad input the server answers an ERROR whose `message` names the
problem, then closes that connection, and keeps serving everyone else: after
each case a client that was connected all along still sends and receives, and a
new client can connect. All cases run against one server (small limits), so the
same process has to survive every one of them.
"""

from __future__ import annotations

import re
import socket
import struct
import time
import uuid
from dataclasses import dataclass

import pytest

from pairmq.protocol.limits import HEADERS_ADDED
from tests.integration.rawstomp import escape, unescape
from tests.serverproc import start_server

MAX_FRAME_BYTES = 8192
MAX_HEADERS = 16
MAX_HEADER_BYTES = 256
IO_TIMEOUT = 5.0

# What an ERROR's message must mention (case-insensitive), per problem.
FRAME_TOO_LARGE = r"too (large|big|long)|max[_ -]?frame|exceed|limit|size"
TOO_MANY_HEADERS = r"too many headers|max[_ -]?headers|number of headers|header count"
HEADER_TOO_LONG = r"header.*(too (long|large|big)|exceed|limit)|max[_ -]?header[_ -]?bytes"
CONTENT_LENGTH = r"content-length"
ESCAPE = r"escape"
NOT_UTF8 = r"utf-?8|decod|encod|unicode"
UNKNOWN_COMMAND = r"command"
NOT_CONNECTED = r"connect|log ?in"
DESTINATION = r"destination"
ID = r"\bid\b"
NO_NUL = r"content-length|\bnul\b|null|terminat"
ANYTHING = r"\S"


# --------------------------------------------------------------------------- raw client


@dataclass
class Frame:
    command: str
    headers: dict[str, str]
    body: bytes


def frame(command: str, headers=(), body: bytes = b"") -> bytes:
    """A well-formed 1.2 frame (headers escaped, except on CONNECT/STOMP)."""
    if command in ("CONNECT", "STOMP"):
        lines = [command] + [f"{k}:{v}" for k, v in headers]
    else:
        lines = [command] + [f"{escape(k, '1.2')}:{escape(v, '1.2')}" for k, v in headers]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\x00"


def connect_frame(version: str = "1.2", login: str | None = None, passcode: str | None = None):
    headers = [("accept-version", version), ("host", "localhost"), ("heart-beat", "0,0")]
    if login is not None:
        headers.append(("login", login))
    if passcode is not None:
        headers.append(("passcode", passcode))
    return frame("CONNECT", headers)


class NothingReceived(AssertionError):
    pass


class RawClient:
    """A STOMP client on a bare socket that sends exactly the bytes it is given."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=IO_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.eof = False
        self.version = None

    def send(self, data: bytes) -> bool:
        """Send bytes; False if the server had already closed (it may have answered first)."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return True

    def connect(self, version: str = "1.2", **kwargs) -> Frame:
        self.send(connect_frame(version, **kwargs))
        reply = self.read_frame()
        assert reply is not None, "server closed instead of answering CONNECT"
        assert reply.command == "CONNECTED", f"CONNECT refused: {reply}"
        return reply

    def read_frame(self, timeout: float = IO_TIMEOUT) -> Frame | None:
        """The next frame; None once the server has closed the connection."""
        deadline = time.monotonic() + timeout
        while True:
            parsed = self._parse()
            if parsed is not None:
                return parsed
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NothingReceived(
                    f"nothing from the server within {timeout}s (buffered {bytes(self.buf)!r})"
                )
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # reset by the server: closed
                data = b""
            if not data:
                self.eof = True
            self.buf += data

    def _parse(self) -> Frame | None:
        buf = self.buf
        while buf[:1] in (b"\n", b"\r"):
            del buf[:1]
        lines, pos = [], 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                return None
            line = bytes(buf[pos:nl]).removesuffix(b"\r")
            pos = nl + 1
            if not line:
                break
            lines.append(line)
        command = lines[0].decode()
        headers: dict[str, str] = {}
        for raw in lines[1:]:
            key, sep, value = raw.decode("utf-8").partition(":")
            assert sep, f"server sent a header line without colon: {raw!r}"
            if command != "CONNECTED" and self.version != "1.0":
                key, value = unescape(key, "1.2"), unescape(value, "1.2")
            headers.setdefault(key, value)
        if command == "CONNECTED":
            self.version = headers.get("version", "1.0")
        if "content-length" in headers:
            end = pos + int(headers["content-length"])
            if len(buf) <= end:
                return None
            assert buf[end] == 0, f"no NUL after the body of {command}"
        else:
            end = buf.find(b"\x00", pos)
            if end < 0:
                return None
        body = bytes(buf[pos:end])
        del buf[: end + 1]
        return Frame(command, headers, body)

    def expect_error(self, pattern: str, timeout: float = IO_TIMEOUT) -> Frame:
        """Read up to an ERROR whose message matches `pattern`, and check the close after it."""
        seen = []
        while True:
            got = self.read_frame(timeout)
            assert got is not None, f"server closed without an ERROR (frames before: {seen})"
            if got.command == "ERROR":
                break
            seen.append(got)
        message = got.headers.get("message", "")
        assert message, f"ERROR without a message header: {got}"
        assert re.search(pattern, message, re.IGNORECASE), (
            f"ERROR message {message!r} does not name the problem (expected /{pattern}/)"
        )
        self.assert_closed()
        return got

    def assert_closed(self, timeout: float = IO_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                extra = self.read_frame(max(remaining, 0.001))
            except NothingReceived:
                raise AssertionError(
                    f"server did not close the connection within {timeout}s"
                ) from None
            if extra is None:
                return
            raise AssertionError(f"server sent {extra} after the ERROR instead of closing")

    def roundtrip(self, destination: str) -> None:
        """SEND (with receipt) to a queue this client subscribed to, and get it back."""
        body = f"ping-{uuid.uuid4().hex}".encode()
        receipt = f"rt-{uuid.uuid4().hex}"
        self.send(frame("SEND", [("destination", destination), ("receipt", receipt)], body))
        got_receipt = got_message = False
        while not (got_receipt and got_message):
            got = self.read_frame()
            assert got is not None, "connection closed during a round trip"
            assert got.command != "ERROR", f"ERROR during a round trip: {got}"
            if got.command == "RECEIPT" and got.headers.get("receipt-id") == receipt:
                got_receipt = True
            elif got.command == "MESSAGE" and got.body == body:
                got_message = True

    def subscribe(self, destination: str, sub_id: str = "0") -> list[Frame]:
        """SUBSCRIBE with a receipt; returns the MESSAGEs that came before the RECEIPT."""
        receipt = f"sub-{uuid.uuid4().hex}"
        headers = [("destination", destination), ("id", sub_id), ("receipt", receipt)]
        self.send(frame("SUBSCRIBE", headers))
        early = []
        while True:
            got = self.read_frame()
            assert got is not None, "connection closed after SUBSCRIBE"
            if got.command != "MESSAGE":
                break
            early.append(got)
        assert got.command == "RECEIPT", f"SUBSCRIBE not receipted: {got}"
        assert got.headers.get("receipt-id") == receipt
        return early

    def first_message(self, destination: str) -> Frame:
        """Subscribe and return the first MESSAGE."""
        early = self.subscribe(destination)
        got = early[0] if early else self.read_frame()
        assert got is not None and got.command == "MESSAGE", got
        return got

    def reset(self) -> None:
        """Abortive close: the server sees a TCP reset."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


# --------------------------------------------------------------------------- fixtures


class Bystander:
    """A client connected for the whole module, subscribed to its own queue."""

    def __init__(self, address) -> None:
        self.client = RawClient(address)
        self.client.connect()
        self.queue = f"/queue/bystander-{uuid.uuid4().hex}"
        self.client.subscribe(self.queue)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    srv = start_server(
        tmp_path_factory.mktemp("malformed"),
        "--user",
        "admin:secret",
        "--max-frame-bytes",
        str(MAX_FRAME_BYTES),
        "--max-headers",
        str(MAX_HEADERS),
        "--max-header-bytes",
        str(MAX_HEADER_BYTES),
        name="malformed",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def bystander(broker):
    b = Bystander(broker.address)
    yield b
    b.client.close()


def assert_others_unaffected(srv, bystander: Bystander) -> None:
    assert srv.alive(), f"server died:\n{srv.logs()[-3000:]}"
    bystander.client.roundtrip(bystander.queue)
    fresh = RawClient(srv.address)
    try:
        fresh.connect()
        own = f"/queue/fresh-{uuid.uuid4().hex}"
        fresh.subscribe(own)
        fresh.roundtrip(own)
        fresh.send(frame("DISCONNECT", [("receipt", "bye")]))
        got = fresh.read_frame()
        assert got is not None and got.command == "RECEIPT", f"DISCONNECT not receipted: {got}"
    finally:
        fresh.close()


def assert_nothing_stored(srv, destination: str, problem: str) -> None:
    """A marker sent to `destination` is the first message it hands out: nothing else was
    stored there (else AssertionError: `problem`, and what came instead)."""
    client = RawClient(srv.address)
    try:
        client.connect()
        client.send(frame("SEND", [("destination", destination), ("receipt", "m")], b"marker"))
        got = client.read_frame()
        assert got is not None and got.command == "RECEIPT", got
        got = client.first_message(destination)
        assert got.body == b"marker", f"{problem}: {got}"
    finally:
        client.close()


def error_case(srv, bystander, data: bytes, pattern: str, version: str | None = "1.2") -> Frame:
    """Connect (unless version is None), send `data`, expect ERROR + close, check the others."""
    client = RawClient(srv.address)
    try:
        if version is not None:
            client.connect(version)
        client.send(data)
        error = client.expect_error(pattern)
    finally:
        client.close()
    assert_others_unaffected(srv, bystander)
    return error


def send_head(headers: list[tuple[str, str]], command: str = "SEND") -> bytes:
    """Command and header lines and the blank line, without a body or NUL."""
    return frame(command, headers)[:-1]


Q = "/queue/malformed"


# --------------------------------------------------------------------------- limits


def test_content_length_over_max_frame_bytes(broker, bystander):
    n = MAX_FRAME_BYTES + 1
    data = send_head([("destination", Q), ("content-length", str(n))]) + b"x" * n + b"\x00"
    error_case(broker, bystander, data, FRAME_TOO_LARGE)


def test_absurd_content_length_is_refused_without_waiting_for_the_body(broker, bystander):
    # the body sent stays under the limit: the declared length alone must be refused
    data = send_head([("destination", Q), ("content-length", str(10**15))]) + b"x" * 100
    error_case(broker, bystander, data, FRAME_TOO_LARGE + "|" + CONTENT_LENGTH)


def test_streamed_body_without_nul_past_the_limit(broker, bystander):
    data = send_head([("destination", Q)]) + b"y" * (MAX_FRAME_BYTES * 2)
    error_case(broker, bystander, data, FRAME_TOO_LARGE)


def test_too_many_headers(broker, bystander):
    headers = [("destination", Q)] + [(f"h{i}", "v") for i in range(MAX_HEADERS * 4)]
    error_case(broker, bystander, frame("SEND", headers, b"body"), TOO_MANY_HEADERS)


def test_header_line_too_long(broker, bystander):
    headers = [("destination", Q), ("x-long", "a" * (MAX_HEADER_BYTES * 4))]
    error_case(broker, bystander, frame("SEND", headers, b"body"), HEADER_TOO_LONG)


def test_header_line_too_long_on_connect(broker, bystander):
    data = connect_frame().replace(b"host:localhost", b"host:" + b"h" * (MAX_HEADER_BYTES * 4))
    error_case(broker, bystander, data, HEADER_TOO_LONG, version=None)


def test_frames_within_the_limits_are_accepted(broker, bystander):
    """The control for the cases above: near the limits, but under them, is fine."""
    client = RawClient(broker.address)
    try:
        client.connect()
        own = f"/queue/limits-{uuid.uuid4().hex}"
        client.subscribe(own)
        headers = [("destination", own), ("receipt", "r1")]
        # as many headers as the MESSAGE can carry with the server's own (protocol/limits.py)
        headers += [(f"h{i}", "v") for i in range(MAX_HEADERS - HEADERS_ADDED - 1)]
        headers.append(("x-long", "a" * (MAX_HEADER_BYTES // 2)))
        body = b"z" * (MAX_FRAME_BYTES // 2)
        client.send(frame("SEND", [*headers, ("content-length", str(len(body)))], body))
        kinds = set()
        while kinds != {"RECEIPT", "MESSAGE"}:
            got = client.read_frame()
            assert got is not None and got.command in ("RECEIPT", "MESSAGE"), got
            kinds.add(got.command)
            if got.command == "MESSAGE":
                assert got.body == body
    finally:
        client.close()


# --------------------------------------------------------------------------- frame syntax


@pytest.mark.parametrize(
    "value",
    ["abc", "-1", "", "1.5", "0x10", "1_0", "\u0663", "5 5"],
    ids=["letters", "negative", "empty", "decimal", "hex", "underscore", "arabic-digit", "two"],
)
def test_invalid_content_length(broker, bystander, value):
    # the body matches what a lax int() would make of the value, so only refusing helps
    data = b"SEND\ndestination:" + Q.encode() + b"\ncontent-length:" + value.encode()
    data += b"\n\n0123456789\x00"
    error_case(broker, bystander, data, CONTENT_LENGTH)


@pytest.mark.parametrize(
    "body",
    [b"hello world", b"he"],
    ids=["body-longer", "body-shorter-then-frames"],
)
def test_content_length_mismatch_missing_nul(broker, bystander, body):
    data = send_head([("destination", Q), ("content-length", "5")]) + body + b"\x00"
    if len(body) < 5:  # the NUL is read as body; what follows must then be the NUL
        data += b"SEND\n"
    error_case(broker, bystander, data, NO_NUL)


@pytest.mark.parametrize(
    "line",
    [b"x:a\\tb", b"x:trailing\\", b"x\\ty:1", b"x:\\u0041"],
    ids=["tab-in-value", "trailing-backslash", "in-name", "unicode-escape"],
)
def test_undefined_escape_in_1_2_header(broker, bystander, line):
    data = b"SEND\ndestination:" + Q.encode() + b"\n" + line + b"\n\nbody\x00"
    error_case(broker, bystander, data, ESCAPE)


def test_carriage_return_escape_is_undefined_in_1_1(broker, bystander):
    data = b"SEND\ndestination:" + Q.encode() + b"\nx:a\\rb\n\nbody\x00"
    error_case(broker, bystander, data, ESCAPE, version="1.1")


def test_backslashes_where_escaping_does_not_apply_are_accepted(broker, bystander):
    """Controls: 1.0 headers and CONNECT headers are not escaped, so no ERROR."""
    client = RawClient(broker.address)
    try:
        client.send(b"CONNECT\naccept-version:1.0\nhost:a\\tb\nheart-beat:0,0\nx-odd:c\\\n\n\x00")
        got = client.read_frame()
        assert got is not None and got.command == "CONNECTED", got
        client.send(b"SEND\ndestination:" + Q.encode() + b"\nx:a\\tb\nreceipt:r10\n\nbody\x00")
        got = client.read_frame()
        assert got is not None and got.command == "RECEIPT", got
    finally:
        client.close()


@pytest.mark.parametrize(
    "line",
    [b"x:\xff\xfe", b"\xc3\x28:value", b"x:\xed\xa0\x80", b"x:\xc0\xaf"],
    ids=["invalid-bytes", "in-name", "surrogate", "overlong"],
)
def test_non_utf8_header_bytes(broker, bystander, line):
    data = b"SEND\ndestination:" + Q.encode() + b"\n" + line + b"\n\nbody\x00"
    error_case(broker, bystander, data, NOT_UTF8)


def test_non_utf8_command_line(broker, bystander):
    error_case(broker, bystander, b"SE\xffND\ndestination:/queue/a\n\nx\x00", NOT_UTF8 + "|command")


@pytest.mark.parametrize("command", ["FROBNICATE", "send", "SEND2", "MESSAGE", "CONNECTED"])
def test_unknown_command(broker, bystander, command):
    data = command.encode() + b"\ndestination:" + Q.encode() + b"\n\nbody\x00"
    error_case(broker, bystander, data, UNKNOWN_COMMAND + "|" + command)


@pytest.mark.parametrize(
    "data",
    [
        b"\xde\xad\xbe\xef\x00\x01\n\x02\x03\n\n\x00",
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n\x00",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\n\n\x00",
        b"::::\n:\n\n\x00",
        b"\\\\\\\n\n\x00",
    ],
    ids=["binary", "http", "tls-hello", "colons", "backslashes"],
)
@pytest.mark.parametrize("connected", [False, True], ids=["before-connect", "after-connect"])
def test_garbage(broker, bystander, data, connected):
    error_case(broker, bystander, data, ANYTHING, version="1.2" if connected else None)


def test_error_stops_the_connection_frames_after_it_are_ignored(broker, bystander):
    """A SEND pipelined behind a bad frame must not be delivered."""
    own = f"/queue/after-error-{uuid.uuid4().hex}"
    data = b"FROBNICATE\n\n\x00" + frame("SEND", [("destination", own)], b"must not arrive")
    error_case(broker, bystander, data, UNKNOWN_COMMAND)
    assert_nothing_stored(broker, own, "a frame after the ERROR was processed")


def test_header_values_cannot_forge_headers_for_a_1_0_subscriber(broker, bystander):
    """1.0 has no escaping: a 1.2 sender's CR/LF in a value must not reach a 1.0 client as
    a line end, or any sender could forge headers (content-length, subscription, ...)."""
    own = f"/queue/forge-{uuid.uuid4().hex}"
    subscriber = RawClient(broker.address)
    publisher = RawClient(broker.address)
    try:
        subscriber.send(b"CONNECT\nhost:localhost\n\n\x00")  # no accept-version: 1.0
        got = subscriber.read_frame()
        assert got is not None and got.command == "CONNECTED", got
        assert subscriber.version == "1.0", got
        subscriber.subscribe(own)
        publisher.connect()
        forged = [
            ("x-lf", "a\ncontent-length:0\nforged-lf:yes"),
            ("x-cr", "b\rforged-cr:yes"),
            ("receipt", "forge"),
        ]
        publisher.send(frame("SEND", [("destination", own), *forged], b"hello"))
        publisher.send(frame("SEND", [("destination", own)], b"second"))
        got = publisher.read_frame()
        assert got is not None and got.command == "RECEIPT", got
        for body in (b"hello", b"second"):
            try:
                got = subscriber.read_frame()
            except AssertionError as exc:
                raise AssertionError(
                    f"the 1.0 subscriber got a corrupted frame ({exc}): {bytes(subscriber.buf)!r}"
                ) from None
            assert got is not None and got.command == "MESSAGE", got
            assert got.body == body, f"frames out of step: {got}"
            assert not {"forged-lf", "forged-cr"} & set(got.headers), f"forged header: {got}"
            assert got.headers.get("subscription") == "0", got
    finally:
        subscriber.close()
        publisher.close()
    assert_others_unaffected(broker, bystander)


def test_one_message_reaches_subscribers_of_every_version_each_in_its_own_escaping(
        broker, bystander):
    """A MESSAGE's head is encoded once and cached on the message for the version it was
    encoded for: a topic whose subscribers speak 1.2, 1.0, 1.1 and 1.2 again must give
    each the head of its own version (escaped LF for 1.1 and 1.2, a space for 1.0), not
    the one cached for the subscriber before it."""
    own = f"/topic/versions-{uuid.uuid4().hex}"
    subscribers = [RawClient(broker.address) for _ in range(4)]
    publisher = RawClient(broker.address)
    try:
        for client, version in zip(subscribers, ("1.2", "1.0", "1.1", "1.2"), strict=True):
            if version == "1.0":
                client.send(b"CONNECT\nhost:localhost\n\n\x00")  # no accept-version: 1.0
                got = client.read_frame()
                assert got is not None and got.command == "CONNECTED", got
            else:
                client.connect(version)
            assert client.version == version
            client.subscribe(own)
        publisher.connect()
        publisher.send(frame("SEND", [("destination", own), ("x-lf", "a\nb"),
                                      ("x-colon", "k:v"), ("receipt", "sent")], b"one"))
        got = publisher.read_frame()
        assert got is not None and got.command == "RECEIPT", got
        for client in subscribers:
            got = client.read_frame()
            assert got is not None and got.command == "MESSAGE", got
            assert got.body == b"one"
            want = "a b" if client.version == "1.0" else "a\nb"
            assert got.headers.get("x-lf") == want, (client.version, got)
            assert got.headers.get("x-colon") == "k:v", (client.version, got)
            assert got.headers.get("message-id", "").startswith("ID:"), got
    finally:
        for client in (*subscribers, publisher):
            client.close()
    assert_others_unaffected(broker, bystander)


# --------------------------------------------------------------------------- session rules


@pytest.mark.parametrize(
    "data",
    [
        frame("SEND", [("destination", Q)], b"too early"),
        frame("SUBSCRIBE", [("destination", Q), ("id", "0")]),
        frame("BEGIN", [("transaction", "t")]),
    ],
    ids=["SEND", "SUBSCRIBE", "BEGIN"],
)
def test_frame_before_connect(broker, bystander, data):
    error_case(broker, bystander, data, NOT_CONNECTED, version=None)


@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
def test_second_connect_on_a_connected_session(broker, bystander, command):
    data = connect_frame().replace(b"CONNECT", command.encode(), 1)
    error_case(broker, bystander, data, NOT_CONNECTED)


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (frame("SEND", [], b"nowhere"), DESTINATION),
        (frame("SUBSCRIBE", [("destination", Q)]), ID),
        (frame("SUBSCRIBE", [("id", "7")]), DESTINATION),
        (frame("ACK", []), ID),
        (frame("NACK", []), ID),
        (frame("UNSUBSCRIBE", []), ID),
    ],
    ids=[
        "SEND-destination",
        "SUBSCRIBE-id",
        "SUBSCRIBE-destination",
        "ACK-id",
        "NACK-id",
        "UNSUBSCRIBE-id",
    ],
)
def test_missing_required_header(broker, bystander, data, pattern):
    error_case(broker, bystander, data, pattern)


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE"])
@pytest.mark.parametrize("destination", ["/bogus/x", "queue/x", "/exchange/x"])
def test_bad_destination_prefix(broker, bystander, command, destination):
    headers = [("destination", destination), ("id", "1")]
    pattern = DESTINATION + "|" + re.escape(destination)
    error = error_case(broker, bystander, frame(command, headers, b"x"), pattern)
    named = error.headers["message"] + error.body.decode(errors="replace")
    assert destination in named, f"the ERROR does not name {destination!r}: {error}"


def test_wrong_password(server_factory):
    srv = server_factory("--user", "admin:secret", anonymous=False)
    other = RawClient(srv.address)
    try:
        other.connect(login="admin", passcode="secret")
        queue = f"/queue/auth-{uuid.uuid4().hex}"
        other.subscribe(queue)
        messages = []
        for login, passcode in [("admin", "wrong"), ("nobody", "secret"), ("admin", "")]:
            client = RawClient(srv.address)
            try:
                client.send(connect_frame(login=login, passcode=passcode))
                messages.append(client.expect_error(r"authentication failed").headers["message"])
            finally:
                client.close()
            other.roundtrip(queue)
            fresh = RawClient(srv.address)
            fresh.connect(login="admin", passcode="secret")
            fresh.close()
        # the message does not tell whether the user exists
        assert len(set(messages)) == 1, messages
        anonymous = RawClient(srv.address)
        try:
            anonymous.send(connect_frame())
            anonymous.expect_error(r"authenticat|login|anonymous|credential")
        finally:
            anonymous.close()
        other.roundtrip(queue)
    finally:
        other.close()


# --------------------------------------------------------------------------- receipts


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (frame("SEND", [("destination", "/bogus/r"), ("receipt", "r-dest")], b"x"), DESTINATION),
        (frame("SEND", [("receipt", "r-dest")], b"x"), DESTINATION),
        (frame("SUBSCRIBE", [("destination", Q), ("receipt", "r-dest")]), ID),
        (frame("ACK", [("id", "never-given"), ("receipt", "r-dest")]), ANYTHING),
        (frame("COMMIT", [("transaction", "unknown"), ("receipt", "r-dest")]), ANYTHING),
    ],
    ids=["bad-destination", "no-destination", "no-subscription-id", "unknown-ack", "unknown-tx"],
)
def test_error_for_a_frame_with_receipt_carries_receipt_id(broker, bystander, data, pattern):
    error = error_case(broker, bystander, data, pattern)
    assert error.headers.get("receipt-id") == "r-dest", error


def test_receipt_id_is_escaped_in_the_error(broker, bystander):
    data = frame("SEND", [("destination", "/bogus/r"), ("receipt", "a:b\\c")], b"x")
    error = error_case(broker, bystander, data, DESTINATION)
    assert error.headers.get("receipt-id") == "a:b\\c", error


# ---------------------------------------------------------------- idle and broken clients


def test_silent_clients_do_not_affect_others(broker, bystander):
    silent = [RawClient(broker.address) for _ in range(50)]
    try:
        connected_silent = RawClient(broker.address)
        connected_silent.connect()
        silent.append(connected_silent)
        for _ in range(3):
            assert_others_unaffected(broker, bystander)
            time.sleep(0.2)
    finally:
        for c in silent:
            c.close()
    assert_others_unaffected(broker, bystander)


@pytest.mark.parametrize(
    "half",
    [
        b"CONN",
        b"CONNECT\naccept-version:1.2\nhost:loc",
        b"SEND\ndestination:/queue/stall\ncontent-length:100\n\nonly part of the body",
        b"SEND\ndestination:/queue/stall\n\nno NUL yet",
    ],
    ids=["command", "connect-headers", "body-by-length", "body-to-nul"],
)
def test_half_frame_then_stall_does_not_affect_others(broker, bystander, half):
    stalled = []
    try:
        for _ in range(5):
            c = RawClient(broker.address)
            if half.startswith(b"SEND"):
                c.connect()
            c.send(half)
            stalled.append(c)
        for _ in range(3):
            assert_others_unaffected(broker, bystander)
            time.sleep(0.1)
    finally:
        for c in stalled:
            c.close()
    assert_others_unaffected(broker, bystander)


@pytest.mark.parametrize("abort", [True, False], ids=["reset", "close"])
def test_abrupt_disconnect_mid_frame(broker, bystander, abort):
    own = f"/queue/abrupt-{uuid.uuid4().hex}"
    halves = [
        b"CONNECT\naccept-version:1.2\nho",
        frame("SEND", [("destination", own), ("content-length", "100")])[:-1] + b"partial",
        frame("SEND", [("destination", own)])[:-1] + b"partial, no NUL",
        frame("SEND", [("destination", own), ("receipt", "r")], b"cut")[:-1],
    ]
    for half in halves:
        for _ in range(3):
            c = RawClient(broker.address)
            if half.startswith(b"SEND"):
                c.connect()
            c.send(half)
            if abort:
                c.reset()
            else:
                c.close()
        assert_others_unaffected(broker, bystander)
    # none of the cut SENDs was delivered
    assert_nothing_stored(broker, own, "a cut frame was delivered")


def test_disconnect_while_server_is_sending(broker, bystander):
    """A subscriber that vanishes while messages flow to it must not disturb anyone."""
    own = f"/queue/vanish-{uuid.uuid4().hex}"
    producer = RawClient(broker.address)
    try:
        producer.connect()
        body = b"m" * 2000
        for _ in range(200):
            producer.send(frame("SEND", [("destination", own)], body))
        producer.send(frame("SEND", [("destination", own), ("receipt", "all")], body))
        got = producer.read_frame()
        assert got is not None and got.command == "RECEIPT", got
        for abort in (True, False, True):
            consumer = RawClient(broker.address)
            consumer.connect()
            subscribe = [("destination", own), ("id", "v"), ("ack", "client")]
            consumer.send(frame("SUBSCRIBE", subscribe))
            consumer.read_frame()  # at least one MESSAGE is on its way
            if abort:
                consumer.reset()
            else:
                consumer.close()
            assert_others_unaffected(broker, bystander)
    finally:
        producer.close()


# --------------------------------------------------------------------------- last


def test_server_logged_no_unhandled_exception(broker, bystander):
    """Runs last: bad input is a protocol error, never a crash in a handler."""
    assert_others_unaffected(broker, bystander)
    logs = broker.logs()
    for marker in ("Traceback", "exception was never retrieved", "Unhandled exception"):
        assert marker not in logs, f"{marker!r} in the server log:\n{logs[-5000:]}"
