"""The journal on real files: group commit, recovery, torn tails, corruption, compaction, paging."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from pairmq.core import Broker, CoreSettings
from pairmq.store.check import check_journal, repair_journal
from pairmq.store.reading import JournalCorrupt
from pairmq.store.record_decoding import decode_acks, decode_adds, decode_entries, decode_lone_add
from pairmq.store.records import (
    ADD,
    BAD_BYTES,
    DEL,
    DELIVERED,
    DUP,
    PRODUCER,
    CorruptRecord,
    PackedHeaders,
    encode_add,
    encode_del,
    encode_delivered,
    encode_dup,
    encode_producer,
)
from pairmq.store.segments import list_segments
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from pairmq.store.writer import IOV_MAX, RWF_DSYNC, write_all
from tests.support.disk import DiskCalls
from tests.support.stores import (
    NOW,
    PERSISTENT,
    churn,
    close,
    journal_groups,
    open_broker,
    persist,
    queue_bodies,
    run,
    synced,
)


def test_entries_round_trip_with_awkward_values():
    add, body_at = encode_add(7, "id\\1", "/queue/a\nb", 9, 123, True, 2,
                              {"k:\\n": "v\nw\\", "": ""}, b"\x00body\n", ["/queue/a\nb", "x"])
    assert add[body_at:] == b"\x00body\n"
    entries = decode_entries(add + encode_del("q", "id", 7) + encode_dup("q", "d\n"))
    (kind, a), (k2, *d), (k3, *u) = entries
    assert kind == ADD and k2 == DEL and k3 == DUP
    assert (a.order, a.message_id, a.destination, a.priority, a.expires, a.persistent,
            a.deliveries) == (7, "id\\1", "/queue/a\nb", 9, 123, True, 2)
    assert a.headers == {"k:\\n": "v\nw\\", "": ""} and a.queues == ["/queue/a\nb", "x"]
    assert a.body == b"\x00body\n" and d == ["q", "id", 7] and u == ["q", "d\n"]


def test_a_record_of_messages_and_their_producers_takes_the_fast_path():
    """Recovery decodes a record of ADDs without the general loop; the PRODUCER entries
    the same SENDs wrote (after the messages) do not push it off that path."""
    one, _ = encode_add(1, "m1", "/queue/q", 4, 0, True, 0, {}, b"a", ["/queue/q"])
    two, _ = encode_add(2, "m2", "/queue/q", 4, 0, True, 0, {}, b"b", ["/queue/q"])
    last = (1 << 63) - 1
    payload = one + two + encode_producer("/queue/q", "p\n1", 3, last, 1_000)
    producers: list[tuple] = []
    adds = decode_adds(memoryview(payload), producers)
    assert adds is not None and [a[5] for a in adds] == ["m1", "m2"]
    assert producers == [(PRODUCER, "/queue/q", "p\n1", 3, last, 1_000)]
    assert decode_entries(payload)[-1] == producers[0]
    with pytest.raises(CorruptRecord):
        decode_entries(payload[:-3])


def test_a_turn_of_messages_delivered_at_once_is_read_with_its_acknowledgements_in_order():
    """A turn in which messages were added and handed to a consumer at once (ADD and
    DELIVERED by turns, a DEL when the consumer acknowledged in that turn too): with
    `acks`, decode_adds reads it, each acknowledgement placed after the ADDs before it;
    without, it leaves it to the general loop, as recovery expects. A cut one is corrupt."""
    one, _ = encode_add(1, "m1", "/queue/q", 4, 0, True, 0, {}, b"a", ["/queue/q"])
    two, _ = encode_add(2, "m\n2", "/queue/q", 4, 0, True, 0, {"x": "y"}, b"bb", ["/queue/q"])
    payload = (one + encode_delivered("/queue/q", "m1", 1, 1) + two
               + encode_producer("/queue/q", "p", 1, 7, 100)
               + encode_delivered("/queue/q", "m\n2", 1, 2) + encode_del("/queue/q", "m1", 1))
    assert decode_adds(memoryview(payload), []) is None
    producers: list[tuple] = []
    acks: list[tuple] = []
    adds = decode_adds(memoryview(payload), producers, acks)
    assert adds is not None and [(a[5], a[7]) for a in adds] == [("m1", {}), ("m\n2", {"x": "y"})]
    assert acks == [(1, (DELIVERED, "/queue/q", "m1", 1, 1)),
                    (2, (DELIVERED, "/queue/q", "m\n2", 1, 2)),
                    (2, (DEL, "/queue/q", "m1", 0, 1))]
    assert producers == [(PRODUCER, "/queue/q", "p", 1, 7, 100)]
    general = decode_entries(payload)
    assert [e[0] for e in general] == [ADD, DELIVERED, ADD, PRODUCER, DELIVERED, DEL]
    assert decode_adds(memoryview(payload + encode_dup("q", "d")), [], []) is None
    for cut in (1, 5, 9):
        with pytest.raises((CorruptRecord, *BAD_BYTES)):
            decode_adds(memoryview(payload[:-cut]), [], [])
    for name in (b"m1", b"/queue/q"):  # bytes that are not UTF-8: in an ADD, in an ack
        with pytest.raises(UnicodeDecodeError):
            decode_adds(memoryview(payload.replace(name, b"\xff" + name[1:], 1)), [], [])
        with pytest.raises(UnicodeDecodeError):
            decode_adds(memoryview(payload[len(one):].replace(name, b"\xff" + name[1:], 1)),
                        [], [])
    with pytest.raises(CorruptRecord):
        decode_acks(memoryview(encode_del("/queue/q", "m1", 1).replace(b"m1", b"\xff1")))


def test_a_record_of_acknowledgements_takes_the_fast_path():
    """A record of DELs and DELIVEREDs (what consumers write, a million of them replayed
    by a start after a drain) decodes in one loop to what the general loop gives; any
    other entry in it sends it back to the general loop; a cut one is corrupt."""
    payload = (encode_delivered("/queue/q", "m1", 2, 11) + encode_del("/queue/q", "m1", 11)
               + encode_del("durable:c\u00e9", "m\n2", (1 << 63) - 1))
    acks = decode_acks(memoryview(payload))
    assert acks == [(DELIVERED, "/queue/q", "m1", 2, 11), (DEL, "/queue/q", "m1", 0, 11),
                    (DEL, "durable:c\u00e9", "m\n2", 0, (1 << 63) - 1)]
    assert decode_entries(payload) == [(DELIVERED, "/queue/q", "m1", 2, 11),
                                       (DEL, "/queue/q", "m1", 11),
                                       (DEL, "durable:c\u00e9", "m\n2", (1 << 63) - 1)]
    assert decode_acks(memoryview(payload + encode_dup("q", "d"))) is None
    for cut in (1, 3, 8, 12):
        with pytest.raises(CorruptRecord):
            decode_acks(memoryview(payload[:-cut]))


def test_lone_add_record_keeps_plain_headers_packed_until_first_use():
    headers = {"persistent": "true", "x-a": "1", "content-type": "text/plain"}
    add, body_at = encode_add(3, "id-1", "/queue/a", 4, 0, True, 0, headers, b"body",
                              ["/queue/a", "durable:c:s"])
    fields = decode_lone_add(memoryview(add))
    assert fields is not None
    order, _, _, _, _, message_id, destination, packed, queues, at, length, _ = fields
    assert (order, message_id, destination, queues) == (3, "id-1", "/queue/a",
                                                      ["/queue/a", "durable:c:s"])
    assert (at, length) == (body_at, 4)
    assert isinstance(packed, PackedHeaders)
    assert dict(packed) == headers and list(packed.items()) == list(headers.items())
    assert packed["x-a"] == "1" and packed.get("nope") is None and len(packed) == 3
    # Compaction re-journals recovered messages: packed headers encode to the same bytes.
    meta_at = body_at - 4 - fields[11]
    again = PackedHeaders(add[meta_at:body_at - 4].decode())
    assert encode_add(3, "id-1", "/queue/a", 4, 0, True, 0, again, b"body",
                      ["/queue/a", "durable:c:s"])[0] == add
    # Escaped values are decoded at once, and equally exact.
    odd = {"k:\\n": "v\nw\\", "": ""}
    add, _ = encode_add(4, "id\\2", "/queue/b\nc", 4, 0, True, 0, odd, b"", ["/queue/b\nc"])
    fields = decode_lone_add(memoryview(add))
    assert fields is not None and fields[5:9] == ("id\\2", "/queue/b\nc", odd, ["/queue/b\nc"])
    # More than one entry in the record: the general decoder's job.
    assert decode_lone_add(memoryview(add + encode_del("q", "id", 1))) is None


def test_a_mirror_learns_where_the_journal_ends_without_rebuilding_anything(tmp_path):
    async def fill():
        broker, store = await open_broker(tmp_path, segment_bytes=4096)
        store.begin_epoch(3)
        broker.open_session(1, "1.2")
        for i in range(20):
            broker.send(1, "/queue/q", PERSISTENT, b"%d" % i * 100, NOW)
            persist(broker, store)
        await close(store)

    run(fill())
    full = Store(tmp_path, StoreSettings())
    _, report = full.recover()
    assert report.messages == 20 and report.segments > 1
    mirror = Store(tmp_path, StoreSettings())
    empty, quick = mirror.recover(rebuild=False)
    assert not empty.queues and quick.messages == 0
    assert (mirror.appended_seq, mirror.epoch, mirror.epochs, quick.records, quick.segments) \
        == (full.appended_seq, full.epoch, full.epochs, report.records, report.segments)
    assert full.epoch == 3


def test_an_empty_record_is_read_back_as_nothing(tmp_path):
    """A record group with no entries (a tool's, or a writer's with nothing to say) is a
    valid record: a start reads past it, and the messages around it come back. It used to
    stop the start with an IndexError, which a BufferError then hid."""
    async def fill() -> None:
        broker, store = await open_broker(tmp_path)
        broker.open_session(1, "1.2")
        broker.send(1, "/queue/q", PERSISTENT, b"before", NOW)
        persist(broker, store)
        store.persist([])
        broker.send(1, "/queue/q", PERSISTENT, b"after", NOW)
        persist(broker, store)
        await close(store)

    run(fill())

    async def check() -> list[bytes]:
        broker, store = await open_broker(tmp_path)
        bodies = queue_bodies(broker, "/queue/q")
        await close(store)
        return bodies

    assert run(check()) == [b"before", b"after"]


def test_recovery_rebuilds_queues_durables_dups_and_redelivery(tmp_path):
    async def first():
        broker, store = await open_broker(tmp_path)
        broker.open_session(1, "1.2", client_id="c")
        broker.subscribe(1, "d", "/topic/t", NOW, durable_name="sub")
        persist(broker, store)
        broker.close_session(1, NOW)
        broker.open_session(2, "1.2")
        for i in range(5):
            broker.send(2, "/queue/q", {**PERSISTENT, "priority": str(i % 2 * 5)}, b"%d" % i, NOW)
            persist(broker, store)
        broker.send(2, "/queue/q", {"persistent": "false"}, b"volatile", NOW)
        broker.send(2, "/topic/t", {**PERSISTENT, "dup-id": "once"}, b"for-durable", NOW)
        persist(broker, store)
        broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=2)
        persist(broker, store)
        first_two = broker.take_outbox()[2]
        broker.ack(2, first_two[0].ack_id, NOW)  # acked: gone; the second stays in flight
        persist(broker, store)
        await close(store)
        return [d.entry.message.body for d in first_two]

    delivered = run(first())

    async def second():
        broker, store = await open_broker(tmp_path)
        assert queue_bodies(broker, "/queue/q")[0] == delivered[1]  # back at the head
        assert sorted(queue_bodies(broker, "/queue/q")) == sorted(
            {b"0", b"1", b"2", b"3", b"4"} - {delivered[0]})
        assert "c:sub" in broker.durables
        assert [e.message.body for e in broker.durables["c:sub"].entries()] == [b"for-durable"]
        assert "once" in broker.addresses["/topic/t"].dups
        broker.open_session(3, "1.2")
        broker.subscribe(3, "s", "/queue/q", NOW, ack="client-individual")
        out = broker.take_outbox()[3]
        assert out[0].entry.message.body == delivered[1] and out[0].delivery_count == 2
        assert all(d.delivery_count == 1 for d in out[1:])
        # the dup-id survived: a resend is confirmed but not delivered again
        broker.subscribe(3, "t", "/topic/t", NOW)
        broker.send(3, "/topic/t", {**PERSISTENT, "dup-id": "once"}, b"again", NOW)
        assert broker.stats["duplicates"] == 1
        await close(store)

    run(second())


def test_uncommitted_transaction_is_not_recovered(tmp_path):
    async def first():
        broker, store = await open_broker(tmp_path)
        broker.open_session(1, "1.2")
        broker.begin(1, "tx")
        broker.send(1, "/queue/q", PERSISTENT, b"never", NOW, transaction="tx")
        broker.begin(1, "ok")
        broker.send(1, "/queue/q", PERSISTENT, b"committed", NOW, transaction="ok")
        broker.commit(1, "ok", NOW)
        persist(broker, store)
        await close(store)

    run(first())

    async def second():
        broker, store = await open_broker(tmp_path)
        assert queue_bodies(broker, "/queue/q") == [b"committed"]
        await close(store)

    run(second())


def fill(tmp_path: Path, count: int, pad: int = 0, **settings) -> None:
    async def go():
        broker, store = await open_broker(tmp_path, **settings)
        broker.open_session(1, "1.2")
        for i in range(count):
            broker.send(1, "/queue/q", PERSISTENT, b"m%03d" % i + b"." * pad, NOW)
            persist(broker, store)
        await close(store)

    run(go())


def recovered_bodies(tmp_path: Path) -> list[bytes]:
    async def go():
        broker, store = await open_broker(tmp_path)
        bodies = queue_bodies(broker, "/queue/q")
        await close(store)
        return bodies

    return run(go())


def test_a_check_reports_its_progress_to_the_end(tmp_path):
    """`pairmq journal check` draws its bar from these calls: bytes scanned of all."""
    fill(tmp_path, 10)
    seen: list[tuple[int, int]] = []
    assert check_journal(tmp_path, lambda done, total: seen.append((done, total))).ok
    (_, path), = list_segments(tmp_path)
    assert seen == [(path.stat().st_size, path.stat().st_size)]


@pytest.mark.parametrize("cut", [1, 5, 17, 30])
def test_torn_tail_is_cut_and_logged(tmp_path, caplog, cut):
    fill(tmp_path, 10)
    (_, path), = list_segments(tmp_path)
    size = path.stat().st_size
    os.truncate(path, size - cut)  # the last record was only partly written
    with caplog.at_level(logging.WARNING):
        bodies = recovered_bodies(tmp_path)
    assert bodies == [b"m%03d" % i for i in range(9)]
    assert "torn write" in caplog.text and "dropped" in caplog.text
    assert check_journal(tmp_path).damage is None  # the cut was made on disk


def test_garbage_appended_at_the_tail_is_a_torn_write(tmp_path):
    fill(tmp_path, 3)
    (_, path), = list_segments(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\x10\x00\x00\x00garbage")
    assert recovered_bodies(tmp_path) == [b"m000", b"m001", b"m002"]


def test_corruption_in_the_middle_refuses_to_start_and_repair_cuts_it(tmp_path):
    fill(tmp_path, 10)
    (_, path), = list_segments(tmp_path)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as info:
        recovered_bodies(tmp_path)
    assert path.name in str(info.value) and "offset" in str(info.value)
    report = check_journal(tmp_path)
    assert report.damage is not None and not report.ok
    actions = repair_journal(tmp_path)
    assert any("cut" in a for a in actions)
    bodies = recovered_bodies(tmp_path)
    assert 0 < len(bodies) < 10
    assert bodies == [b"m%03d" % i for i in range(len(bodies))]


def test_damage_in_an_older_segment_is_corruption_even_at_its_end(tmp_path):
    fill(tmp_path, 200, pad=1000, segment_bytes=64 * 1024)
    segments = list_segments(tmp_path)
    assert len(segments) >= 3
    _, older = segments[0]
    os.truncate(older, older.stat().st_size - 3)
    with pytest.raises(JournalCorrupt, match=older.name):
        recovered_bodies(tmp_path)


def test_compaction_keeps_the_journal_bounded_and_rewrites_long_lived_records(tmp_path):
    async def go():
        broker, store = await open_broker(tmp_path, segment_bytes=64 * 1024)
        broker.open_session(1, "1.2")
        broker.send(1, "/queue/keep", PERSISTENT, b"long-lived", NOW)
        persist(broker, store)
        await churn(broker, store, 3000)
        segments = len(list_segments(tmp_path))
        await close(store)
        return segments

    segments = run(go())
    assert segments <= 4, f"{segments} segments left after 3000 messages of ~1.6 MB"
    (first_id, _), *_ = list_segments(tmp_path)
    assert first_id > 1  # the segment holding the long-lived message was rewritten away

    async def check():
        broker, store = await open_broker(tmp_path)
        assert queue_bodies(broker, "/queue/keep") == [b"long-lived"]
        assert queue_bodies(broker, "/queue/work") == []
        await close(store)

    run(check())


def test_paging_keeps_bodies_on_disk_and_delivers_them_in_order(tmp_path):
    async def go():
        broker, store = await open_broker(tmp_path, paging_bytes=10_000)
        broker.open_session(1, "1.2")
        for i in range(100):
            broker.send(1, "/queue/q", PERSISTENT, b"%04d" % i + b"." * 996, NOW)
            persist(broker, store)
        await synced(store)
        q = broker.queues["/queue/q"]
        paged = [e.message for e in q.entries() if e.message.body is None]
        assert len(paged) >= 85  # only about 10 KB of bodies stay in memory
        assert store.memory_bytes <= 10_000 + 1000
        bodies = [store.read_body(e.message)[:4] for e in q.entries()]
        assert bodies == [b"%04d" % i for i in range(100)]
        await close(store)

    run(go())

    async def again():
        broker, store = await open_broker(tmp_path, paging_bytes=10_000)
        q = broker.queues["/queue/q"]
        assert sum(1 for e in q.entries() if e.message.body is None) >= 85
        assert [store.read_body(e.message)[:4] for e in q.entries()] == [
            b"%04d" % i for i in range(100)]
        await close(store)

    run(again())


needs_synchronous_writes = pytest.mark.skipif(
    not RWF_DSYNC, reason="this platform's os module has no RWF_DSYNC (pwritev2, Linux 4.7+)")


@needs_synchronous_writes
def test_a_group_for_one_segment_is_written_and_synced_by_one_system_call(tmp_path, monkeypatch):
    """The writer thread takes the GIL back after every system call: a group of a few
    records is one pwritev2 with RWF_DSYNC, not a writev and an fdatasync."""
    calls = DiskCalls(monkeypatch)

    journal_groups(tmp_path, [[b"%d-%d" % (i, j) for j in range(3)] for i in range(20)])
    assert calls.fdatasyncs == [] and calls.writevs == []
    assert 20 <= len(calls.synced_writes) <= 22  # a group a round (and the segment's header)
    assert recovered_bodies(tmp_path) == [b"%d-%d" % (i, j) for i in range(20) for j in range(3)]


@needs_synchronous_writes
def test_a_segment_written_by_more_than_one_writev_is_synced_by_fdatasync(tmp_path, monkeypatch):
    """RWF_DSYNC makes durable the bytes of its own write only: a group holding more than
    IOV_MAX records of one segment is written by several writevs, then fdatasynced."""
    calls = DiskCalls(monkeypatch)

    journal_groups(tmp_path, [[b"%d" % i for i in range(IOV_MAX + 10)]])  # one group
    assert calls.writevs == [IOV_MAX, 11] and calls.synced_writes == []  # 11: and the header
    assert len(calls.fdatasyncs) == 1
    assert len(recovered_bodies(tmp_path)) == IOV_MAX + 10


@needs_synchronous_writes
def test_a_kernel_that_refuses_synchronous_writes_gets_writes_then_fdatasync(
        tmp_path, monkeypatch, caplog):
    calls = DiskCalls(monkeypatch)
    refused = []

    def pwritev(fd, buffers, offset, flags=0):
        refused.append(flags)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "pwritev", pwritev)

    with caplog.at_level(logging.INFO, logger="pairmq.journal"):
        journal_groups(tmp_path, [[b"%d" % i] for i in range(5)])
    assert refused == [RWF_DSYNC]  # asked once, then never again
    assert "refused a synchronous write" in caplog.text
    assert len(calls.fdatasyncs) >= 5 and len(calls.writevs) == len(calls.fdatasyncs)
    assert recovered_bodies(tmp_path) == [b"%d" % i for i in range(5)]


@needs_synchronous_writes
def test_a_short_synchronous_write_is_finished_and_synced(tmp_path, monkeypatch):
    calls = DiskCalls(monkeypatch)
    real_pwritev = os.pwritev
    cut = []

    def pwritev(fd, buffers, offset, flags=0):  # the kernel wrote 3 bytes of the first
        cut.append(flags)
        return real_pwritev(fd, [bytes(buffers[0])[:3]], offset, flags)

    monkeypatch.setattr(os, "pwritev", pwritev)

    journal_groups(tmp_path, [[b"body %d" % i] for i in range(4)])
    assert len(cut) >= 4 and len(calls.fdatasyncs) == len(cut)
    assert recovered_bodies(tmp_path) == [b"body %d" % i for i in range(4)]


def test_group_commit_covers_many_records_with_one_sync(tmp_path, monkeypatch):
    calls = DiskCalls(monkeypatch)

    async def go():
        broker, store = await open_broker(tmp_path)
        broker.open_session(1, "1.2")
        for i in range(2000):
            broker.send(1, "/queue/q", PERSISTENT, b"%d" % i, NOW)
            persist(broker, store)
        await close(store)

    run(go())
    assert calls.syncs < 50, f"{calls.syncs} syncs for 2000 records"
    # Records bound for one segment go out in one writev (at most IOV_MAX buffers each).
    writes = calls.writevs + calls.synced_writes
    assert len(writes) < 60 and max(writes) == IOV_MAX, writes
    assert len(recovered_bodies(tmp_path)) == 2000


def test_a_short_writev_is_finished_with_plain_writes(tmp_path, monkeypatch):
    real_writev = os.writev
    # The kernel may write less than asked (a signal, a full disk racing): take 3 bytes.
    monkeypatch.setattr(os, "writev", lambda fd, bufs: real_writev(fd, [bytes(bufs[0])[:3]]))
    path = tmp_path / "segment"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        write_all(fd, [b"abcdef", b"ghi", b"jk"])
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abcdefghijk"


def test_recovered_headers_survive_dead_lettering_and_another_restart(tmp_path):
    """A recovered message's headers stay packed until used: copying them to a dead-letter
    queue (and journaling that copy) must see every one."""
    headers = {**PERSISTENT, "x-plain": "yes", "expires": str(NOW + 1000)}

    async def first():
        broker, store = await open_broker(tmp_path)
        broker.open_session(1, "1.2")
        broker.send(1, "/queue/q", PERSISTENT, b"first", NOW)  # its record creates the queue
        persist(broker, store)
        broker.send(1, "/queue/q", headers, b"body", NOW)  # a record holding only the ADD
        persist(broker, store)
        await close(store)

    async def second():
        broker, store = await open_broker(tmp_path)
        _, entry = broker.queues["/queue/q"].entries()
        assert isinstance(entry.message.headers, PackedHeaders)
        assert broker.sweep_expired(NOW + 2000) == 1
        persist(broker, store)
        await close(store)

    async def third():
        broker, store = await open_broker(tmp_path)
        assert queue_bodies(broker, "/queue/q") == [b"first"]
        (entry,) = broker.queues["/queue/DLQ.q"].entries()
        moved = dict(entry.message.headers)
        assert moved["x-plain"] == "yes" and moved["persistent"] == "true"
        assert moved["original-destination"] == "/queue/q" and "expires" not in moved
        assert entry.message.body == b"body"
        await close(store)

    run(first())
    run(second())
    run(third())


def test_a_recovered_paged_log_holds_each_segment_for_exactly_its_entries(tmp_path):
    """A paged log whose chunks span segments (small segments here) is accounted at
    recovery in runs, one per segment: each segment is held by exactly the entries it
    holds (what compaction relies on to know which segments still hold waiting
    messages), whether it is counted from a chunk at once, in runs or entry by entry."""
    core = CoreSettings(max_size_bytes=20_000)

    async def start() -> tuple[Broker, Store]:
        store = Store(tmp_path, StoreSettings(segment_bytes=64 * 1024,
                                              paged_beyond=core.paged_beyond))
        replay, _ = store.recover()
        broker = Broker(core, id_prefix="ID:t-")
        broker.restore(replay)
        store.start(broker, asyncio.get_running_loop())
        return broker, store

    async def fill() -> None:
        broker, store = await start()
        broker.open_session(1, "1.2")
        for i in range(3000):
            broker.send(1, "/queue/q", PERSISTENT, b"%05d" % i + b"." * 500, NOW)
            if i % 50 == 49:
                persist(broker, store)
        await close(store)

    async def recovered() -> tuple[dict, dict]:
        broker, store = await start()
        assert store.writer is not None
        held = {segment_id: (info.paged, list(info.tail.values()))
                for segment_id, info in store.writer.segments.items() if info.paged}
        log = broker.addresses["/queue/q"].log
        assert log is not None
        expected: dict[int, tuple[int, list[list[int]]]] = {}
        for first, chunk, i in log.chunks_from(log.released):
            for k in range(i, len(chunk)):  # entry by entry: count, first and last number
                number = first + k - i
                count, spans = expected.get(chunk.segment[k], (0, [[0, number, number]]))
                spans[0][0] += 1
                spans[0][2] = number
                expected[chunk.segment[k]] = (count + 1, spans)
        await close(store)
        return held, expected

    run(fill())
    held, expected = run(recovered())
    assert len(expected) >= 20  # the log's chunks span many segments
    assert held == expected
