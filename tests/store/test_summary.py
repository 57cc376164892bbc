"""Segment summaries (store/summary.py): a start reads sealed segments through their
summaries and rebuilds exactly what reading every record rebuilds (queues in memory and
in paged logs, durable subscriptions, dup-ids, producer sequences, streams, epochs),
whether the journal was written by an active server or by a backup following it; a
summary that does not match its segment is not used, and a start without summaries is
what it always was. Real journal files, a real writer thread."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pairmq.core.replay import Replay
from pairmq.store import reading
from pairmq.store.reading import JournalCorrupt
from pairmq.store.record_decoding import decode_lone_add
from pairmq.store.records import ADD_SIZE_OVER_ENTRY, RECORD_HEADER, SEGMENT_HEADER, encode_add
from pairmq.store.store import Store
from pairmq.store.summary import decode_summary
from tests.support.mirror import workload
from tests.support.stores import NOW, PERSISTENT, close, persist, run
from tests.support.summaries import (
    a_backup_follows_more_traffic,
    more_traffic,
    open_store,
    recovered,
    settings,
    started_from,
    without_summaries,
)


def filled(directory: Path) -> None:
    """A journal of `more_traffic`, its writer closed."""
    async def fill() -> None:
        broker, store = await open_store(directory)
        await more_traffic(broker, store)
        await close(store)

    run(fill())


@pytest.fixture
def bulk_runs(monkeypatch) -> list[int]:
    """The messages each `Replay.paged_run` put into a paged log at once."""
    taken: list[int] = []
    original = Replay.paged_run

    def counted(self, destination, queue_keys, segment, offsets, lengths, orders, sizes):
        done = original(self, destination, queue_keys, segment, offsets, lengths, orders,
                        sizes)
        if done:
            taken.append(len(orders))
        return done

    monkeypatch.setattr(Replay, "paged_run", counted)
    return taken


def test_a_start_through_summaries_rebuilds_what_reading_every_record_does(tmp_path,
                                                                          bulk_runs):
    async def fill() -> None:
        broker, store = await open_store(tmp_path)
        store.begin_epoch(1)
        await workload(broker, store, 300)
        store.begin_epoch(2)
        await more_traffic(broker, store)
        await close(store)

    run(fill())
    summaries = sorted(tmp_path.glob("journal-*.sum"))
    assert len(summaries) >= 20
    items = [item for path in summaries for item in decode_summary(path.read_bytes()).items]
    assert any(item.dups for item in items), "SENDs with a dup-id make runs too"
    quick, report = recovered(tmp_path)
    assert report.summarised >= 20, report.describe()
    assert "through their summaries" in report.describe()
    assert sum(bulk_runs) > 2000, "paged messages went into their logs in runs"
    assert quick["queues"]["/queue/batch"] and quick["streams"]["/stream/s"]["records"]
    assert len(quick["queues"]["durable:s:one"]) == 60 * 17 + 6

    without_summaries(tmp_path)
    bulk_runs.clear()
    slow, report = recovered(tmp_path)
    assert report.summarised == 0 and not bulk_runs
    assert quick == slow


def test_a_backup_writes_summaries_and_its_start_through_them_matches(tmp_path, bulk_runs):
    directory = a_backup_follows_more_traffic(tmp_path)
    assert len(list(directory.glob("journal-*.sum"))) >= 20
    quick, report = recovered(directory)
    assert report.summarised >= 20 and sum(bulk_runs) > 2000
    without_summaries(directory)
    slow, _ = recovered(directory)
    assert quick == slow


def test_a_summary_that_does_not_match_its_segment_is_not_used(tmp_path):
    filled(tmp_path)
    reference, report = recovered(tmp_path)
    count = report.summarised
    assert count >= 10
    other, first, second, third = sorted(tmp_path.glob("journal-*.sum"))[1:5]
    damaged = bytearray(first.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # its checksum fails
    first.write_bytes(bytes(damaged))
    second.write_bytes(second.read_bytes()[:-9])  # cut short
    third.write_bytes(other.read_bytes())  # another segment's
    got, report = recovered(tmp_path)
    assert got == reference
    assert report.summarised == count - 3
    assert not first.exists() and not second.exists() and not third.exists(), \
        "a start deletes the summaries it could not use"


def test_a_segment_grown_after_its_summary_is_read_on_from_where_it_ends(tmp_path):
    """The summary says where the records it covers end (a prefix of the segment, for
    the segment being written): what follows is read record by record, and garbage
    there, in a segment that is not the newest, is damage."""
    filled(tmp_path)
    reference, _ = recovered(tmp_path)
    segment = sorted(tmp_path.glob("journal-*.seg"))[3]
    summary = segment.with_suffix(".sum")
    held = summary.read_bytes()
    grown = segment.read_bytes() + b"\0" * 64
    segment.write_bytes(grown)  # (zeros past the end: would be a torn tail if newest)
    with pytest.raises(JournalCorrupt):
        recovered(tmp_path)  # read on after the summary: damage in an older segment
    segment.write_bytes(grown[:-64])
    summary.write_bytes(held)
    assert recovered(tmp_path)[0] == reference


def test_a_summary_lists_each_message_as_its_record_holds_it(tmp_path):
    """Offsets, lengths, orders and sizes in a summary are those of the ADD entries in
    the segment (what a paged log keeps), and a size is what recovery counts for it."""
    entry, body_at = encode_add(7, "ID:x", "/queue/q", 4, 0, True, 0, {"a": "b"}, b"x" * 100,
                                ["/queue/q"])
    meta_length = body_at - 31
    assert len(entry) + ADD_SIZE_OVER_ENTRY == 100 + meta_length + 64

    filled(tmp_path)
    listed = 0
    for path in sorted(tmp_path.glob("journal-*.sum")):
        summary = decode_summary(path.read_bytes())
        data = memoryview(path.with_suffix(".seg").read_bytes())
        assert summary.items[0].start == SEGMENT_HEADER.size and summary.size == len(data)
        for item in summary.items:
            assert RECORD_HEADER.unpack_from(data, item.start)[2] == item.first_seq
            for offset, length, order, size in zip(item.offsets, item.lengths, item.orders,
                                                   item.sizes, strict=True):
                fields = decode_lone_add(data[offset:offset + length])  # exactly one entry
                assert fields is not None and fields[0] == order
                assert size == fields[10] + fields[11] + 64  # body + metadata + 64
                listed += 1
    assert listed > 2000


def test_a_run_whose_first_messages_stay_in_memory_pages_the_rest_at_once(tmp_path, bulk_runs,
                                                                         monkeypatch):
    """A start that keeps less of a destination in memory than the server did (a smaller
    [store] recovery_in_memory_bytes): the head of a summarised run is read record by
    record into memory, and once the destination pages, the rest of the run goes into its
    log at once. It rebuilds exactly what reading every record does, producer sequences
    included, and a run of messages with dup-ids keeps them in order."""
    monkeypatch.setattr(reading, "HEAD_CHUNK_BYTES", 2048)

    async def fill() -> None:
        broker, store = await open_store(tmp_path)
        broker.open_session(1, "1.2", client_id="p")
        for i in range(600):  # one message a record: runs of many records
            broker.send(1, "/queue/head", {**PERSISTENT, "pairmq-producer": f"p{i % 3}",
                                           "pairmq-producer-epoch": "1",
                                           "pairmq-seq": str(i // 3)},
                        b"%06d" % i + b"h" * 250, NOW + i)
            persist(broker, store)
            if i == 300:  # a run of 40 records with dup-ids, its head in memory too
                for k in range(40):
                    broker.send(1, "/queue/dups", {**PERSISTENT, "dup-id": f"d{k}"},
                                b"%06d" % k + b"d" * 250, NOW)
                    persist(broker, store)
        await close(store)

    run(fill())
    first_run = next(item for item in decode_summary(
        sorted(tmp_path.glob("journal-*.sum"))[0].read_bytes()).items
        if item.destination == "/queue/head")
    firsts: list[int] = []  # the enqueue order of each run's first message taken at once
    counted = Replay.paged_run

    def spied(self, destination, queue_keys, segment, offsets, lengths, orders, sizes):
        done = counted(self, destination, queue_keys, segment, offsets, lengths, orders,
                       sizes)
        if done:
            firsts.append(orders[0])
        return done

    monkeypatch.setattr(Replay, "paged_run", spied)
    small = settings(paged_beyond=lambda destination: 3_000)  # ~10 of the messages
    quick, report = asyncio.run(started_from(Store(tmp_path, small)))
    assert report.summarised >= 3, report.describe()
    assert len(first_run.orders) > 50
    assert first_run.orders[0] < firsts[0] <= first_run.orders[20], \
        "the first segment's run went to the log at once after its head"
    assert bulk_runs[0] == first_run.orders[-1] - firsts[0] + 1
    assert len(quick["queues"]["/queue/head"]) == 600
    assert [body[:6] for body, *_ in quick["queues"]["/queue/head"]] == \
        [b"%06d" % i for i in range(600)]
    assert quick["producers"]["/queue/head"]
    assert quick["dups"]["/queue/dups"] == [f"d{k}" for k in range(40)]
    assert any(item.dups for path in tmp_path.glob("journal-*.sum")
               for item in decode_summary(path.read_bytes()).items)

    without_summaries(tmp_path)
    bulk_runs.clear()
    slow, _ = asyncio.run(started_from(Store(tmp_path, small)))
    assert not bulk_runs
    assert quick == slow
