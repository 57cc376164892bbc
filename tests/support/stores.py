"""A journal and a broker in the test's own process, for the tests of the store: open
them, journal what the broker changed, wait for the sync, close."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pairmq.core import Broker, CoreSettings
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store

NOW = 1_700_000_000_000
PERSISTENT = {"persistent": "true"}


def run(coro):
    return asyncio.run(coro)


async def open_broker(directory: Path, **settings) -> tuple[Broker, Store]:
    store = Store(directory, StoreSettings(**settings))
    replay, _ = store.recover()
    broker = Broker(CoreSettings(), id_prefix="ID:t-")
    broker.restore(replay)
    store.start(broker, asyncio.get_running_loop())
    return broker, store


async def synced(store: Store) -> None:
    done = asyncio.get_running_loop().create_future()
    store.when_synced(store.appended_seq, lambda: done.done() or done.set_result(None))
    await asyncio.wait_for(done, 10)


def persist(broker: Broker, store: Store) -> None:
    """Journal what the broker changed, and read back the windows paging queues and
    stream readers asked for (as the server's role does after every read)."""
    if broker.records:
        store.persist(broker.take_records())
    for q, log, numbers in broker.take_page_wanted():
        broker.paged_in(q, numbers, store.page_in(log, numbers, q.key or ""), NOW)
    for cursor, offsets in broker.take_stream_reads(1 << 30):
        broker.stream_read(cursor, offsets, store.read_stream(cursor.stream.log, offsets))
    for log in broker.take_moved_logs():
        store.release_paged(log)
    if broker.records:
        store.persist(broker.take_records())


async def close(store: Store) -> None:
    await synced(store)
    store.close()


def journal_groups(directory: Path, groups: list[list[bytes]]) -> None:
    """Persistent SENDs to /queue/q, a group at a time: each group's records are appended
    without waiting, then the sync of all of them is waited for (one group commit, unless
    the writer was already busy). The store is closed at the end."""

    async def go() -> None:
        broker, store = await open_broker(directory)
        broker.open_session(1, "1.2")
        for group in groups:
            for body in group:
                broker.send(1, "/queue/q", PERSISTENT, body, NOW)
                persist(broker, store)
            await synced(store)
        await close(store)

    run(go())


def queue_bodies(broker: Broker, name: str) -> list[bytes]:
    q = broker.queues.get(name)
    return [e.message.body for e in q.entries()] if q else []


async def churn(broker: Broker, store: Store, count: int, session: int = 99) -> None:
    """`count` messages of 500 bytes sent to /queue/work and acknowledged at once (by a
    session of their own), then time for compaction: the segments that held only them go
    away, the older ones' live records are rewritten at the head."""
    broker.open_session(session, "1.2")
    broker.subscribe(session, "s", "/queue/work", NOW, ack="client-individual")
    persist(broker, store)
    for i in range(count):
        broker.send(session, "/queue/work", PERSISTENT, b"x" * 500, NOW)
        persist(broker, store)
        for d in broker.take_outbox().get(session, []):
            broker.ack(session, d.ack_id, NOW)
        persist(broker, store)
        if i % 100 == 0:
            await synced(store)
            await asyncio.sleep(0)
    for _ in range(20):
        await synced(store)
        await asyncio.sleep(0.01)
