"""Cutting what a connection writes into one piece per frame (protocol/splitter.py), the
WebSocket listener's one STOMP frame per message."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pairmq.protocol import Frame, FrameParser, serialize
from pairmq.protocol.splitter import FrameSplitter, frame_end, split_frames
from tests.protocol.helpers import split_at, to_crlf

pytestmark = pytest.mark.timeout(60)

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_frames_and_heartbeats_come_apart() -> None:
    receipt = b"RECEIPT\nreceipt-id:r1\n\n\0"
    message = serialize(Frame("MESSAGE", {"destination": "/queue/a", "message-id": "1",
                                          "subscription": "s"}, b"hello"))
    assert split_frames(receipt + b"\n" + message + b"\r\n" + receipt) == \
        [receipt, b"\n", message, b"\r\n", receipt]


def test_a_body_holding_nuls_ends_after_its_content_length() -> None:
    body = b"\0a\0\0b\0"
    frame = b"MESSAGE\ndestination:/queue/a\ncontent-length:6\n\n" + body + b"\0"
    after = b"RECEIPT\nreceipt-id:2\n\n\0"
    assert split_frames(frame + after) == [frame, after]
    assert FrameParser().feed(split_frames(frame + after)[0])[0].body == body


def test_without_content_length_the_first_nul_ends_the_frame() -> None:
    data = b"ERROR\nmessage:x\n\nbody\0MESSAGE\n\n\0"
    assert split_frames(data) == [b"ERROR\nmessage:x\n\nbody\0", b"MESSAGE\n\n\0"]


def test_the_first_content_length_counts() -> None:
    frame = b"MESSAGE\ncontent-length:3\ncontent-length:1\n\na\0b\0"
    assert split_frames(frame) == [frame]


def test_a_content_length_in_the_body_is_not_a_header() -> None:
    frame = b"SEND\ndestination:/q\n\nx\ncontent-length:9\n\0"
    assert split_frames(frame + frame) == [frame, frame]


def test_crlf_header_section() -> None:
    frame = b"MESSAGE\r\ncontent-length:2\r\nx:y\r\n\r\n\0\0\0"
    assert split_frames(frame + b"\r\n") == [frame, b"\r\n"]


def test_a_frame_written_in_parts_waits_for_its_end() -> None:
    frame = serialize(Frame("MESSAGE", {"destination": "/queue/a"}, b"\0" * 10))
    splitter = FrameSplitter()
    out: list[bytes] = []
    for i in range(len(frame)):
        out += splitter.feed(frame[i:i + 1])
        assert splitter.buffered == (i + 1) % len(frame)
    assert out == [frame]
    assert splitter.feed(b"\r") == [] and splitter.feed(b"\n") == [b"\r\n"]


def test_incomplete_ends() -> None:
    assert frame_end(b"MESSAGE\ncontent-length:4\n\nab", 0) == -1
    assert frame_end(b"MESSAGE\ncontent-length:4\n\nabcd", 0) == -1  # its NUL not yet
    assert frame_end(b"MESSAGE\nx:y\n", 0) == -1
    assert frame_end(b"\r", 0) == -1
    with pytest.raises(ValueError, match="not a whole frame"):
        split_frames(b"RECEIPT\n\n")


# ------------------------------------------------------------ round trips

names = st.text(alphabet="abcdefghij-:\\\r\n é", min_size=1, max_size=8)
values = st.text(alphabet=st.one_of(st.sampled_from(":\\\r\n é\0"),
                                    st.characters(codec="utf-8", exclude_characters="\0")),
                 max_size=10)


@st.composite
def pieces(draw) -> bytes:
    """A frame as the server serializes one (escaped headers, any body), or a heart-beat."""
    kind = draw(st.sampled_from(["frame", "frame", "frame", "lf", "crlf"]))
    if kind == "lf":
        return b"\n"
    if kind == "crlf":
        return b"\r\n"
    command = draw(st.sampled_from(["MESSAGE", "RECEIPT", "ERROR", "CONNECTED"]))
    headers = draw(st.dictionaries(names.filter(lambda n: n != "content-length"), values,
                                   max_size=5))
    if command == "CONNECTED":  # never escaped: the serializer flattens CR and LF
        headers = {k: v for k, v in headers.items() if ":" not in k and "\0" not in v}
    else:
        headers = {k: v for k, v in headers.items() if "\0" not in v}
    body = draw(st.binary(max_size=30))
    version = draw(st.sampled_from(["1.1", "1.2"]))
    if not draw(st.booleans()) and b"\0" not in body:
        # no content-length at all: a frame whose body ends at its NUL
        head = serialize(Frame(command, headers), version)[:-1]
        wire = head + body + b"\0"
    else:
        wire = serialize(Frame(command, headers, body), version)
    if draw(st.booleans()) and version == "1.2":
        wire = to_crlf(wire)
    return wire


@FAST
@given(st.lists(pieces(), min_size=1, max_size=8), st.lists(st.integers(0, 600), max_size=6))
def test_round_trip_through_any_cuts(written: list[bytes], cuts: list[int]) -> None:
    data = b"".join(written)
    assert split_frames(data) == written
    splitter = FrameSplitter()
    out: list[bytes] = []
    for chunk in split_at(data, cuts):
        out += splitter.feed(chunk)
    assert out == written and splitter.buffered == 0


@FAST
@given(st.lists(pieces(), min_size=1, max_size=6))
def test_each_piece_parses_as_one_frame_or_a_heartbeat(written: list[bytes]) -> None:
    for piece in split_frames(b"".join(written)):
        parser = FrameParser()
        frames = parser.feed(piece)
        if piece in (b"\n", b"\r\n"):
            assert frames == [] and parser.heartbeats == 1
        else:
            assert len(frames) == 1 and parser.buffered == 0
