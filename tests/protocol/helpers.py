"""Shared helpers for the protocol tests: whole-stream and chunked feeding."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from pairmq.protocol import Frame, FrameParser, ProtocolError


def parse_all(data: bytes, **options) -> list[Frame]:
    """Parse `data` in one feed; the stream must end on a frame boundary."""
    return FrameParser(**options).feed(data)


def feed_chunks(chunks: Iterable[bytes], parser: FrameParser | None = None):
    """Feed every chunk; return (frames, error message or None, parser)."""
    parser = parser if parser is not None else FrameParser()
    frames: list[Frame] = []
    try:
        for chunk in chunks:
            frames.extend(parser.feed(chunk))
    except ProtocolError as err:
        frames.extend(err.frames)
        return frames, str(err), parser
    return frames, None, parser


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """Cut `data` at the given offsets (any order, duplicates allowed)."""
    points = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in pairwise(points)]


def to_crlf(wire: bytes) -> bytes:
    """Turn the LF line ends of one serialized frame's header section into CRLF."""
    cut = wire.index(b"\n\n") + 2
    return wire[:cut].replace(b"\n", b"\r\n") + wire[cut:]
