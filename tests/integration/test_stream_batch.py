"""Batched stream reads (`x-stream-batch`, docs/streams.md) against a real server: a
range in frames of K records whose decoded records equal the plain MESSAGEs of the same
offsets (bodies read back from the journal, before and after a kill -9), credit counted in
records, and the ERROR a bad value gets."""

from __future__ import annotations

import pytest

from pairmq.protocol.batch import decode_records
from tests.integration.rawstomp import Frame, RawStomp
from tests.support.servers import restart
from tests.support.streams import read, subscribe

NOT_RECORD = {"subscription", "ack", "message-id", "destination", "content-length",
              "delivery-count", "x-stream-offset", "timestamp"}


def fill(c: RawStomp, stream: str, n: int) -> None:
    for i in range(n):
        body = bytes([i % 256]) * (i % 7) + b"\x00end"  # NULs, and some empty-ish
        headers = {"destination": stream, "n": str(i), "odd": "a:b\nc\\d"}
        if i == n - 1:
            c.request("SEND", headers, body)
        else:
            c.send_frame("SEND", headers, body)


def plain(frame: Frame) -> tuple:
    h = frame.headers
    return (int(h["x-stream-offset"]), int(h["timestamp"]), h["message-id"],
            {k: v for k, v in h.items() if k not in NOT_RECORD}, frame.body)


def read_batched(c: RawStomp, stream: str, start: int, end: int, batch: int
                 ) -> tuple[list[int], list[tuple]]:
    """(records per frame, the decoded records) of the range [start, end)."""
    subscribe(c, stream, f"offset={start}", ack="client", **{
        "x-stream-end-offset": str(end), "x-stream-batch": str(batch),
        "prefetch-count": "1000"})
    sizes: list[int] = []
    records: list[tuple] = []
    while True:
        frame = c.read_message()
        h = frame.headers
        if h.get("x-stream-end") == "true":
            assert int(h["x-stream-offset"]) == end and "x-stream-batch" not in h
            return sizes, records
        found = decode_records(frame.body)
        assert int(h["x-stream-batch"]) == len(found)
        assert int(h["x-stream-offset"]) == found[0][0]
        assert h["message-id"] == found[0][2] and h["destination"] == stream
        sizes.append(len(found))
        records.extend(found)
        c.send_frame("ACK", {"id": h["ack"]})


def test_a_batched_range_carries_what_plain_messages_do(server_factory, raw_client):
    srv = server_factory()
    c, _ = raw_client(srv)
    fill(c, "/stream/b", 30)
    subscribe(c, "/stream/b", "first")
    expected = [plain(f) for f in read(c, 30)]
    r, _ = raw_client(srv)
    sizes, records = read_batched(r, "/stream/b", 2, 27, 8)
    assert sizes == [8, 8, 8, 1]
    assert records == expected[2:27]
    c.close()
    r.close()
    srv = restart(srv)  # recovered: every body is read back from the journal
    c, _ = raw_client(srv)
    sizes, records = read_batched(c, "/stream/b", 0, 30, 1000)
    assert sizes == [30] and records == expected


def test_credit_counts_records(server, raw_client):
    c, _ = raw_client(server)
    fill(c, "/stream/credit", 20)
    subscribe(c, "/stream/credit", "first", ack="client",
              **{"x-stream-batch": "4", "prefetch-count": "10"})
    frames = read(c, 3)
    assert [int(f.headers["x-stream-batch"]) for f in frames] == [4, 4, 2]
    c.assert_quiet()
    c.request("ACK", {"id": frames[0].headers["ack"]})  # four records' credit back
    more = read(c, 1)[0]
    assert (more.headers["x-stream-offset"], more.headers["x-stream-batch"]) == ("10", "4")
    c.assert_quiet()


@pytest.mark.parametrize("value", ["0", "10001", "many"])
def test_a_bad_batch_size_gets_an_error_naming_it(server, raw_client, value):
    c, _ = raw_client(server)
    c.send_frame("SUBSCRIBE", {"destination": "/stream/new", "id": "x",
                               "x-stream-batch": value})
    frames = c.read_until_closed()
    message = frames[0].headers["message"]
    assert frames[0].command == "ERROR" and "x-stream-batch" in message, frames
    assert repr(value) in message
