"""Limits: enforced on complete frames and, just as much, on frames that never finish."""

from __future__ import annotations

import pytest

from pairmq.protocol import Frame, FrameParser, ProtocolError

TOO_LARGE = "frame too large: more than 1000 bytes"
LINE_TOO_LONG = "header line too long: more than 100 bytes"
TOO_MANY = "too many headers: more than 5"


def small_parser(**options) -> FrameParser:
    limits = {"max_frame_bytes": 1000, "max_header_bytes": 100, "max_headers": 5}
    return FrameParser(**{**limits, **options})


def raises(parser: FrameParser, data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parser.feed(data)
    assert str(info.value) == message


def stream_until_error(parser: FrameParser, head: bytes, filler: bytes, chunk: int) -> int:
    """Feed `head`, then `filler` in chunks of `chunk` bytes; return the bytes fed at error."""
    fed = len(head)
    parser.feed(head)
    piece = filler * (chunk // len(filler))
    for _ in range(100_000):
        try:
            parser.feed(piece)
        except ProtocolError:
            return fed + len(piece)
        fed += len(piece)
    raise AssertionError("no error after 100000 chunks")


def test_default_limits_in_messages():
    raises(FrameParser(), b"SEND\ncontent-length:16777217\n\n",
           "frame too large: more than 16777216 bytes")
    raises(FrameParser(), b"SEND\nx:" + b"a" * 10240 + b"\n\n\x00",
           "header line too long: more than 10240 bytes")
    raises(FrameParser(), b"SEND\n" + b"h:v\n" * 1001 + b"\n\x00",
           "too many headers: more than 1000")


# -- frame size --------------------------------------------------------------------------


def frame_of_size(size: int, content_length: bool) -> bytes:
    """A frame whose size (headers, blank line and body, no NUL) is exactly `size`."""
    head = b"SEND\ncontent-length:%04d\n\n" if content_length else b"SEND\n\n"
    body_size = size - len(head % 0 if content_length else head)  # %04d is 4 digits wide
    if content_length:
        head = head % body_size
    return head + b"b" * body_size + b"\x00"


@pytest.mark.parametrize("content_length", [False, True])
def test_a_frame_of_exactly_the_limit_is_accepted(content_length):
    [frame] = small_parser().feed(frame_of_size(1000, content_length))
    assert len(frame.body) > 900


@pytest.mark.parametrize("content_length", [False, True])
def test_a_frame_one_byte_over_the_limit_is_refused(content_length):
    raises(small_parser(), frame_of_size(1001, content_length), TOO_LARGE)


def test_content_length_above_the_limit_raises_before_the_body_arrives():
    raises(small_parser(), b"SEND\ncontent-length:1001\n\n", TOO_LARGE)
    raises(small_parser(), b"SEND\ncontent-length:" + b"9" * 50 + b"\n\n", TOO_LARGE)
    raises(FrameParser(), b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n",
           "frame too large: more than 16777216 bytes")


def test_header_section_alone_over_the_limit():
    parser = small_parser(max_header_bytes=5000, max_headers=1000)
    raises(parser, b"SEND\nx:" + b"a" * 1000 + b"\n\n\x00", TOO_LARGE)


def test_body_streamed_without_nul_is_stopped_at_the_limit():
    parser = small_parser()
    fed = stream_until_error(parser, b"SEND\n\n", b"x", 64)
    assert 1000 < fed <= 1000 + 64


def test_gigabyte_body_without_nul_is_stopped_after_the_default_limit():
    # 1 GiB in 64 KiB reads; the parser must give up at 16 MiB, not buffer it all.
    chunk = 64 * 1024
    fed = stream_until_error(FrameParser(), b"SEND\ndestination:/queue/a\n\n", b"\x01" * 1024,
                             chunk)
    assert 16 * 1024 * 1024 < fed <= 16 * 1024 * 1024 + chunk


def test_one_huge_feed_without_nul():
    raises(small_parser(), b"SEND\n\n" + b"x" * 100_000, TOO_LARGE)


def test_limit_counts_the_frame_not_the_heart_beats_before_it():
    wire = b"\n" * 5000 + frame_of_size(1000, False)
    assert len(small_parser().feed(wire)) == 1


def test_limit_applies_per_frame():
    wire = frame_of_size(1000, True) * 50
    assert len(small_parser().feed(wire)) == 50


def test_large_content_length_body_in_small_pieces():
    body = bytes(range(256)) * 4096  # 1 MiB
    parser = FrameParser()
    frames = parser.feed(b"SEND\ncontent-length:%d\n\n" % len(body))
    for i in range(0, len(body), 1000):
        frames += parser.feed(body[i : i + 1000])
    frames += parser.feed(b"\x00")
    assert frames == [Frame("SEND", {"content-length": str(len(body))}, body)]


def test_large_nul_terminated_body_in_small_pieces():
    body = b"y" * (1 << 20)
    parser = FrameParser()
    frames = parser.feed(b"SEND\n\n")
    for i in range(0, len(body), 1000):
        frames += parser.feed(body[i : i + 1000])
    frames += parser.feed(b"\x00")
    assert frames == [Frame("SEND", {}, body)]


# -- header lines ---------------------------------------------------------------------------


def test_header_line_of_exactly_the_limit_is_accepted():
    line = b"k:" + b"v" * 98
    assert small_parser().feed(b"SEND\n" + line + b"\r\n\r\n\x00")[0].headers == {"k": "v" * 98}


def test_header_line_one_byte_over_the_limit():
    raises(small_parser(), b"SEND\nk:" + b"v" * 99 + b"\n\n\x00", LINE_TOO_LONG)


def test_command_line_counts_as_a_line():
    raises(small_parser(), b"S" * 101 + b"\n\n\x00", LINE_TOO_LONG)


def test_header_line_that_never_ends():
    parser = small_parser(max_frame_bytes=10**9)
    fed = stream_until_error(parser, b"SEND\nk:", b"v", 16)
    assert fed <= 5 + 2 + 101 + 16


def test_long_line_followed_by_more_lines_in_the_same_feed():
    # The long line is complete but the section is not: it must still be caught now.
    raises(small_parser(max_frame_bytes=10**9),
           b"SEND\nk:" + b"v" * 200 + b"\na:b\nc:", LINE_TOO_LONG)


def test_a_cr_before_lf_does_not_count_towards_a_line():
    parser = small_parser()
    line = b"k:" + b"v" * 98
    assert parser.feed(b"SEND\n" + line + b"\r") == []
    assert parser.feed(b"\n\n\x00")[0].headers == {"k": "v" * 98}


# -- header count ---------------------------------------------------------------------------


def test_header_count_at_the_limit_is_accepted():
    wire = b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(5)) + b"\n\x00"
    assert len(small_parser().feed(wire)[0].headers) == 5


def test_repeated_headers_count_too():
    raises(small_parser(), b"SEND\n" + b"h:v\n" * 6 + b"\n\x00", TOO_MANY)


def test_header_section_that_never_ends():
    parser = small_parser(max_frame_bytes=10**9)
    fed = stream_until_error(parser, b"SEND\n", b"h:v\n", 8)
    assert fed <= 5 + 4 * 6 + 8


def test_header_section_that_never_ends_within_the_frame_limit():
    parser = small_parser(max_headers=10**6)
    fed = stream_until_error(parser, b"SEND\n", b"h:v\n", 64)
    assert 1000 <= fed <= 1000 + 64


@pytest.mark.parametrize("data", [
    b"SEND\nreceipt:r-7\ncontent-length:1001\n\n",  # known before the body comes
    b"SEND\nreceipt:r-7\ncontent-length:" + b"9" * 50 + b"\n\n",
    b"SEND\nreceipt:r-7\n\n" + b"b" * 1000,  # no content-length: found while reading
    b"SEND\nreceipt:r-7\ncontent-length:2\n\nabc\x00",  # no NUL where it says
])
def test_a_refused_frame_whose_headers_were_read_names_its_receipt(data):
    """So the server's ERROR carries its receipt-id, and a client knows which of its frames
    was refused (and does not send it again after reconnecting)."""
    with pytest.raises(ProtocolError) as info:
        small_parser().feed(data)
    assert info.value.receipt == "r-7"


def test_a_frame_refused_before_its_headers_were_read_names_no_receipt():
    with pytest.raises(ProtocolError) as info:
        small_parser().feed(b"SEND\nreceipt:r-7\n" + b"x:" + b"y" * 200 + b"\n\n")
    assert info.value.receipt is None
