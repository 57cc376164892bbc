"""Helpers for stream tests (docs/streams.md) on a raw STOMP connection."""

from __future__ import annotations

from tests.integration.rawstomp import Frame, RawStomp, unique


def append(client: RawStomp, stream: str, bodies: list[str], **headers: str) -> None:
    """SEND each body to `/stream/NAME`, waiting for the last one's RECEIPT."""
    for i, body in enumerate(bodies):
        h = {"destination": stream, **headers}
        if i == len(bodies) - 1:
            client.request("SEND", h, body)
        else:
            client.send_frame("SEND", h, body)


def subscribe(client: RawStomp, stream: str, offset: str | None = None,
              **headers: str) -> tuple[str, Frame]:
    """SUBSCRIBE with a receipt; returns (subscription id, the RECEIPT)."""
    sub_id = unique("sub")
    h = {"destination": stream, "id": sub_id, **headers}
    if offset is not None:
        h["x-stream-offset"] = offset
    return sub_id, client.request("SUBSCRIBE", h)


def read(client: RawStomp, n: int, timeout: float = 5.0) -> list[Frame]:
    """The next n MESSAGE frames."""
    return [client.read_message(timeout) for _ in range(n)]


def offsets(frames: list[Frame]) -> list[int]:
    return [int(f.headers["x-stream-offset"]) for f in frames]


def bodies(frames: list[Frame]) -> list[str]:
    return [f.text for f in frames]


def info(receipt: Frame) -> tuple[int, int]:
    """(first, next) offset from a stream SUBSCRIBE's RECEIPT."""
    return (int(receipt.headers["x-stream-first-offset"]),
            int(receipt.headers["x-stream-next-offset"]))


def stream_info(client: RawStomp, stream: str) -> tuple[int, int]:
    """Ask without reading: SUBSCRIBE at next with a receipt, then UNSUBSCRIBE."""
    sub_id, receipt = subscribe(client, stream, "next")
    client.request("UNSUBSCRIBE", {"id": sub_id})
    return info(receipt)
