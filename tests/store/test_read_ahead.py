"""A queue reading a paged backlog that is not in the page cache: once a window is read
back, the journal bytes of the next window are brought into the cache in the background
(store/pages.py `_read_ahead`), so that the next read finds them in memory instead of
holding the event loop on the disk. Real files, the real page cache (mincore)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pairmq.core.broker.paging import PAGE_WINDOW_BYTES
from pairmq.store.segments import list_segments
from tests.support.page_cache import drop, resident
from tests.support.stores import NOW, PERSISTENT, close, persist, run
from tests.support.summaries import open_store

BODY = 4000


@pytest.mark.parametrize("segment_bytes", [64 * 1024 * 1024, 3 * 1024 * 1024],
                         ids=["one-segment", "across-segments"])
def test_reading_a_window_back_brings_the_next_one_into_the_page_cache(
        tmp_path: Path, segment_bytes: int) -> None:
    """With 3 MiB segments, the next window (4 MiB) begins in one segment and ends in the
    next: both parts are brought in."""
    async def fill() -> None:
        broker, store = await open_store(tmp_path, segment_bytes=segment_bytes)
        broker.open_session(1, "1.2")
        for i in range(6000):  # 24 MB, all but the first 60 kB paged
            broker.send(1, "/queue/q", PERSISTENT, b"%06d" % i + b"." * BODY, NOW)
            if i % 100 == 99:
                persist(broker, store)
        await close(store)

    async def read_one_window() -> tuple[float, dict[Path, tuple[int, int]]]:
        broker, store = await open_store(tmp_path, segment_bytes=segment_bytes)
        paths = dict(list_segments(tmp_path))
        for path in paths.values():
            drop(path)
        log = broker.addresses["/queue/q"].log
        q = broker.queues["/queue/q"]
        assert log is not None
        numbers = log.next_numbers(q, 1 << 30, PAGE_WINDOW_BYTES)
        following = range(numbers[-1] + 1, numbers[-1] + 1 + len(numbers))
        assert following[-1] < log.located_end  # the backlog goes on past the next window
        before = max(resident(p, 0, p.stat().st_size) for p in paths.values())
        read = store.pages.page_in(log, numbers)
        assert len(read) == len(numbers)
        spans: dict[Path, tuple[int, int]] = {}  # segment -> the next window's bytes in it
        for n in following:
            segment, offset, length = log.where(n)[:3]
            first, end = spans.get(paths[segment], (offset, offset + length))
            spans[paths[segment]] = (min(first, offset), max(end, offset + length))
        await close(store)
        return before, spans

    run(fill())
    before, spans = run(read_one_window())
    if before > 0.5:
        pytest.skip(f"the data directory's file system keeps files in memory ({before:.0%} "
                    "of a dropped segment still resident: tmpfs?)")
    if segment_bytes < PAGE_WINDOW_BYTES:
        assert len(spans) == 2, spans
    deadline = time.monotonic() + 5
    shares: dict[Path, float] = {}
    while time.monotonic() < deadline:
        shares = {path: resident(path, first, end - first)
                  for path, (first, end) in spans.items()}
        if min(shares.values()) >= 0.95:
            break
        time.sleep(0.05)
    assert min(shares.values()) >= 0.95, f"of the next window in the page cache: {shares}"
