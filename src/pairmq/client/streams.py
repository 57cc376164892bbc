"""What the client knows of streams (`/stream/NAME`): how to ask a server for a stream's
offsets, and how to read its answer. Pure: the blocking and asyncio clients do the I/O.

A stream's offsets come in the RECEIPT of a SUBSCRIBE to it (`x-stream-first-offset`,
`x-stream-next-offset`); asking is a SUBSCRIBE with a receipt followed by an UNSUBSCRIBE.
"""

from __future__ import annotations

from pairmq.client.errors import ClientError
from pairmq.protocol.batch import Record, decode_records

STREAM_PREFIX = "/stream/"


def batch_records(body: bytes) -> list[Record]:
    """The records of a batched stream MESSAGE (`x-stream-batch`, docs/streams.md): each
    (offset, timestamp ms, message-id, headers, body), in offset order. Records with the
    same headers share one dict: do not change it."""
    return decode_records(body)


def stream_destination(stream: str) -> str:
    """`orders` or `/stream/orders` -> `/stream/orders`."""
    name = stream[len(STREAM_PREFIX):] if stream.startswith(STREAM_PREFIX) else stream
    if not name or "/" in name:
        raise ClientError(f"not a stream name: {stream!r} (expected NAME or /stream/NAME)")
    return STREAM_PREFIX + name


def info_headers(must_exist: bool) -> dict[str, str]:
    """The SUBSCRIBE headers of a question about a stream: start at its end (so nothing
    is delivered meanwhile), and refuse instead of creating it when `must_exist`."""
    headers = {"x-stream-offset": "next", "prefetch-count": "1"}
    if must_exist:
        headers["x-stream-must-exist"] = "true"
    return headers


def offsets_from_receipt(destination: str, headers: dict[str, str]) -> tuple[int, int]:
    """(first offset still stored, next offset to be appended) from a SUBSCRIBE's RECEIPT."""
    try:
        return int(headers["x-stream-first-offset"]), int(headers["x-stream-next-offset"])
    except (KeyError, ValueError):
        raise ClientError(f"the server did not report the offsets of {destination} "
                          f"(RECEIPT headers: {headers}); does it serve streams?") from None
