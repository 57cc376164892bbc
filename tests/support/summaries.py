"""Journals with segment summaries (store/summary.py), made by a real Store and its writer
thread, and what a start rebuilds from them: for tests/store/test_summary*.py and the
process tests/support/summary_writer.py runs (and kills)."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from pathlib import Path

from pairmq.core import Broker, CoreSettings
from pairmq.core.settings import Retention
from pairmq.store.records import RECORD_HEADER
from pairmq.store.recovery import RecoveryReport
from pairmq.store.segments import list_segments, scan_segment
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from pairmq.store.summary import SegmentSummary, decode_summary, encode_summary
from tests.support.journal import broker_snapshot, streams_snapshot
from tests.support.mirror import LIMIT, Backup
from tests.support.stores import NOW, PERSISTENT, close, persist, run, synced

CORE = CoreSettings(dup_cache_size=50, max_size_bytes=LIMIT,
                    stream_retention=Retention(max_bytes=400_000))
SETTINGS = {"segment_bytes": 32 * 1024, "paging_bytes": 20_000, "compact_ratio": 0.9,
            "paged_beyond": CORE.paged_beyond}


def settings(**changed: int | float) -> StoreSettings:
    return StoreSettings(**{**SETTINGS, **changed})


async def open_store(directory: Path, **changed: int) -> tuple[Broker, Store]:
    store = Store(directory, settings(**changed))
    replay, _ = store.recover(50)
    broker = Broker(CORE, id_prefix="ID:t-")
    broker.restore(replay)
    store.start(broker, asyncio.get_running_loop())
    return broker, store


async def more_traffic(broker: Broker, store: Store) -> None:
    """After `workload`: records of many new messages each (a batch; half of them with
    dup-ids, past the cache's 50), a stream with its retention and a consumer group, and
    new messages for a durable topic subscription."""
    broker.open_session(9, "1.2", client_id="s")
    broker.subscribe(9, "t", "/topic/many", NOW, durable_name="one")
    broker.subscribe(9, "u", "/topic/many", NOW, durable_name="two")
    broker.unsubscribe(9, "t", NOW)
    broker.unsubscribe(9, "u", NOW)
    persist(broker, store)
    for i in range(3000):
        if i % 500 == 250:  # a record of new messages for several destinations
            broker.send(9, "/queue/batch", PERSISTENT, b"mixed", NOW)
            broker.send(9, "/topic/many", PERSISTENT, b"mixed", NOW)
            persist(broker, store)
        headers = {**PERSISTENT, "dup-id": f"b{i}"} if i < 1500 else PERSISTENT
        broker.send(9, "/queue/batch", headers, b"%06d" % i + b"b" * 300, NOW)
        if i % 50 == 49:  # records of 50 messages (as a batch SEND writes them), each kind
            persist(broker, store)
            for k in range(i - 49, i + 1):
                broker.send(9, "/stream/s", {}, b"%06d" % k + b"s" * 200, NOW + k)
            persist(broker, store)
            for k in range(i - 49, i + 1, 3):
                broker.send(9, "/topic/many", PERSISTENT, b"%06d" % k + b"t" * 200, NOW)
            persist(broker, store)
        if i % 1000 == 999:
            broker.send(9, "/stream/s", {"x-stream-group": "g",
                                         "x-stream-commit-offset": str(i)}, b"", NOW)
            persist(broker, store)
            await synced(store)
    persist(broker, store)
    await synced(store)


def a_backup_follows_more_traffic(root: Path, **changed: int) -> Path:
    """An active store (root/active) and a backup mirroring it (root/backup) through
    `more_traffic`, both closed; the backup's journal directory."""
    async def go() -> None:
        broker, store = await open_store(root / "active", **changed)
        store.begin_epoch(1)
        backup = Backup(root / "backup", 50, **changed)
        backup.broker = Broker(CORE, id_prefix="ID:b-")
        backup.broker.restore(backup.store.recover(50)[0])
        backup.store.open_mirror(asyncio.get_running_loop(), backup.broker)
        await backup.attach(store)
        await more_traffic(broker, store)
        await synced(backup.store)
        await close(store)
        await close(backup.store)

    run(go())
    return root / "backup"


def begin_mixed(broker: Broker, store: Store) -> None:
    """The sessions `mixed_traffic` sends and consumes with (again after a restart)."""
    broker.open_session(1, "1.2", client_id="mixed")
    broker.subscribe(1, "w", "/queue/work", NOW, ack="client-individual", prefetch=1000)
    broker.subscribe(1, "d", "/topic/mixed", NOW, durable_name="kept", ack="client")
    broker.unsubscribe(1, "d", NOW)
    persist(broker, store)


async def mixed_traffic(broker: Broker, store: Store, rounds: int, first: int = 0) -> None:
    """After `begin_mixed`: segments of many items of every kind. Each round journals a
    batch of new messages for a paging queue (half with dup-ids), one with its producer's
    sequence for another, a stream's batch, a message for a durable topic subscription,
    and a consumer's messages and acknowledgements (records a start reads one by one)."""
    for i in range(first, first + rounds):
        for k in range(6):
            headers = {**PERSISTENT, "dup-id": f"m{i}-{k}"} if k % 2 else PERSISTENT
            broker.send(1, "/queue/backlog", headers, b"%06d-%d" % (i, k) + b"b" * 150, NOW)
        persist(broker, store)
        broker.send(1, "/queue/stamped", {**PERSISTENT, "pairmq-producer": f"p{i % 3}",
                                          "pairmq-producer-epoch": "1",
                                          "pairmq-seq": str(i // 3)}, b"s%d" % i, NOW)
        persist(broker, store)
        for k in range(4):
            broker.send(1, "/stream/mixed", {}, b"%06d-%d" % (i, k) + b"s" * 80, NOW + i)
        persist(broker, store)
        broker.send(1, "/topic/mixed", PERSISTENT, b"t%d" % i + b"t" * 100, NOW)
        broker.send(1, "/queue/work", PERSISTENT, b"w%d" % i + b"w" * 100, NOW)
        persist(broker, store)
        for delivery in broker.take_outbox().get(1, []):
            if i % 5:  # every fifth stays delivered and unacknowledged
                broker.ack(1, delivery.ack_id, NOW)
        persist(broker, store)
        if i % 20 == 19:
            await synced(store)
    await synced(store)


def mixed_journal(directory: Path, rounds: int, **changed: int) -> None:
    """A journal of `mixed_traffic`, its writer closed."""
    async def fill() -> None:
        broker, store = await open_store(directory, **changed)
        store.begin_epoch(1)
        begin_mixed(broker, store)
        await mixed_traffic(broker, store, rounds)
        await close(store)

    run(fill())


def recovered(directory: Path) -> tuple[dict, RecoveryReport]:
    """What a start rebuilds from the journal in `directory` (it may cut a torn tail and
    remove summaries it does not use, as a start does)."""
    return asyncio.run(started_from(Store(directory, settings())))


async def started_from(store: Store) -> tuple[dict, RecoveryReport]:
    """What a start of `store` rebuilds (after any reading ahead), its writer closed."""
    replay, report = store.recover(50)
    broker = Broker(CORE, id_prefix="ID:r-")
    broker.restore(replay)
    store.start(broker, asyncio.get_running_loop())
    snapshot = broker_snapshot(broker, store)
    snapshot["streams"] = streams_snapshot(broker, store)
    snapshot["epochs"], snapshot["last_seq"] = store.epochs, store.appended_seq
    await close(store)
    return snapshot, report


def without_summaries(directory: Path) -> None:
    """Every summary gone, and a `.tmp` one too: a start reads every record."""
    for path in directory.glob("journal-*.sum*"):
        path.unlink()


def copied(source: Path, target: Path, summaries: bool = True) -> Path:
    """A copy of a journal directory (a start changes the files it reads)."""
    shutil.copytree(source, target)
    if not summaries:
        without_summaries(target)
    return target


def full_replay(directory: Path, scratch: Path) -> dict:
    """What a start rebuilds from the journal in `directory` without any summary (read
    from a copy: `directory` is left as it is)."""
    shutil.rmtree(scratch, ignore_errors=True)
    return recovered(copied(directory, scratch, summaries=False))[0]


def item_offsets(summary: SegmentSummary) -> list[int]:
    """Where each item begins in the encoded summary, then where its checksum does."""
    def encoded(count: int) -> int:
        part = SegmentSummary(summary.segment_id, summary.first_seq, summary.last_seq,
                              summary.size, summary.last_start, summary.items[:count])
        return len(encode_summary(part)) - 4  # the head's item count is fixed-size
    return [encoded(count) for count in range(len(summary.items) + 1)]


def record_starts(path: Path) -> list[int]:
    """Where each record of a segment begins, then where the last one ends."""
    starts: list[int] = []

    def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int) -> None:
        starts.append(offset - RECORD_HEADER.size)

    segment_id = int(path.name[8:16])
    scan = scan_segment(segment_id, path, visit)
    return [*starts, scan.valid_end]


def sealed_with_summaries(directory: Path) -> list[Path]:
    """The segments that have a summary beside them, oldest first."""
    return [path for _, path in list_segments(directory)
            if path.with_suffix(".sum").exists()]


def covered(segment: Path) -> int:
    """How many bytes of `segment` the summary beside it covers (prefix summaries: less
    than the file)."""
    return decode_summary(segment.with_suffix(".sum").read_bytes()).size


SAID = re.compile(r"The summary of journal segment (\d+) ")


def started(directory: Path, caplog) -> tuple[dict, RecoveryReport, dict[int, list[str]]]:
    """A start on `directory`: what it recovered, and its warnings about summaries by
    segment id."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pairmq.store"):
        snapshot, report = recovered(directory)
    return snapshot, report, summary_warnings(caplog)


def summary_warnings(caplog) -> dict[int, list[str]]:
    """The warnings about summaries `caplog` holds, by segment id."""
    said: dict[int, list[str]] = {}
    for record in caplog.records:
        found = SAID.match(record.getMessage())
        if found:
            assert record.levelno == logging.WARNING
            said.setdefault(int(found.group(1)), []).append(record.getMessage())
    return said


def fresh(source: Path, target: Path) -> Path:
    """A copy of a journal directory at `target` (anything there before removed)."""
    shutil.rmtree(target, ignore_errors=True)
    return copied(source, target)


def summaries_of(directory: Path) -> dict[int, bytes]:
    return {int(path.name[8:16]): path.read_bytes()
            for path in sorted(directory.glob("journal-*.sum"))}
