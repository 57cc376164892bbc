"""A backup's store and broker follow the active's records as they arrive: when it stops
following, the broker holds exactly what recovery from its journal builds (queues in
order, delivery counts, durable subscriptions, dup-ids, paged bodies, the messages kept
only in paged logs), through compaction, the active's horizon and a full
resynchronisation. Real journal files on both sides."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pairmq.core import Broker
from pairmq.store.records import RECORD_HEADER
from pairmq.store.segments import list_segments
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from tests.support.journal import broker_snapshot, content_only
from tests.support.mirror import (
    SETTINGS,
    Backup,
    active_and_backup,
    core,
    existing_records,
    workload,
)
from tests.support.stores import (
    NOW,
    PERSISTENT,
    close,
    open_broker,
    persist,
    queue_bodies,
    synced,
)


def recovered(directory: Path, dup_cache_size: int) -> dict:
    async def go():
        store = Store(directory, StoreSettings(**SETTINGS))
        replay, _ = store.recover(dup_cache_size)
        broker = Broker(core(dup_cache_size), id_prefix="ID:r-")
        broker.restore(replay)
        store.start(broker, asyncio.get_running_loop())
        snapshot = broker_snapshot(broker, store)
        await close(store)
        return snapshot

    return asyncio.run(go())


def test_a_backup_following_the_stream_holds_what_recovery_of_its_journal_builds(tmp_path):
    dups = 50

    async def go():
        broker, store, backup = await active_and_backup(tmp_path, dups)
        horizon = []
        store.writer.on_synced(lambda _seq: horizon.append(store.oldest_seq))
        await workload(broker, store, 400)
        await synced(backup.store)
        assert list_segments(tmp_path / "active")[0][0] > 3, "the active did not compact"
        # The active may still drop a segment after its last sync callback: let it settle,
        # then pass on the horizon it would announce next.
        while True:
            before = store.oldest_seq
            await synced(store)
            await asyncio.sleep(0.02)
            if store.oldest_seq == before:
                break
        horizon.append(store.oldest_seq)
        backup.store.drop_below(horizon[-1])
        assert backup.store.oldest_seq == store.oldest_seq
        paged = backup.store.paged.total + backup.store.pages.bytes  # bodies, whole messages
        backup.store.serve_mirrored()
        served = broker_snapshot(backup.broker, backup.store)
        logs = sum(log.waiting(q) for a in backup.broker.addresses.values()
                   if (log := a.log) is not None for q in log.cursors)
        await close(store)
        await close(backup.store)
        return served, paged, logs

    served, paged, backup_logs = asyncio.run(go())
    assert paged > 100_000, "the backup kept every body in memory"
    assert backup_logs > 0, "the backup kept no message in a paged log"
    expected = recovered(tmp_path / "backup", dups)
    assert_same(served, expected)
    assert_same(served, recovered(tmp_path / "active", dups))
    assert len(served["queues"]["/queue/keep"]) > 100
    assert set(served["durables"]) == {"c:keep"}
    assert [p for p, *_ in served["producers"]["/queue/stamped"]] == [
        f"p{i % 7}" for i in range(393, 400)], "least recently active first"
    assert served["producers"]["/queue/stamped"][-1][1:3] == (3, 14)  # p0: epoch 3, 0 to 14
    assert any(e[2] > 0 for e in served["queues"]["/queue/work"])  # unacked: redelivered


def test_a_full_resynchronisation_resets_the_backup_broker(tmp_path):
    dups = 50

    async def go():
        broker, store, backup = await active_and_backup(tmp_path, dups)
        await workload(broker, store, 60)  # the backup follows a first history
        await synced(backup.store)
        await close(store)
        # The active is replaced by another one (its journal compacted: another history)
        other, store = await open_broker(tmp_path / "other", **SETTINGS)
        other.settings = core(dups)
        store.begin_epoch(2)
        await workload(other, store, 200)
        await synced(store)
        first = store.oldest_seq
        assert first > 1, "the other active did not compact: no copies to follow"
        backup.store.wipe(first, asyncio.get_running_loop())
        await backup.attach(store)
        other.open_session(9, "1.2")
        other.send(9, "/queue/after", PERSISTENT, b"after the copy", NOW)
        persist(other, store)
        return await backup.take_over(store)

    served = asyncio.run(go())
    assert_same(served, recovered(tmp_path / "backup", dups))
    assert_same(served, recovered(tmp_path / "other", dups))
    assert [e[:3] for e in served["queues"]["/queue/after"]] == [(b"after the copy", 4, 0)]


def test_a_backup_follows_turns_of_messages_handed_to_a_consumer_as_they_arrive(tmp_path):
    """The record a pair writes most under a consumer that keeps up: a turn's SENDs, each
    added and handed to the consumer at once (ADD and DELIVERED by turns), with their
    producers' sequences, and some acknowledged in the same turn (store/mirror.py
    `_follow_adds`). Served, the backup holds what recovery of either journal builds: the
    unacknowledged ones redelivered, the producers' sequences, nothing acknowledged."""
    dups = 50

    async def go():
        broker, store, backup = await active_and_backup(tmp_path, dups)
        broker.open_session(2, "1.2")
        broker.subscribe(2, "f", "/queue/fast", NOW, ack="client-individual", prefetch=1000)
        numbers = [0, 0]  # each producer's next sequence
        for turn in range(120):
            for k in range(5):
                numbers[k % 2] += 1
                broker.send(2, "/queue/fast", {**PERSISTENT, "pairmq-producer": f"p{k % 2}",
                                               "pairmq-producer-epoch": "1",
                                               "pairmq-seq": str(numbers[k % 2])},
                            b"%d.%d" % (turn, k), NOW + turn * 5 + k)  # seen: no ties
            deliveries = broker.take_outbox().get(2, [])
            assert len(deliveries) == 5
            for d in deliveries[:2 if turn % 3 else 5]:  # the rest stay unacknowledged
                broker.ack(2, d.ack_id, NOW)
            persist(broker, store)
            if turn % 10 == 0:
                await synced(store)
        return await backup.take_over(store)

    served = asyncio.run(go())
    assert_same(served, recovered(tmp_path / "backup", dups))
    assert_same(served, recovered(tmp_path / "active", dups))
    waiting = served["queues"]["/queue/fast"]
    assert len(waiting) == 80 * 3  # two of five acknowledged in 80 turns, five in 40
    assert all(e[1:3] == (4, 1) for e in waiting), "delivered once: redelivered now"
    assert [p for p, *_ in served["producers"]["/queue/fast"]] == ["p1", "p0"]


def test_a_mirrored_batch_goes_to_the_disk_before_it_is_applied(tmp_path):
    """A backup hands a chunk of the active's records to its writer thread first and
    applies them while they are written and synced: its acknowledgement waits for the
    sync, and no longer for the apply as well. It still follows the apply: the sync is
    reported on the loop, after the whole chunk is applied."""

    async def go():
        broker, store = await open_broker(tmp_path / "active", **SETTINGS)
        store.begin_epoch(1)
        broker.open_session(1, "1.2")
        for i in range(20):
            broker.send(1, "/queue/batch", PERSISTENT, b"%02d" % i, NOW)
        persist(broker, store)
        await synced(store)
        backup = Backup(tmp_path / "backup", 0)
        records = [(seq, RECORD_HEADER.unpack_from(record, 0)[3], record)
                   for seq, record in existing_records(store.directory, 1, store.appended_seq)]
        writer = backup.store.writer
        assert writer is not None
        held_when_written: list[int] = []
        synced_after: list[int] = []

        def guard() -> bool:  # asked on the loop as the group is handed to the thread
            if not held_when_written:
                held_when_written.append(len(queue_bodies(backup.broker, "/queue/batch")))
            return True

        writer.guard = guard
        writer.when_synced(records[-1][0], lambda: synced_after.append(
            len(queue_bodies(backup.broker, "/queue/batch"))))
        backup.store.append_mirrored(records)
        applied = len(queue_bodies(backup.broker, "/queue/batch"))
        await synced(backup.store)
        await close(store)
        await close(backup.store)
        return held_when_written, applied, synced_after

    held_when_written, applied, synced_after = asyncio.run(go())
    assert held_when_written == [0], "the batch was written only after it was applied"
    assert applied == 20
    assert synced_after == [20]


def assert_same(served: dict, expected: dict) -> None:
    """Equal, but for the bytes a destination holds: a message's size counts its record's
    metadata, and a compaction copy lists fewer queues than the record it replaced, so
    it depends on which copy was read (the backup read the first, recovery the last)."""
    served, expected = content_only(served), content_only(expected)
    sizes, expected_sizes = served.pop("sizes"), expected.pop("sizes")
    assert served == expected
    assert sizes.keys() == expected_sizes.keys()
    for name, size in sizes.items():
        assert abs(size - expected_sizes[name]) <= 0.01 * expected_sizes[name], (name, size)
