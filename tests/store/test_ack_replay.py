"""A start after consumers took most of a paged backlog: the acknowledgements and deliveries
of messages whose segments were let go are passed over unread (store/records.py
`decode_acks` with `Replay.held_below`), and the start rebuilds exactly what it rebuilds
reading every one of them."""

from __future__ import annotations

from pathlib import Path

import pytest

import pairmq.store.reading as reading
from pairmq.core.replay import Replay
from pairmq.store.record_decoding import decode_acks
from pairmq.store.records import DEL, DELIVERED, encode_del, encode_delivered
from pairmq.store.segments import list_segments
from tests.support.stores import NOW, PERSISTENT, close, persist, run, synced
from tests.support.summaries import copied, open_store, recovered


def test_decode_leaves_out_the_entries_below_each_queues_bound() -> None:
    payload = (encode_del("/queue/a", "m1", 10) + encode_delivered("/queue/a", "m2", 2, 11)
               + encode_del("/queue/b", "m3", 12) + encode_delivered("/queue/a", "m4", 1, 30)
               + encode_del("/queue/b", "m5", 40))
    asked: list[str] = []

    def held_below(queue: str) -> int:
        asked.append(queue)
        return {"/queue/a": 20, "/queue/b": 0}[queue]

    kept = decode_acks(memoryview(payload), held_below)
    assert kept == [(DEL, "/queue/b", "m3", 0, 12), (DELIVERED, "/queue/a", "m4", 1, 30),
                    (DEL, "/queue/b", "m5", 0, 40)]
    assert asked == ["/queue/a", "/queue/b"]  # once a queue per record
    everything = decode_acks(memoryview(payload))
    assert everything is not None and len(everything) == 5


def _drained_journal(directory: Path) -> None:
    """2,000 messages of a paging queue; a consumer takes 1,700 of them and acknowledges the
    first 1,600 (the other hundred stay delivered, not acknowledged: a start must count
    their deliveries); the segments of the first acknowledged ones go, those of the later
    ones stay (a start must apply those acknowledgements)."""
    async def fill() -> None:
        # segments wholly acknowledged go, no other is rewritten: the acknowledgements stay
        # in the journal, as they do in its newest segments after a long drain
        broker, store = await open_store(directory, compact_ratio=0.01)
        broker.open_session(1, "1.2")
        for i in range(2000):
            broker.send(1, "/queue/q", PERSISTENT, b"%05d" % i + b"." * 400, NOW)
            if i % 50 == 49:
                persist(broker, store)
        await synced(store)
        broker.open_session(2, "1.2")
        broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=1000)
        taken = 0
        for _ in range(100):  # until 1,700 are taken
            if taken >= 1700:
                break
            persist(broker, store)
            deliveries = broker.take_outbox().get(2, [])
            for delivery in deliveries:
                if taken < 1600:
                    broker.ack(2, delivery.ack_id, NOW)
                taken += 1
            persist(broker, store)
            await synced(store)
        assert taken >= 1700, taken
        for _ in range(20):
            await synced(store)
        await close(store)

    run(fill())


def test_a_start_after_a_long_drain_rebuilds_the_same_passing_over_old_acks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = tmp_path / "journal"
    _drained_journal(journal)
    assert list_segments(journal)[0][0] > 1  # the first segments were let go

    decoded = {"kept": 0, "all": 0}
    original = reading.decoding.decode_acks

    def counting(buf: memoryview, held_below=None):  # type: ignore[no-untyped-def]
        kept = original(buf, held_below)
        everything = original(buf)
        if kept is not None and everything is not None:
            decoded["kept"] += len(kept)
            decoded["all"] += len(everything)
        return kept

    monkeypatch.setattr(reading.decoding, "decode_acks", counting)
    passing_over, _ = recovered(copied(journal, tmp_path / "a"))
    assert decoded["all"] > 1000 and 0 < decoded["kept"] < decoded["all"] / 2, decoded

    monkeypatch.setattr(Replay, "held_below", lambda self, queue_key: -1)  # reads them all
    reading_all, _ = recovered(copied(journal, tmp_path / "b"))
    assert passing_over == reading_all
