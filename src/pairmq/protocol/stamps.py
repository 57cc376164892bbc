"""Producer stamps, a pairmq STOMP extension (docs/stomp.md, "Producer sequences"): the
headers a producer numbers its messages to a destination with, read and written the same
way by the server (core/producers.py) and the client (client/sequences.py).

    pairmq-producer: ID          the producer (1 to 256 characters)
    pairmq-producer-epoch: E     its epoch for this destination (absent: 0)
    pairmq-seq: N                the message's number (a batched SEND: its first one's)
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Final, NamedTuple

from .errors import ProtocolError

PRODUCER_HEADER: Final = "pairmq-producer"
EPOCH_HEADER: Final = "pairmq-producer-epoch"
SEQ_HEADER: Final = "pairmq-seq"
STAMP_HEADERS: Final = frozenset({PRODUCER_HEADER, EPOCH_HEADER, SEQ_HEADER})
MAX_PRODUCER_ID: Final = 256  # characters
MAX_NUMBER: Final = (1 << 63) - 1


class Stamp(NamedTuple):
    producer: str
    epoch: int
    seq: int  # of the (first) message


def parse_stamp(headers: Mapping[str, str]) -> Stamp | None:
    """The stamp in a SEND's headers (None: it has none); ProtocolError naming the header
    when one is malformed or missing."""
    producer = headers.get(PRODUCER_HEADER)
    if producer is None:
        if SEQ_HEADER in headers or EPOCH_HEADER in headers:
            raise ProtocolError(f"{SEQ_HEADER} and {EPOCH_HEADER} need a {PRODUCER_HEADER} "
                                "header naming the producer")
        return None
    if not producer or len(producer) > MAX_PRODUCER_ID:
        raise ProtocolError(f"{PRODUCER_HEADER} must be 1 to {MAX_PRODUCER_ID} characters, "
                            f"got {len(producer)}")
    seq = headers.get(SEQ_HEADER)
    if seq is None:
        raise ProtocolError(f"{PRODUCER_HEADER} needs a {SEQ_HEADER} header: the message's "
                            "sequence number")
    return Stamp(producer, _number(EPOCH_HEADER, headers.get(EPOCH_HEADER, "0")),
                 _number(SEQ_HEADER, seq))


def write_stamp(headers: MutableMapping[str, str], stamp: Stamp) -> None:
    headers[PRODUCER_HEADER] = stamp.producer
    headers[SEQ_HEADER] = str(stamp.seq)
    if stamp.epoch:
        headers[EPOCH_HEADER] = str(stamp.epoch)
    else:
        headers.pop(EPOCH_HEADER, None)


def _number(name: str, value: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 19) \
            or int(value) > MAX_NUMBER:
        raise ProtocolError(f"{name} must be a whole number from 0 to {MAX_NUMBER}, got "
                            f"{value[:40]!r}")
    return int(value)
