"""A stream's records as paged entries (issue 18, core/stream_log.py): only its newest HOT
records keep an object; a reader further back gets its records read back from "disk"
(tests/support/pages.py plays the store), in order, plain or batched; retention removes
records that have no object by their enqueue order; a restart and a backup rebuild the
same offsets with no object per record."""

from __future__ import annotations

from pairmq.core import Broker, CoreSettings, Message
from pairmq.core import records as rec
from pairmq.core.settings import Retention
from pairmq.core.stream_log import HOT
from tests.support.pages import Pages
from tests.support.replay import replayed

S = "/stream/s"
N = HOT * 3 + 17


def broker(**retention) -> Broker:
    settings = CoreSettings(stream_retention=Retention(**{"max_bytes": 0, **retention}))
    b = Broker(settings)
    b.open_session(1, "1.2")
    return b


def append(b: Broker, pages: Pages, n: int, start: int = 0, now: int = 1000) -> None:
    for i in range(start, start + n):
        b.send(1, S, {}, f"m{i}".encode(), now + i)
        if i % 100 == 99:
            pages.sync(b)  # records reach the disk in groups
    pages.sync(b)


def offsets_read(b: Broker, pages: Pages) -> list[int]:
    """Offsets of every record the broker delivered to session 1 (batches unrolled), read
    back as needed, until nothing more comes."""
    got: list[int] = []
    while True:
        pages.serve(b, 0)
        out = b.take_outbox().get(1, [])
        if b.take_capped(1):  # the server writes this turn's share, then asks for more
            b.set_writable(1, True, 0)
        if not out:
            return got
        for item in out:
            messages = item.messages if hasattr(item, "messages") else [item.entry.message]
            for message in messages:
                assert message.body == f"m{int(message.headers['x-stream-offset'])}".encode()
                got.append(int(message.headers["x-stream-offset"]))


def test_only_the_newest_records_keep_an_object():
    b, pages = broker(), Pages()
    append(b, pages, N)
    stream = b.streams[S]
    assert (stream.first, stream.next) == (0, N)
    assert stream.status()["in_memory"] == HOT
    assert stream.at(0) is None and stream.cold(0) and not stream.cold(N - 1)
    # what the memory guard counts follows: HOT records, not N
    held = sum(len(f"m{i}") for i in range(N - HOT, N))
    assert b.capacity.memory < held + HOT * 1000


def test_a_reader_from_the_first_record_gets_every_one_in_order():
    b, pages = broker(), Pages()
    append(b, pages, N)
    b.subscribe_stream(1, "a", S, {"x-stream-offset": "first"}, ack="auto", prefetch=500)
    assert offsets_read(b, pages) == list(range(N))
    assert pages.read == N - HOT  # only what had left memory was read back


def test_a_batched_client_ack_reader_reads_back_within_its_credit():
    b, pages = broker(), Pages()
    append(b, pages, N)
    b.subscribe_stream(1, "b", S, {"x-stream-offset": "first", "x-stream-batch": "300"},
                       ack="client", prefetch=600)
    got: list[int] = []
    while len(got) < N:
        pages.serve(b, 0)
        out = b.take_outbox().get(1, [])
        assert out, f"stalled at {len(got)}"
        assert sum(len(item.messages) for item in out) <= 600  # the credit, in records
        for item in out:
            got.extend(int(m.headers["x-stream-offset"]) for m in item.messages)
            b.ack(1, item.ack_id, 0)
    assert got == list(range(N))


def test_timestamps_of_records_without_an_object_are_found():
    b, pages = broker(), Pages()
    append(b, pages, N, now=1000)  # record i appended at 1000 + i
    stream = b.streams[S]
    assert stream.offset_at_time(1000 + 5) == 5  # cold
    assert stream.offset_at_time(1000 + N - 3) == N - 3  # hot
    assert stream.offset_at_time(10 ** 9) == N


def trimmed(pages: Pages) -> Broker:
    """A stream of N records whose 100 oldest retention removed (every record is past
    max_age; the protecting group committed offset 100)."""
    b = broker(max_age_ms=100, group="g")
    append(b, pages, N, now=1000)
    assert b.streams[S].first == 0
    b.take_records()
    b.send(1, S, {"x-stream-group": "g", "x-stream-commit-offset": "100"}, b"", 10 ** 6)
    return b


def test_retention_removes_cold_records_by_their_order():
    b = trimmed(Pages())
    assert b.streams[S].first == 100
    dels = [r for r in b.take_records() if r[0] == rec.DEL]
    assert [d[2].order for d in dels] == list(range(1, 101))  # orders start at 1
    assert b.take_moved_logs() == [b.streams[S].log]  # the store lets their segments go


def test_a_restart_rebuilds_offsets_without_objects():
    pages = Pages()
    b = broker(max_age_ms=100, group="g")
    append(b, pages, N, now=1000)
    b.send(1, S, {"x-stream-group": "g", "x-stream-commit-offset": "100"}, b"", 10 ** 6)
    b.send(1, S, {"x-stream-group": "g2", "x-stream-commit-offset": "500"}, b"", 10 ** 6)
    again = Broker(b.settings)
    again.restore(replayed(b.take_records()))
    old, new = b.streams[S], again.streams[S]
    assert (new.first, new.next, new.bytes) == (old.first, old.next, old.bytes)
    assert new.status()["in_memory"] == 0  # every record is read back when reached
    assert (new.first, again.group_offset(S, "g2")) == (100, 500)
    assert new.offset_at_time(1000 + 300) == 300


def test_a_backup_follows_appends_and_removals():
    pages = Pages()
    b = broker(max_age_ms=100, group="g")
    append(b, pages, N, now=1000)
    b.send(1, S, {"x-stream-group": "g", "x-stream-commit-offset": "100"}, b"", 10 ** 6)
    backup = Broker(b.settings)
    backup.start_following()
    for record in b.take_records():
        if record[0] == rec.ADD:
            message: Message = record[1]
            copy = Message(message.message_id, message.destination, dict(message.headers),
                           message.body, True, message.priority, 0, message.size,
                           message.order)
            backup.follow_add(copy, record[2], 0)
        elif record[0] == rec.DEL:
            backup.follow_remove(record[1], record[2].message_id, record[2].order)
    backup_pages = Pages()
    backup_pages.sync(backup)
    stream = backup.streams[S]
    assert (stream.first, stream.next) == (100, N)
    assert stream.status()["in_memory"] == HOT
    backup.end_following()


def test_size_retention_applies_once_records_are_on_disk_without_a_tick():
    b, pages = broker(max_bytes=2000), Pages()
    for i in range(40):
        b.send(1, S, {}, b"x" * 100, 1000 + i)
    stream = b.streams[S]
    assert stream.first == 0  # none of them is on disk yet: none can go
    pages.sync(b)
    assert 0 < stream.first < 40 and stream.bytes <= 2000
    assert [r[0] for r in b.take_records()].count(rec.DEL) == stream.first


def test_a_backup_removes_nothing_by_itself():
    b, pages = broker(max_bytes=2000), Pages()
    backup = Broker(b.settings)
    backup.start_following()
    for i in range(40):
        b.send(1, S, {}, b"x" * 100, 1000 + i)
    for record in b.take_records():
        if record[0] == rec.ADD:
            backup.follow_add(record[1], record[2], 0)
    pages.sync(backup)
    assert backup.streams[S].first == 0  # it waits for the active's removals
    assert not [r for r in backup.take_records() if r[0] == rec.DEL]


def test_records_read_back_per_turn_are_bounded_and_every_reader_gets_its_turn():
    b, pages = broker(), Pages()
    append(b, pages, N)
    for sub in ("a", "b"):
        b.subscribe_stream(1, sub, S, {"x-stream-offset": "first"}, ack="client-individual",
                           prefetch=N)
    turns, got = 0, {"a": [], "b": []}
    while reads := b.take_stream_reads(300):
        turns += 1
        assert sum(len(offsets) for _, offsets in reads) <= 300
        for cursor, offsets in reads:
            b.stream_read(cursor, offsets, [pages.record(cursor.stream.log, n)
                                            for n in offsets])
        for item in b.take_outbox().get(1, []):
            got[item.subscription.id].append(int(item.entry.message.headers["x-stream-offset"]))
    cold = N - HOT
    assert turns >= 2 * cold // 300
    assert got["a"] == got["b"] == list(range(N))
