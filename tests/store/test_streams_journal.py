"""Streams in the journal: retention's removals let compaction drop old segments, and a
restart and a backup following the records both rebuild the same offsets, bodies (read
back from the journal: a stream keeps an object only for its newest records) and group
offsets."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pairmq.core import Broker, CoreSettings
from pairmq.core.settings import Retention
from pairmq.core.stream_log import HOT
from pairmq.store.segments import list_segments
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from tests.support.mirror import Backup
from tests.support.stores import NOW, close, persist, synced

STORE = {"segment_bytes": 32 * 1024, "compact_ratio": 0.9}
CORE = CoreSettings(stream_retention=Retention(max_bytes=20_000))
S = "/stream/log"


async def open_stream_broker(directory: Path) -> tuple[Broker, Store]:
    store = Store(directory, StoreSettings(**STORE))
    replay, _ = store.recover()
    broker = Broker(CORE, id_prefix="ID:s-")
    broker.restore(replay)
    store.start(broker, asyncio.get_running_loop())
    return broker, store


def snapshot(broker: Broker, store: Store) -> dict:
    """Offsets, bytes, groups and every record held (read back from the journal: a
    stream keeps an object only for its newest HOT records, none after a restart)."""
    log = broker.streams[S]
    assert log.status()["in_memory"] <= HOT
    assert log.log.located_end == log.next  # every record on disk
    records = store.read_stream(log.log, list(range(log.first, log.next)))
    return {"first": log.first, "next": log.next, "bytes": log.bytes,
            "groups": dict(log.groups),
            "messages": [(m.headers["x-stream-offset"], m.body) for m in records]}


def test_retention_compaction_restart_and_a_backup_agree(tmp_path):
    active_dir, backup_dir = tmp_path / "active", tmp_path / "backup"

    async def go() -> tuple[dict, dict, int]:
        broker, store = await open_stream_broker(active_dir)
        backup = Backup(backup_dir, 20000)
        backup.broker = Broker(CORE, id_prefix="ID:b-")  # the same retention settings
        backup.broker.restore(backup.store.recover()[0])
        backup.store.open_mirror(asyncio.get_running_loop(), backup.broker)
        await backup.attach(store)
        broker.open_session(1, "1.2")
        for i in range(1500):
            broker.send(1, S, {}, b"%05d" % i + b"." * 400, NOW + i)
            if i % 300 == 299:
                broker.send(1, S, {"x-stream-group": "g", "x-stream-commit-offset": str(i)},
                            b"", NOW)
            persist(broker, store)
            if i % 50 == 0:
                await synced(store)
                await asyncio.sleep(0.002)  # compaction steps
        for _ in range(20):
            await synced(store)
            # the server's tick: retention removes only records on disk, those the last
            # appends' retention could not
            broker.retain_streams(NOW + 1500)
            persist(broker, store)
            await asyncio.sleep(0.005)
        served = snapshot(broker, store)
        backup.store.serve_mirrored()
        followed = snapshot(backup.broker, backup.store)
        await close(store)
        await close(backup.store)
        return served, followed, len(list_segments(active_dir))

    served, followed, segments = asyncio.run(go())
    assert served["next"] == 1500 and served["first"] > 1000
    assert served["bytes"] <= 20_000
    assert served["groups"] == {"g": 1499}
    assert served["messages"][-1] == ("1499", b"01499" + b"." * 400)
    # A message read back from the journal is sized from its encoded form (id and
    # destination included), a little more than when it was sent: bytes may differ.
    assert {**followed, "bytes": 0} == {**served, "bytes": 0}
    assert segments <= 4, f"{segments} segments: retention's removals were not compacted"

    async def restart() -> dict:
        broker, store = await open_stream_broker(active_dir)
        again = snapshot(broker, store)
        await close(store)
        return again

    assert asyncio.run(restart()) == followed


def test_a_message_added_and_removed_in_one_group_is_not_left_live(tmp_path):
    """An auto-ack consumer takes a message in the read that sent it (ADD and DEL in one
    record group): nothing may keep it live, or compaction would copy it back to life."""

    async def go() -> int:
        broker, store = await open_stream_broker(tmp_path)
        broker.open_session(1, "1.2")
        broker.subscribe(1, "s", "/queue/q", NOW)
        broker.send(1, "/queue/q", {"persistent": "true"}, b"taken at once", NOW)
        persist(broker, store)
        assert broker.take_outbox()[1][0].entry.message.journal_seq > 0  # still gated
        live = [obj for info in store.writer.segments.values() for obj in info.live
                if not isinstance(obj, tuple)]
        await close(store)
        return len(live)

    assert asyncio.run(go()) == 0
