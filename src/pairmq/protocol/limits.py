"""What a message may hold so that its MESSAGE frames stay within the limits every peer of
the server applies, its own and pairmq's client's (issue 20): a SEND, or a record of a
batched SEND, that passes the parser's limits can still become a MESSAGE that does not,
once the server adds its own headers (message-id, destination, subscription, ack,
delivery-count, timestamp...). Such a message would be refused by its consumer's parser,
redelivered until it went to the dead-letter queue, and could take an innocent message
behind it along. So it is refused when it is sent, with an ERROR naming the limit.

A batched SEND's records skip the frame parser entirely, so their header lines and NULs
are checked here too. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from .errors import ProtocolError

# Headers a MESSAGE carries besides the message's own, at most: message-id, destination,
# subscription, ack, delivery-count, redelivered and content-length on every delivery, and
# the timestamp, persistent and x-stream-offset the server may store with a message ...
HEADERS_ADDED: Final = 10
# ... and the bytes they take, at most
BYTES_ADDED: Final = 1024


@dataclass(frozen=True)
class MessageLimits:
    """The server's frame limits ([limits]), as they bound one message."""

    max_frame_bytes: int
    max_headers: int
    max_header_bytes: int
    # Headers a message may keep: what the server adds must still fit (set from the above:
    # every SEND reads it).
    most_headers: int = field(init=False)
    # A message with at most `most_headers` headers and a body of at most this many bytes
    # fits whatever its header lines hold (each is within max_header_bytes already): the
    # server skips `check` for it (most SENDs).
    body_fits: int = field(init=False)

    def __post_init__(self) -> None:
        most_headers = max(0, self.max_headers - HEADERS_ADDED)
        object.__setattr__(self, "most_headers", most_headers)
        object.__setattr__(self, "body_fits", self.max_frame_bytes - BYTES_ADDED
                           - most_headers * (self.max_header_bytes + 2))

    def check(self, headers: Mapping[str, str], body_bytes: int,
              also: Mapping[str, str] | None = None, what: str = "a message",
              not_kept: frozenset[str] = frozenset()) -> None:
        """ProtocolError unless a message with these `headers` (and the frame's `also`, for
        a batch record) and a body of `body_bytes` can be delivered within the limits.
        `not_kept`: the frame's own headers that the message does not keep (receipt,
        transaction...). Header lines are taken to be within max_header_bytes already."""
        count = len(headers) + (len(also) if also else 0)
        if count > self.most_headers:  # count exactly only when it matters
            count = sum(1 for name in headers if name not in not_kept)
            if also:
                count += sum(1 for name in also if name not in not_kept and name not in headers)
            if count > self.most_headers:
                raise ProtocolError(
                    f"too many headers in {what}: {count} kept with it, at most "
                    f"{self.most_headers} (max_headers {self.max_headers} less the "
                    f"{HEADERS_ADDED} the server may add when it delivers it)")
        most = self.max_frame_bytes - BYTES_ADDED
        if body_bytes + count * (self.max_header_bytes + 2) <= most:
            return  # its headers cannot make it too large (the usual case: no sums)
        size = body_bytes + sum(map(len, headers)) + sum(map(len, headers.values())) \
            + 2 * len(headers)
        if also:
            size += sum(map(len, also)) + sum(map(len, also.values())) + 2 * len(also)
        if size > most:
            raise ProtocolError(
                f"{what} too large: {size} bytes, at most {most} (max_frame_bytes "
                f"{self.max_frame_bytes} less the {BYTES_ADDED} the server may add when it "
                "delivers it)")

    def check_batch(self, records: list[tuple[dict[str, str], bytes]],
                    frame_headers: Mapping[str, str],
                    not_kept: frozenset[str] = frozenset()) -> None:
        """`check` for every message of a batched SEND, and what the frame parser would
        have checked had each come alone: its header lines, and no NUL in them. Records
        that share a header block share its dict: its lines are checked once."""
        lines_checked: set[int] = set()
        for number, (headers, body) in enumerate(records, 1):
            what = f"message {number} of the batched SEND"
            if id(headers) not in lines_checked:
                lines_checked.add(id(headers))
                for name, value in headers.items():
                    if len(name) + len(value) + 1 > self.max_header_bytes:
                        raise ProtocolError(f"header line too long in {what}: more than "
                                            f"{self.max_header_bytes} bytes ({name[:40]!r})")
                    if "\0" in name or "\0" in value:
                        raise ProtocolError(f"NUL (octet 0) in a header of {what}: not "
                                            "allowed by STOMP")
            self.check(headers, len(body), frame_headers, what, not_kept)
