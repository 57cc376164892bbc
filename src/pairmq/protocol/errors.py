"""The single error type of the protocol layer, so callers need one `except` clause."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .frame import Frame


class ProtocolError(Exception):
    """Raised for any malformed input.

    `str(e)` is a short human message naming the problem (e.g. 'frame too large: more than
    16777216 bytes'), fit for the `message` header of an ERROR frame.

    `frames` holds the well-formed frames that the failing `FrameParser.feed` call completed
    before it met the bad input, so a server can act on them exactly as it would have had
    the bytes arrived in separate reads. It is empty everywhere else.

    `receipt` is the `receipt` header of the frame refused, when its headers could be read
    (a frame too large, a bad content-length): the ERROR names it, so that a client knows
    which of its frames was refused and does not send it again.
    """

    def __init__(self, message: str, frames: list[Frame] | None = None,
                 receipt: str | None = None) -> None:
        super().__init__(message)
        self.frames: list[Frame] = frames if frames is not None else []
        self.receipt = receipt
