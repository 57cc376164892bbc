"""A queue reading a paged backlog that is not in the page cache: once a window is read
back, the journal bytes of the next window are brought into the cache in the background
(store/pages.py `_read_ahead`), so that the next read finds them in memory instead of
holding the event loop on the disk. Real files, the real page cache (mincore)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pairmq.core import Broker, CoreSettings
from pairmq.core.broker.paging import PAGE_WINDOW_BYTES
from pairmq.store.segments import list_segments
from pairmq.store.settings import StoreSettings
from pairmq.store.store import Store
from tests.store.test_journal import NOW, PERSISTENT, close, persist, run
from tests.support.page_cache import drop, resident

CORE = CoreSettings(max_size_bytes=256 * 1024)
BODY = 4000


async def _start(directory: Path) -> tuple[Broker, Store]:
    store = Store(directory, StoreSettings(paged_beyond=CORE.paged_beyond))
    replay, _ = store.recover()
    broker = Broker(CORE, id_prefix="ID:t-")
    broker.restore(replay)
    store.start(broker, asyncio.get_running_loop())
    return broker, store


def test_reading_a_window_back_brings_the_next_one_into_the_page_cache(tmp_path: Path
                                                                        ) -> None:
    async def fill() -> None:
        broker, store = await _start(tmp_path)
        broker.open_session(1, "1.2")
        for i in range(6000):  # 24 MB, all but the first 256 KiB paged
            broker.send(1, "/queue/q", PERSISTENT, b"%06d" % i + b"." * BODY, NOW)
            if i % 100 == 99:
                persist(broker, store)
        await close(store)

    async def read_one_window() -> tuple[Path, float, list[tuple[int, int]]]:
        broker, store = await _start(tmp_path)
        (segment,) = [p for _, p in list_segments(tmp_path) if p.stat().st_size > 1 << 20]
        drop(segment)
        log = broker.addresses["/queue/q"].log
        q = broker.queues["/queue/q"]
        assert log is not None
        numbers = log.next_numbers(q, 1 << 30, PAGE_WINDOW_BYTES)
        following = range(numbers[-1] + 1, numbers[-1] + 1 + len(numbers))
        assert following[-1] < log.located_end  # the backlog goes on past the next window
        before = resident(segment, 0, segment.stat().st_size)
        read = store.pages.page_in(log, numbers)
        assert len(read) == len(numbers)
        spans = [log.where(n)[1:3] for n in (following[0], following[-1])]
        await close(store)
        return segment, before, spans

    run(fill())
    segment, before, ((start, _), (last, length)) = run(read_one_window())
    if before > 0.5:
        pytest.skip(f"the data directory's file system keeps files in memory ({before:.0%} "
                    "of a dropped segment still resident: tmpfs?)")
    deadline = time.monotonic() + 5
    while (share := resident(segment, start, last + length - start)) < 0.95 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert share >= 0.95, f"only {share:.0%} of the next window is in the page cache"
