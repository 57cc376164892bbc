"""Property tests: round trips, split invariance, and garbage that only ever gives ProtocolError.

What can round-trip, and is therefore generated:

- Commands: the real ones, or runs of capitals. Never empty and never containing an EOL,
  which the grammar forbids.
- Header names are never empty: the grammar asks for at least one octet, and the parser
  refuses an empty name. `content-length` is only ever the body's true length.
- 1.2 (outside CONNECT/CONNECTED/STOMP): any text at all, NUL included, thanks to escaping.
- 1.1: the same, except a value ending in CR: 1.1 cannot escape CR, and a raw CR right
  before the line's LF is read as part of a CRLF line end.
- 1.0, and CONNECT/CONNECTED/STOMP in every version: no escaping, so no CR or LF anywhere
  (the serializer turns them into spaces) and no colon in names (a line splits at its
  first colon).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pairmq.protocol import Frame, FrameParser, ProtocolError, serialize
from pairmq.protocol.escaping import unescape_header
from pairmq.protocol.headers import parse_header_block
from tests.protocol.helpers import feed_chunks, split_at, to_crlf

pytestmark = pytest.mark.timeout(60)

PLAIN_COMMANDS = ["SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT",
                  "ABORT", "DISCONNECT", "MESSAGE", "RECEIPT", "ERROR"]
CONNECT_COMMANDS = ["CONNECT", "STOMP", "CONNECTED"]
VERSIONS = ["1.0", "1.1", "1.2"]

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

plain_commands = st.one_of(
    st.sampled_from(PLAIN_COMMANDS),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_-", min_size=1, max_size=10).filter(
        lambda c: c not in CONNECT_COMMANDS
    ),
)
# Small texts that favour the characters escaping is about (no NUL: the grammar has none
# in headers, and the parser refuses one, tests/protocol/test_parser.py).
header_text = st.text(
    alphabet=st.one_of(st.sampled_from(":\\\n\r é✓"),
                       st.characters(codec="utf-8", exclude_characters="\x00")),
    max_size=12,
)


def header_name_ok(name: str, escaped: bool, version: str) -> bool:
    if not name or name == "content-length":
        return False
    return escaped or not any(c in name for c in ":\r\n")


def header_value_ok(value: str, escaped: bool, version: str) -> bool:
    if not escaped:
        return "\r" not in value and "\n" not in value
    return not (version == "1.1" and value.endswith("\r"))


@st.composite
def frames(draw, version: str, command=plain_commands) -> Frame:
    """A frame that must come back from serialize() and the parser unchanged."""
    name = draw(command)
    escaped = version != "1.0" and name not in CONNECT_COMMANDS
    names = draw(st.lists(header_text, max_size=6, unique=True))
    headers = {
        n: draw(header_text.filter(lambda v: header_value_ok(v, escaped, version)))
        for n in names
        if header_name_ok(n, escaped, version)
    }
    body = draw(st.binary(max_size=40))
    if draw(st.booleans()):
        headers["content-length"] = str(len(body))
    return Frame(name, headers, body)


def expected(frame: Frame) -> Frame:
    """What the parser returns for serialize(frame): content-length added to a body."""
    if frame.body and "content-length" not in frame.headers:
        return Frame(frame.command, {**frame.headers, "content-length": str(len(frame.body))},
                     frame.body)
    return frame


@st.composite
def streams(draw) -> tuple[str, list[Frame], bytes, int]:
    """(version, frames, wire bytes, heart-beat count): frames among heart-beats, LF or CRLF."""
    version = draw(st.sampled_from(VERSIONS))
    sent = draw(st.lists(frames(version), max_size=5))
    parts, beats = [], 0
    for frame in sent:
        eols = draw(st.lists(st.sampled_from([b"\n", b"\r\n"]), max_size=2))
        beats += len(eols)
        parts.extend(eols)
        wire = serialize(frame, version)
        parts.append(to_crlf(wire) if draw(st.booleans()) else wire)
    return version, [expected(f) for f in sent], b"".join(parts), beats


def same_in_order(got: list[Frame], want: list[Frame]) -> None:
    assert got == want
    assert [list(f.headers) for f in got] == [list(f.headers) for f in want]


@FAST
@given(st.data(), st.sampled_from(VERSIONS), st.booleans())
def test_serialize_then_parse_round_trips(data, version, connect_family):
    command = st.sampled_from(CONNECT_COMMANDS) if connect_family else plain_commands
    frame = data.draw(frames(version, command))
    parser = FrameParser(version=version)
    same_in_order(parser.feed(serialize(frame, version)), [expected(frame)])


@FAST
@given(streams(), st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_any_split_gives_the_same_frames(stream, cuts):
    version, want, wire, beats = stream
    whole = FrameParser(version=version)
    same_in_order(whole.feed(wire), want)
    assert whole.heartbeats == beats
    got, error, parser = feed_chunks(split_at(wire, cuts), FrameParser(version=version))
    assert error is None
    same_in_order(got, want)
    assert parser.heartbeats == beats


def outcome(chunks: list[bytes], version: str) -> tuple[list[Frame], bool]:
    """Frames before any error and whether one came; anything but ProtocolError escapes."""
    parser = FrameParser(max_frame_bytes=300, max_headers=6, max_header_bytes=40,
                         version=version)
    got, error, _ = feed_chunks(chunks, parser)
    return got, error is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(min_value=0, max_value=400), max_size=8),
       st.sampled_from(VERSIONS))
def test_random_bytes_give_frames_or_protocol_error(data, cuts, version):
    assert outcome([data], version) == outcome(split_at(data, cuts), version)


mutations = st.lists(
    st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(min_value=0),
              st.sampled_from(b"\x00\n\r:\\\xff\xc3c-0a9 ")),
    min_size=1, max_size=4,
)


def mutate(wire: bytes, edits) -> bytes:
    data = bytearray(wire)
    for op, where, byte in edits:
        if not data:
            data.append(byte)
            continue
        i = where % len(data)
        if op == "set":
            data[i] = byte
        elif op == "insert":
            data.insert(i, byte)
        else:
            del data[i]
    return bytes(data)


@settings(max_examples=300, deadline=None)
@given(streams(), mutations, st.lists(st.integers(min_value=0, max_value=2000), max_size=8))
def test_mutated_frames_give_frames_or_protocol_error(stream, edits, cuts):
    version, _, wire, _ = stream
    assume(wire)
    data = mutate(wire, edits)
    assert outcome([data], version) == outcome(split_at(data, cuts), version)


@FAST
@given(streams(), st.integers(min_value=1, max_value=50))
def test_truncated_streams_never_raise_and_finish_later(stream, keep):
    version, want, wire, _ = stream
    parser = FrameParser(version=version)
    head = parser.feed(wire[: max(0, len(wire) - keep)])
    try:
        tail = parser.feed(wire[max(0, len(wire) - keep) :])
    except ProtocolError as err:  # pragma: no cover - would be a bug
        raise AssertionError(f"valid stream refused: {err}") from err
    same_in_order(head + tail, want)


def read_by_lines(text: str, version: str, max_headers: int) -> tuple[str, dict[str, str]]:
    """The header grammar read the plain way, line by line (the reference that
    headers.py's index-based reading must agree with, errors included)."""
    if "\0" in text:
        raise ProtocolError("NUL (octet 0) in the command or a header: not allowed by STOMP")
    text = text.replace("\r\n", "\n")
    text = text[:-1] if text.endswith("\r") else text
    command, *lines = text.split("\n")
    if not command:
        raise ProtocolError("empty command")
    if len(lines) > max_headers:
        raise ProtocolError(f"too many headers: more than {max_headers}")
    escapes = version != "1.0" and command not in CONNECT_COMMANDS
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon:
            shown = line if len(line) <= 40 else line[:40] + "..."
            raise ProtocolError(f"header line without colon: {shown!r}")
        if escapes:
            name, value = unescape_header(name, version), unescape_header(value, version)
        headers.setdefault(name, value)
    if "" in headers:
        raise ProtocolError("empty header name")
    return command, headers


def section_outcome(read, text: str, version: str) -> tuple[object, ...]:
    try:
        command, headers = read(text, version, 4)
    except ProtocolError as e:
        return ("error", str(e))
    return (command, list(headers.items()))


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(["SEND", "CONNECT", "a", "b", ":", "\n", "\r", "\r\n", "\\",
                                 "\\c", "\\n", "\\r", "\\\\", "\\x", "\0", "é"]), max_size=16),
       st.sampled_from(VERSIONS))
def test_a_header_section_reads_as_its_lines_do(pieces, version):
    """Lines found by index, escapes undone only where a backslash is: the same headers,
    and the same error, as reading the section line by line."""
    text = "".join(pieces)
    assert section_outcome(parse_header_block, text, version) == \
        section_outcome(read_by_lines, text, version)
