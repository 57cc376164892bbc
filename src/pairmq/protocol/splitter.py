"""Outgoing bytes cut at frame boundaries: one STOMP frame per WebSocket message.

A connection writes whatever it has at once (several MESSAGEs, a RECEIPT, a heart-beat);
over WebSocket each frame goes in a message of its own, as RabbitMQ's Web STOMP sends
them and as browser clients expect. Sans-IO, like the parser: bytes in, pieces out.

Where a frame ends:

- a bare EOL (LF or CRLF) where a frame would begin is a heart-beat: a piece of its own;
- a frame whose header section holds `content-length` ends after that many bytes of body
  and the NUL after them (the body may hold NULs); the first such header counts, as
  STOMP 1.2 says of repeated headers;
- any other frame ends at the first NUL after its header section.

What does not end yet (a frame written in parts) stays buffered until the rest comes.
"""

from __future__ import annotations

from typing import Final

_HEADER: Final = b"\ncontent-length:"


def frame_end(data: bytes, start: int) -> int:
    """Where the frame (or heart-beat) beginning at `start` ends (the offset just past its
    NUL), or -1 when `data` does not hold all of it."""
    size = len(data)
    first = data[start]
    if first == 0x0A:  # LF
        return start + 1
    if first == 0x0D:  # CR: a CRLF heart-beat, or a frame's CR?
        if start + 1 >= size:
            return -1
        if data[start + 1] == 0x0A:
            return start + 2
    lf_lf = data.find(b"\n\n", start)
    lf_crlf = data.find(b"\n\r\n", start, lf_lf + 2 if lf_lf >= 0 else size)  # the first
    if lf_crlf >= 0:
        head_end, body = lf_crlf, lf_crlf + 3
    elif lf_lf >= 0:
        head_end, body = lf_lf, lf_lf + 2
    else:
        return -1  # the header section is not complete yet
    at = data.find(_HEADER, start, head_end + 1)
    if at >= 0:
        value_at = at + len(_HEADER)
        line_end = data.find(b"\n", value_at, head_end + 1)
        value = data[value_at:line_end].rstrip(b"\r")
        if value.isdigit():
            end = body + int(value)
            if end >= size:
                return -1
            if data[end] == 0:
                return end + 1
            # not a NUL where it should be: the frame is malformed; its first NUL ends it
    nul = data.find(b"\0", body)
    return -1 if nul < 0 else nul + 1


class FrameSplitter:
    """Feed it what a connection writes; it returns each frame and heart-beat apart."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    @property
    def buffered(self) -> int:
        """Bytes of a frame written in part, held until its end is written."""
        return len(self._rest)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Every frame and heart-beat that `data` (after what was held) completes."""
        buf = self._rest + bytes(data) if self._rest else bytes(data)
        pieces: list[bytes] = []
        start = 0
        size = len(buf)
        while start < size:
            end = frame_end(buf, start)
            if end < 0:
                break
            pieces.append(buf if start == 0 and end == size else buf[start:end])
            start = end
        self._rest = buf[start:] if start < size else b""
        return pieces


def split_frames(data: bytes) -> list[bytes]:
    """The frames and heart-beats of `data`, which must end at a frame's end."""
    splitter = FrameSplitter()
    pieces = splitter.feed(data)
    if splitter.buffered:
        raise ValueError(f"{splitter.buffered} bytes at the end are not a whole frame")
    return pieces
