"""A backup's store in the test's own process (store/mirror.py), fed an active store's
framed records as the replication stream carries them, and a workload that writes every
kind of record."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pairmq.core import Broker, CoreSettings
from pairmq.store.records import RECORD_HEADER
from pairmq.store.segments import list_segments, read_records
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from tests.support.journal import broker_snapshot
from tests.support.stores import NOW, PERSISTENT, close, open_broker, persist, synced

LIMIT = 60_000  # a destination past it pages: /queue/work and the topic's do


def core(dup_cache_size: int) -> CoreSettings:
    return CoreSettings(dup_cache_size=dup_cache_size, max_size_bytes=LIMIT)


SETTINGS = {"segment_bytes": 32 * 1024, "paging_bytes": 20_000, "compact_ratio": 0.9,
            "paged_beyond": core(0).paged_beyond}


class Backup:
    """A mirror store in its own directory, fed the active's framed records."""

    def __init__(self, directory: Path, dup_cache_size: int, **changed: int) -> None:
        self.settings = core(dup_cache_size)
        self.store = Store(directory, StoreSettings(**{**SETTINGS, **changed}))
        replay, _ = self.store.recover(dup_cache_size)
        self.broker = Broker(self.settings, id_prefix="ID:b-")
        self.broker.restore(replay)
        self.store.open_mirror(asyncio.get_running_loop(), self.broker)
        self.stopped = False

    async def attach(self, active: Store) -> None:
        """What the active's journal holds past ours (on disk), then its live stream."""
        await synced(active)
        for seq, record in existing_records(active.directory, self.store.appended_seq + 1,
                                     active.appended_seq):
            self.take(seq, record)
        assert active.writer is not None
        active.writer.on_append(self.take)

    async def take_over(self, active: Store) -> dict:
        """Once it has everything the active wrote: stop following and serve; what its
        broker holds then (tests/support/journal.py `broker_snapshot`). Both stores end."""
        await synced(active)
        await synced(self.store)
        self.store.serve_mirrored()
        served = broker_snapshot(self.broker, self.store)
        await close(active)
        await close(self.store)
        return served

    def take(self, seq: int, record: bytes) -> None:
        if self.stopped:
            return  # a backup that stopped: the active's stream no longer reaches it
        epoch = RECORD_HEADER.unpack_from(record, 0)[3]
        self.store.append_mirrored([(seq, epoch, record)])


async def active_and_backup(directory: Path, dup_cache_size: int
                            ) -> tuple[Broker, Store, Backup]:
    """An active broker and store in epoch 1 (`directory`/active) and a backup
    (`directory`/backup) following its stream from the start."""
    broker, store = await open_broker(directory / "active", **SETTINGS)
    broker.settings = core(dup_cache_size)
    store.begin_epoch(1)
    backup = Backup(directory / "backup", dup_cache_size)
    await backup.attach(store)
    return broker, store, backup


async def workload(broker: Broker, store: Store, rounds: int) -> None:
    """Queues, a durable subscription, dup-ids past the cache, producer sequences over
    several epochs, a transaction committed and one left open, acked and unacked
    deliveries, a deleted durable, enough to compact."""
    broker.open_session(1, "1.2", client_id="c")
    broker.subscribe(1, "d", "/topic/t", NOW, durable_name="keep", ack="client")
    broker.subscribe(1, "e", "/topic/t", NOW, durable_name="drop")
    persist(broker, store)
    broker.unsubscribe(1, "d", NOW)
    broker.unsubscribe(1, "e", NOW)
    broker.close_session(1, NOW)
    persist(broker, store)
    broker.open_session(2, "1.2")
    broker.subscribe(2, "w", "/queue/work", NOW, ack="client-individual", prefetch=100)
    numbers: dict[tuple[str, int], int] = {}  # producer sequences: (producer, epoch) -> next
    for i in range(rounds):
        body = b"%05d" % i + b"." * 900
        broker.send(2, "/queue/work", {**PERSISTENT, "dup-id": f"w{i}"}, body, NOW)
        producer, epoch = f"p{i % 7}", i // 100
        seq = numbers.get((producer, epoch), 0)
        numbers[(producer, epoch)] = seq + 1
        broker.send(2, "/queue/stamped", {**PERSISTENT, "pairmq-producer": producer,
                                          "pairmq-producer-epoch": str(epoch),
                                          "pairmq-seq": str(seq)}, b"s%d" % i, NOW + i)
        if i % 4 == 0:
            broker.send(2, "/queue/keep", {**PERSISTENT, "priority": str(i % 3 * 4)}, body,
                        NOW)
        broker.send(2, "/topic/t", PERSISTENT, body, NOW)
        persist(broker, store)
        deliveries = broker.take_outbox().get(2, [])
        for d in deliveries:
            if i % 10:  # every tenth stays unacked (delivered: redelivered after a failover)
                broker.ack(2, d.ack_id, NOW)
        persist(broker, store)
        if i % 40 == 39:
            broker.open_session(3, "1.2")
            broker.begin(3, "tx")
            broker.send(3, "/queue/keep", PERSISTENT, b"committed %d" % i, NOW, transaction="tx")
            broker.commit(3, "tx", NOW)
            broker.begin(3, "open")
            broker.send(3, "/queue/keep", PERSISTENT, b"never", NOW, transaction="open")
            persist(broker, store)
            broker.close_session(3, NOW)
            persist(broker, store)
        if i == rounds // 2:
            broker.open_session(4, "1.2", client_id="c")
            broker.unsubscribe(4, None, NOW, delete_durable=True, durable_name="drop")
            persist(broker, store)
            broker.close_session(4, NOW)
        if i % 25 == 0:
            await synced(store)
            await asyncio.sleep(0.005)  # let compaction steps run
    for _ in range(20):
        await synced(store)
        await asyncio.sleep(0.005)


def existing_records(directory: Path, first: int, upto: int) -> list[tuple[int, bytes]]:
    """The framed records first..upto of a journal, as a synchronisation sends them."""
    out = []
    for segment_id, path in list_segments(directory):
        for record in read_records(path, segment_id, first, upto):
            out.append((RECORD_HEADER.unpack_from(record, 0)[2], record))
    return out
