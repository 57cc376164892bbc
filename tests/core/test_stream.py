"""Streams in the core, without I/O (docs/streams.md): dense offsets, start positions,
retention by size, age and consumer group (time given as `now`), bounded ranges and their
end marker, credit, and a broker rebuilt from the records it emitted."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core import records as rec
from pairmq.core.settings import Retention
from pairmq.core.stream_log import StartKind, parse_start
from tests.support.pages import Pages
from tests.support.replay import replayed

S = "/stream/s"
pages = Pages()  # the store's part: records on disk, read back


def broker(**retention) -> Broker:
    settings = CoreSettings(stream_retention=Retention(**{"max_bytes": 0, **retention}))
    b = Broker(settings)
    b.open_session(1, "1.2")
    return b


def append(b: Broker, n: int, now: int = 1000, start: int = 0, size: int = 10) -> None:
    """Append n records, each on disk before the next comes (retention removes only
    those), and apply retention once more, as the server's tick does."""
    for i in range(start, start + n):
        b.send(1, S, {}, (f"m{i}".ljust(size)).encode(), now)
        pages.sync(b)
    b.retain_streams(now)


def delivered(b: Broker) -> list[tuple[str, int | str]]:
    """(subscription, offset or "end") of what the broker handed out since last asked."""
    out = []
    for d in b.take_outbox().get(1, []):
        headers = d.entry.message.headers
        what = "end" if headers.get("x-stream-end") == "true" else int(headers["x-stream-offset"])
        out.append((d.subscription.id, what))
    return out


def test_offsets_are_dense_and_stamped_and_nothing_is_consumed():
    b = broker()
    append(b, 3, now=5000)
    log = b.streams[S]
    assert (log.first, log.next, log.count) == (0, 3, 3)
    message = log.at(1)
    assert message is not None and message.persistent
    assert dict(message.headers) | {} == {"timestamp": "5000", "persistent": "true",
                                          "x-stream-offset": "1"}
    b.subscribe_stream(1, "a", S, {"x-stream-offset": "first"}, ack="client")
    got = b.take_outbox()[1]
    for d in got:
        b.ack(1, d.ack_id, 6000)
    assert log.count == 3  # acknowledging removed nothing


@pytest.mark.parametrize(("value", "kind", "number"), [
    (None, StartKind.NEXT, 0), ("first", StartKind.FIRST, 0), ("last", StartKind.LAST, 0),
    ("next", StartKind.NEXT, 0), ("offset=7", StartKind.OFFSET, 7), ("7", StartKind.OFFSET, 7),
    ("group", StartKind.GROUP, 0),
    # RabbitMQ's seconds below 10^11, pairmq's ms from there on (core/stream_log.py)
    ("timestamp=123", StartKind.TIMESTAMP, 123_000),
    ("timestamp=1619432061", StartKind.TIMESTAMP, 1_619_432_061_000),
    ("timestamp=99999999999", StartKind.TIMESTAMP, 99_999_999_999_000),
    ("timestamp=100000000000", StartKind.TIMESTAMP, 100_000_000_000),
    ("timestamp=1619432061000", StartKind.TIMESTAMP, 1_619_432_061_000)])
def test_start_values(value, kind, number):
    start = parse_start(value)
    assert (start.kind, start.value) == (kind, number)


@pytest.mark.parametrize("value", ["offset=-1", "-1", "offset=", "soon", "timestamp=x", "1.5",
                                   "1" * 5000, "offset=" + "1" * 5000, "offset=²"])
def test_malformed_start_names_the_header_and_value(value):
    with pytest.raises(CoreError, match="x-stream-offset"):
        parse_start(value)


def test_start_positions_and_an_offset_beyond_next_waits():
    b = broker()
    t = 10**12  # ms: a timestamp=T below 10^11 would be seconds
    for i in range(5):
        b.send(1, S, {}, b"x", t + 10 * i)  # stamps t, t + 10, ..., t + 40
    b.subscribe_stream(1, "first", S, {"x-stream-offset": "first"})
    b.subscribe_stream(1, "last", S, {"x-stream-offset": "last"})
    b.subscribe_stream(1, "next", S, {})
    b.subscribe_stream(1, "three", S, {"x-stream-offset": "offset=3"})
    b.subscribe_stream(1, "time", S, {"x-stream-offset": f"timestamp={t + 15}"})
    b.subscribe_stream(1, "far", S, {"x-stream-offset": "7"})
    got = delivered(b)
    by_sub: dict[str, list] = {}
    for sub, offset in got:
        by_sub.setdefault(sub, []).append(offset)
    assert by_sub == {"first": [0, 1, 2, 3, 4], "last": [4], "three": [3, 4], "time": [2, 3, 4]}
    append(b, 3, start=5)
    later = [(s, o) for s, o in delivered(b) if s == "far" or s == "next"]
    assert ("far", 7) in later and ("far", 6) not in later and ("next", 5) in later


def test_the_clock_stepping_back_keeps_stamps_ordered():
    b = broker()
    b.send(1, S, {}, b"a", 2000)
    b.send(1, S, {}, b"b", 1500)
    assert b.streams[S].at(1).headers["timestamp"] == "2000"


def test_bounded_range_ends_with_one_marker_even_after_retention():
    b = broker()
    append(b, 5)
    b.subscribe_stream(1, "r", S, {"x-stream-offset": "offset=1", "x-stream-end-offset": "3"})
    b.subscribe_stream(1, "w", S, {"x-stream-offset": "offset=4", "x-stream-end-offset": "7"})
    assert delivered(b) == [("r", 1), ("r", 2), ("r", "end"), ("w", 4)]
    append(b, 4, start=5)
    assert delivered(b) == [("w", 5), ("w", 6), ("w", "end")]
    with pytest.raises(CoreError, match="x-stream-end-offset"):
        b.subscribe_stream(1, "bad", S, {"x-stream-offset": "5", "x-stream-end-offset": "4"})
    b.streams[S].drop_head(4)  # as retention would: the range starts at the first left
    b.subscribe_stream(1, "gap", S, {"x-stream-offset": "offset=2", "x-stream-end-offset": "6"})
    assert delivered(b) == [("gap", 4), ("gap", 5), ("gap", "end")]


def test_credit_bounds_a_client_ack_reader():
    b = broker()
    append(b, 10)
    b.subscribe_stream(1, "c", S, {"x-stream-offset": "first"}, ack="client", prefetch=3)
    got = b.take_outbox()[1]
    assert [d.entry.message.headers["x-stream-offset"] for d in got] == ["0", "1", "2"]
    b.nack(1, got[1].ack_id, 0)  # cumulative for ack:client: two credits back
    assert [o for _, o in delivered(b)] == [3, 4]


def test_retention_by_size_keeps_whole_messages_and_the_newest():
    b = broker(max_bytes=400)
    append(b, 10)  # each message about 100 bytes
    log = b.streams[S]
    assert log.bytes <= 400 and log.next == 10 and log.first > 0
    dels = [r for r in b.take_records() if r[0] == rec.DEL]
    assert len(dels) == log.first
    tiny = broker(max_bytes=1)
    append(tiny, 3)
    assert (tiny.streams[S].first, tiny.streams[S].next) == (2, 3)  # the newest stays


def test_retention_by_age_on_the_tick():
    b = broker(max_age_ms=100)
    append(b, 3, now=1000)
    append(b, 2, now=1050, start=3)
    assert b.retain_streams(now=1100) == 0
    assert b.retain_streams(now=1101) == 3  # older than 100 ms
    assert b.retain_streams(now=9999) == 1  # ... all but the newest
    assert (b.streams[S].first, b.streams[S].next) == (4, 5)


def test_a_protecting_group_holds_retention_back():
    b = broker(max_bytes=1, group="spark")
    append(b, 5)
    assert b.streams[S].first == 0  # spark has committed nothing
    b.send(1, S, {"x-stream-group": "spark", "x-stream-commit-offset": "3"}, b"", 0)
    assert b.streams[S].first == 3
    assert b.group_offset(S, "spark") == 3
    b.send(1, S, {"x-stream-group": "spark", "x-stream-commit-offset": "1"}, b"", 0)
    assert b.group_offset(S, "spark") == 3  # only forward
    assert b.streams[S].next == 5  # commits append nothing
    b.subscribe_stream(1, "g", S, {"x-stream-offset": "group", "x-stream-group": "spark"})
    assert delivered(b) == [("g", 3), ("g", 4)]
    with pytest.raises(CoreError, match="x-stream-group"):
        b.subscribe_stream(1, "h", S, {"x-stream-offset": "group"})


def test_unknown_stream_must_exist_and_dup_ids():
    b = broker()
    with pytest.raises(CoreError, match="unknown stream /stream/none"):
        b.subscribe_stream(1, "x", "/stream/none", {"x-stream-must-exist": "true"})
    assert "/stream/none" not in b.streams
    assert b.subscribe_stream(1, "y", "/stream/made", {}) == (0, 0)
    b.send(1, S, {"dup-id": "a"}, b"1", 0)
    b.send(1, S, {"dup-id": "a"}, b"1", 0)
    assert b.streams[S].next == 1


def test_a_broker_rebuilt_from_its_records_has_the_same_offsets():
    b = broker(max_bytes=300)
    append(b, 8)
    b.send(1, S, {"x-stream-group": "g", "x-stream-commit-offset": "6"}, b"", 0)
    replay = replayed(b.take_records())
    again = Broker(b.settings)
    again.restore(replay)
    old, new = b.streams[S], again.streams[S]
    assert (new.first, new.next, new.bytes) == (old.first, old.next, old.bytes)
    assert again.group_offset(S, "g") == 6
    again.open_session(1, "1.2")
    again.send(1, S, {}, b"next", 0)
    assert again.streams[S].next == 9
