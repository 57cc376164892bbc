"""FrameParser: framing, line ends, heart-beats, headers, bodies and its error state."""

from __future__ import annotations

import pytest

from pairmq.protocol import Frame, FrameParser, ProtocolError, serialize
from pairmq.protocol.headers import parse_header_block
from tests.protocol.helpers import feed_chunks, parse_all, split_at


def test_one_frame():
    wire = b"SEND\ndestination:/queue/a\nreceipt:r1\n\nhello\x00"
    expected = Frame("SEND", {"destination": "/queue/a", "receipt": "r1"}, b"hello")
    assert parse_all(wire) == [expected]


def test_frame_without_headers_or_body():
    assert parse_all(b"DISCONNECT\n\n\x00") == [Frame("DISCONNECT")]


def test_body_is_bytes_even_from_a_bytearray_or_memoryview():
    wire = b"SEND\n\nabc\x00"
    for data in (bytearray(wire), memoryview(wire)):
        [frame] = FrameParser().feed(data)
        assert type(frame.body) is bytes and frame.body == b"abc"
    parser = FrameParser()
    assert parser.feed(b"SEND\n\nab") == []
    [frame] = parser.feed(b"c\x00")
    assert type(frame.body) is bytes and frame.body == b"abc"


def test_empty_feed_returns_nothing():
    parser = FrameParser()
    assert parser.feed(b"") == []
    assert parser.feed(b"SEND\n") == []
    assert parser.feed(b"") == []
    assert parser.feed(b"\n\x00") == [Frame("SEND")]


def test_several_frames_in_one_feed_and_a_partial_one():
    wire = b"SEND\n\na\x00SEND\n\nb\x00SEND\n\nc"
    parser = FrameParser()
    assert [f.body for f in parser.feed(wire)] == [b"a", b"b"]
    assert parser.feed(b"\x00") == [Frame("SEND", {}, b"c")]


def test_every_split_of_a_stream_parses_the_same():
    wire = (
        b"\n\r\nCONNECT\r\naccept-version:1.2\r\nhost:x\r\n\r\n\x00\n"
        b"SEND\ndestination:/queue/a\ncontent-length:3\n\na\x00b\x00\r\n"
        b"SEND\r\nx:a\\cb\n\r\nbody\x00"
        b"MESSAGE\ndestination:/queue/b\n\n\xff\xfe\x00"
    )
    expected, error, whole = feed_chunks([wire])
    assert error is None and len(expected) == 4
    for i in range(len(wire) + 1):
        for j in range(i, len(wire) + 1, 7):
            frames, error, parser = feed_chunks(split_at(wire, [i, j]))
            assert error is None
            assert frames == expected, (i, j)
            assert parser.heartbeats == whole.heartbeats == 4
    one_byte_at_a_time, error, _ = feed_chunks(split_at(wire, range(len(wire))))
    assert one_byte_at_a_time == expected


# -- bodies ------------------------------------------------------------------------------


def test_content_length_body_may_contain_nul():
    body = b"\x00a\x00\x00b\n\n\x00"
    wire = b"SEND\ncontent-length:%d\n\n%s\x00" % (len(body), body)
    [frame] = parse_all(wire)
    assert frame.body == body
    assert frame.headers["content-length"] == str(len(body))


def test_content_length_zero():
    assert parse_all(b"SEND\ncontent-length:0\n\n\x00") == [
        Frame("SEND", {"content-length": "0"}, b"")
    ]


def test_without_content_length_the_body_ends_at_the_first_nul():
    frames = parse_all(b"SEND\n\nab\x00cd\n\n\x00")
    assert frames[0].body == b"ab"
    # What follows the NUL is the next frame (an odd one, but well-formed).
    assert frames[1] == Frame("cd", {}, b"")


def test_missing_nul_after_content_length_body():
    with pytest.raises(ProtocolError, match="missing NUL after body of content-length 5"):
        parse_all(b"SEND\ncontent-length:5\n\nhelloX")


def test_content_length_body_waits_for_its_nul():
    parser = FrameParser()
    assert parser.feed(b"SEND\ncontent-length:5\n\nhello") == []
    assert parser.feed(b"\x00") == [Frame("SEND", {"content-length": "5"}, b"hello")]


def test_body_bytes_need_not_be_utf8():
    assert parse_all(b"SEND\n\n\xff\xc0\x80\x00")[0].body == b"\xff\xc0\x80"


@pytest.mark.parametrize("value", ["abc", "-1", "+5", " 5", "5 ", "", "5.0", "0x10", "\u0665"])
def test_invalid_content_length(value):
    wire = f"SEND\ncontent-length:{value}\n\nhello\x00".encode()
    with pytest.raises(ProtocolError, match="invalid content-length") as info:
        parse_all(wire)
    assert str(info.value) == f'invalid content-length: "{value}"'


def test_content_length_with_leading_zeros():
    [frame] = parse_all(b"SEND\ncontent-length:" + b"0" * 40 + b"3\n\nabc\x00")
    assert frame.body == b"abc"


def test_first_content_length_wins():
    [frame] = parse_all(b"SEND\ncontent-length:2\ncontent-length:5\n\nab\x00")
    assert frame.body == b"ab"


# -- line ends and heart-beats -------------------------------------------------------------


def test_crlf_frames():
    wire = b"SEND\r\ndestination:/queue/a\r\nx:y\r\n\r\nbody\x00"
    assert parse_all(wire) == [Frame("SEND", {"destination": "/queue/a", "x": "y"}, b"body")]


@pytest.mark.parametrize(
    "wire",
    [
        b"SEND\r\nx:y\r\n\nbody\x00",
        b"SEND\nx:y\n\r\nbody\x00",
        b"SEND\r\nx:y\n\nbody\x00",
        b"SEND\nx:y\r\n\r\nbody\x00",
    ],
)
def test_mixed_line_ends(wire):
    assert parse_all(wire) == [Frame("SEND", {"x": "y"}, b"body")]


def test_crlf_frame_after_lf_frame_with_blank_lines_in_the_body():
    # The LF frame's body holds "\n\n"; the CRLF frame after it must still end at its own
    # blank line, whichever kind the parser looks for first.
    wire = b"SEND\ncontent-length:2\n\n\n\n\x00SEND\r\nx:y\r\n\r\nz\n\n\x00"
    frames = parse_all(wire)
    assert frames[1] == Frame("SEND", {"x": "y"}, b"z\n\n")
    wire = b"SEND\r\n\r\n\x00SEND\nx:y\n\nq\n\r\n\x00"
    assert parse_all(wire)[1] == Frame("SEND", {"x": "y"}, b"q\n\r\n")


def test_only_a_cr_right_before_lf_is_dropped():
    parser = FrameParser(version="1.0")
    [frame] = parser.feed(b"SEND\na:x\ry\nb:z\r\r\n\n\x00")
    assert frame.headers == {"a": "x\ry", "b": "z\r"}


def test_heart_beats_between_frames_are_counted_and_skipped():
    parser = FrameParser()
    assert parser.feed(b"\n\n\r\n") == []
    assert parser.heartbeats == 3
    frames = parser.feed(b"SEND\n\na\x00\n\r\nSEND\n\nb\x00\n")
    assert [f.body for f in frames] == [b"a", b"b"]
    assert parser.heartbeats == 6


def test_heart_beat_crlf_split_between_feeds():
    parser = FrameParser()
    assert parser.feed(b"\r") == []
    assert parser.heartbeats == 0
    assert parser.feed(b"\n") == []
    assert parser.heartbeats == 1
    assert parser.feed(b"SEND\n\n\x00\r") == [Frame("SEND")]
    assert parser.feed(b"\nSEND\n\n\x00") == [Frame("SEND")]
    assert parser.heartbeats == 2


# -- headers ------------------------------------------------------------------------------


def test_repeated_header_first_wins_and_order_is_kept():
    [frame] = parse_all(b"MESSAGE\nb:1\na:2\nb:3\nc:4\na:5\n\n\x00")
    assert frame.headers == {"b": "1", "a": "2", "c": "4"}
    assert list(frame.headers) == ["b", "a", "c"]


def test_repeated_header_first_wins_on_the_unescaping_path():
    [frame] = parse_all(b"MESSAGE\nb:1\\c\na:2\nb:3\n\n\x00")
    assert frame.headers == {"b": "1:", "a": "2"}


def test_header_splits_at_the_first_colon_and_keeps_whitespace():
    [frame] = parse_all(b"SEND\nurl:http://x:80/ \n key : v \nempty:\n\n\x00")
    assert frame.headers == {"url": "http://x:80/ ", " key ": " v ", "empty": ""}


def test_header_line_without_colon():
    with pytest.raises(ProtocolError, match="header line without colon: 'oops'"):
        parse_all(b"SEND\na:b\noops\n\n\x00")


def test_header_line_without_colon_on_the_unescaping_path():
    with pytest.raises(ProtocolError, match="header line without colon"):
        parse_all(b"SEND\na:b\\\\\noops\n\n\x00")


def test_empty_header_name_is_refused():
    with pytest.raises(ProtocolError, match="empty header name"):
        parse_all(b"SEND\n:value\n\n\x00")


def test_headers_must_be_utf8():
    with pytest.raises(ProtocolError, match="headers are not valid UTF-8"):
        parse_all(b"SEND\nname:\xff\xfe\n\n\x00")
    with pytest.raises(ProtocolError, match="headers are not valid UTF-8"):
        parse_all(b"SEND\xc0\n\n\x00")


def test_utf8_headers():
    [frame] = parse_all("SEND\nnäme:välue ✓\n\n\x00".encode())
    assert frame.headers == {"näme": "välue ✓"}


def test_empty_command():
    # Unreachable through the parser (a line that is only an EOL is a heart-beat), but the
    # header-section parser refuses it on its own.
    with pytest.raises(ProtocolError, match="empty command"):
        parse_header_block("\nx:y", "1.2", 1000)


def test_a_command_made_of_a_cr_is_kept_for_the_server_to_refuse():
    assert parse_all(b"\r\r\n\n\x00") == [Frame("\r")]


# -- escaping -------------------------------------------------------------------------------

ESCAPED = b"SEND\nk\\c\\\\:a\\cb\\nc\\\\d\\re\n\n\x00"


def test_unescaping_in_1_2():
    [frame] = parse_all(ESCAPED, version="1.2")
    assert frame.headers == {"k:\\": "a:b\nc\\d\re"}


def test_1_1_has_no_cr_escape():
    with pytest.raises(ProtocolError, match=r"undefined escape sequence \\r in header"):
        parse_all(ESCAPED, version="1.1")
    [frame] = parse_all(b"SEND\nk:a\\cb\\nc\\\\d\n\n\x00", version="1.1")
    assert frame.headers == {"k": "a:b\nc\\d"}


def test_1_0_has_no_escapes():
    [frame] = parse_all(ESCAPED, version="1.0")
    assert frame.headers == {"k\\c\\\\": "a\\cb\\nc\\\\d\\re"}


@pytest.mark.parametrize("bad", [b"\\t", b"\\x", b"\\C", b"\\"])
def test_undefined_escape(bad):
    with pytest.raises(ProtocolError, match="escape sequence"):
        parse_all(b"SEND\nk:a" + bad + b"\n\n\x00")


def test_undefined_escape_message():
    with pytest.raises(ProtocolError) as info:
        parse_all(b"SEND\nk:a\\tb\n\n\x00")
    assert str(info.value) == "undefined escape sequence \\t in header"


@pytest.mark.parametrize("command", ["CONNECT", "CONNECTED", "STOMP"])
def test_connect_frames_are_never_unescaped(command):
    wire = f"{command}\naccept-version:1.2\nlogin:dom\\tuser\npasscode:a\\cb\n\n\x00".encode()
    [frame] = parse_all(wire, version="1.2")
    assert frame.headers["login"] == "dom\\tuser"
    assert frame.headers["passcode"] == "a\\cb"


def test_version_set_between_frames_governs_later_frames():
    parser = FrameParser()
    assert parser.feed(b"SEND\nk:a\\\\b\n\n\x00")[0].headers == {"k": "a\\b"}
    parser.version = "1.0"
    assert parser.feed(b"SEND\nk:a\\\\b\n\n\x00")[0].headers == {"k": "a\\\\b"}


def test_connect_sets_the_negotiated_version_for_frames_pipelined_behind_it():
    wire = b"CONNECT\nhost:x\n\n\x00SEND\npath:C:\\temp\n\n\x00"
    parser = FrameParser()
    _connect, send = parser.feed(wire)
    assert parser.version == "1.0"
    assert send.headers == {"path": "C:\\temp"}
    parser = FrameParser(version="1.0")
    parser.feed(b"STOMP\naccept-version:1.1,1.2\n\n\x00")
    assert parser.version == "1.2"
    parser.feed(b"CONNECT\naccept-version:9.9\n\n\x00")
    assert parser.version == "1.2"  # no common version: the server refuses; nothing changes


def test_unsupported_version_is_refused():
    with pytest.raises(ValueError):
        FrameParser(version="2.0")
    parser = FrameParser()
    with pytest.raises(ValueError):
        parser.version = "1.3"


# -- after an error ---------------------------------------------------------------------


def test_a_dead_parser_keeps_raising_the_same_error():
    parser = FrameParser()
    with pytest.raises(ProtocolError) as first:
        parser.feed(b"SEND\nbad\n\n\x00")
    for data in (b"SEND\n\n\x00", b"", b"x"):
        with pytest.raises(ProtocolError) as again:
            parser.feed(data)
        assert str(again.value) == str(first.value)
        assert again.value.frames == []


def test_the_error_carries_the_frames_completed_before_it():
    parser = FrameParser()
    with pytest.raises(ProtocolError) as info:
        parser.feed(b"SEND\n\na\x00SEND\n\nb\x00SEND\nbad\n\n\x00SEND\n\nc\x00")
    assert [f.body for f in info.value.frames] == [b"a", b"b"]


def test_round_trip_of_the_serializer_output():
    frame = Frame("SEND", {"destination": "/queue/a", "x": "a:b\nc\\d\re"}, b"\x00bin\x00")
    [parsed] = parse_all(serialize(frame))
    assert parsed.headers == {**frame.headers, "content-length": "5"}
    assert parsed.body == frame.body


@pytest.mark.parametrize("wire", [
    b"SEND\ndestination:/queue/a\nx:innocent\x00MESSAGE\nsubscription:1\n\nforged\x00",
    b"SEND\nna\x00me:v\n\nbody\x00",
    b"SE\x00ND\n\nbody\x00",
])
def test_a_nul_in_the_command_or_a_header_is_refused(wire: bytes) -> None:
    with pytest.raises(ProtocolError, match=r"NUL \(octet 0\)"):
        FrameParser().feed(wire)


def test_the_frame_limit_can_be_raised_after_login() -> None:
    parser = FrameParser(max_frame_bytes=64)
    with pytest.raises(ProtocolError, match="frame too large: more than 64 bytes"):
        FrameParser(max_frame_bytes=64).feed(b"SEND\n\n" + b"x" * 100 + b"\x00")
    assert parser.feed(b"CONNECT\n\n\x00SEND\n\n" + b"x" * 20) == [Frame("CONNECT")]
    assert parser.buffered == 26  # the unfinished SEND
    parser.max_frame_bytes = 1024
    [frame] = parser.feed(b"x" * 80 + b"\x00")
    assert frame.body == b"x" * 100 and parser.buffered == 0
