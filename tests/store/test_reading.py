"""Reading a journal ahead while another store appends to it and compacts it (a shared-store
backup), then finishing under the lock: the result is what a start would rebuild."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

from pairmq.core import Broker, CoreSettings
from pairmq.store.segments import list_segments
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from tests.support.journal import broker_snapshot
from tests.support.stores import NOW, PERSISTENT, close, open_broker, persist, synced

SMALL = 48 * 1024  # segments small enough that compaction deletes some during a test


def rebuilt(directory: Path, store: Store | None = None) -> tuple[dict, object]:
    """What `store` (a fresh one by default) recovers from `directory`, as a broker."""
    store = store or Store(directory, StoreSettings(segment_bytes=SMALL))
    replay, report = store.recover()
    broker = Broker(CoreSettings(), id_prefix="ID:r-")
    broker.restore(replay)
    snapshot = broker_snapshot(broker, store)
    snapshot["epochs"], snapshot["last_seq"] = store.epochs, store.appended_seq
    store.close()
    return snapshot, report


async def write_traffic(directory: Path, steps: int, seed: int, between=lambda step: None,
                        destinations=("/queue/work", "/queue/keep", "/topic/news"),
                        acked: float = 0.8) -> None:
    """A broker on `directory` sends, acks (`acked` of the deliveries), subscribes durably
    and drops subscriptions at random; `between(step)` runs after each step, once its
    records are on disk."""
    rng = random.Random(seed)
    broker, store = await open_broker(directory, segment_bytes=SMALL)
    broker.open_session(1, "1.2", client_id="w")
    broker.subscribe(1, "work", "/queue/work", NOW, ack="client-individual", prefetch=50)
    persist(broker, store)
    for step in range(steps):
        for _ in range(rng.randrange(1, 6)):
            destination = rng.choice(destinations)
            headers = dict(PERSISTENT)
            if rng.random() < 0.2:
                headers["dup-id"] = f"d{rng.randrange(50)}"
            broker.send(1, destination, headers, rng.randbytes(rng.randrange(10, 900)), NOW)
            persist(broker, store)
        for delivery in broker.take_outbox().get(1, []):
            if delivery.ack_id is not None and rng.random() < acked:
                broker.ack(1, delivery.ack_id, NOW)
        persist(broker, store)
        if step % 40 == 0:
            name = f"sub{step % 3}"
            if f"w:{name}" in broker.durables:
                broker.unsubscribe(1, name, NOW, delete_durable=True, durable_name=name)
            else:
                broker.subscribe(1, name, "/topic/news", NOW, durable_name=name)
            persist(broker, store)
        await synced(store)
        await asyncio.sleep(0)  # let compaction steps run
        between(step)
    await close(store)


def test_reading_ahead_then_finishing_rebuilds_what_a_start_rebuilds(tmp_path: Path) -> None:
    reader = Store(tmp_path, StoreSettings(segment_bytes=SMALL))
    read = []

    def read_ahead(step: int) -> None:
        if step % 7 == 0:  # in passes of about 4 KiB, as the server reads (of 8 MiB)
            read.append(reader.read_ahead(limit_bytes=4096))

    asyncio.run(write_traffic(tmp_path, 600, seed=1, between=read_ahead))
    assert len(list_segments(tmp_path)) > 1
    ahead, report = rebuilt(tmp_path, reader)
    fresh, _ = rebuilt(tmp_path)
    assert ahead == fresh
    assert sum(len(q) for q in fresh["queues"].values()) > 100, fresh["queues"].keys()
    assert fresh["durables"] and fresh["dups"]
    assert max(read) >= 4096 and report.read_ahead > 0  # some passes stopped at their limit
    assert report.records > report.read_ahead
    assert f"{report.read_ahead} of the records read ahead" in report.describe()


def test_a_reading_that_fell_behind_compaction_starts_again(tmp_path: Path, caplog) -> None:
    """Read once early, then not while the writer compacts away segments the reading had
    not finished: the next pass sees the gap in sequence numbers and reads everything
    again rather than keep messages whose removal it never read."""
    reader = Store(tmp_path, StoreSettings(segment_bytes=SMALL))
    first: list[int] = []

    def read_once(step: int) -> None:
        if step == 3:
            first.append(reader.read_ahead())

    asyncio.run(write_traffic(tmp_path, 900, seed=2, between=read_once,
                              destinations=("/queue/work",), acked=1.0))
    assert first and first[0] > 0
    first_left = list_segments(tmp_path)[0][0]
    assert first_left > 1, "the test needs compaction to have deleted the first segment"
    with caplog.at_level(logging.INFO, logger="pairmq.store"):
        reader.read_ahead()
    assert "Reading the journal again from its start" in caplog.text
    ahead, _ = rebuilt(tmp_path, reader)
    fresh, _ = rebuilt(tmp_path)
    assert ahead == fresh


def test_reading_ahead_never_cuts_a_torn_end_the_final_pass_does(tmp_path: Path) -> None:
    asyncio.run(write_traffic(tmp_path, 30, seed=3))
    _, newest = list_segments(tmp_path)[-1]
    with open(newest, "ab") as f:
        f.write(b"\x40\x00\x00\x00partial record the writer was still writing")
    size = newest.stat().st_size
    reader = Store(tmp_path, StoreSettings(segment_bytes=SMALL))
    reader.read_ahead()
    reader.read_ahead()
    assert newest.stat().st_size == size  # a reading ahead changes no file
    ahead, report = rebuilt(tmp_path, reader)
    assert report.torn_bytes > 0 and newest.stat().st_size < size
    fresh, _ = rebuilt(tmp_path)
    assert ahead == fresh
