"""The event loop's lag (server/loop_lag.py), on a real loop: a turn held by blocking work
is measured, logged with where it was busy, and counted in the histogram."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from pairmq.server.loop_lag import LoopWatch


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a long decision or a synchronous read would do


def observed(watch: LoopWatch, above: float) -> float:
    """How many loop lags /metrics counts above `above` seconds."""
    total = below = 0.0
    for metric in watch.metrics():
        if metric.name != "pairmq_event_loop_lag_seconds":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                total += sample.value
            elif sample.name.endswith("_bucket") and float(sample.labels["le"]) == above:
                below += sample.value
    return total - below


def test_a_held_turn_is_measured_and_logged_with_where_it_was_busy(caplog) -> None:
    async def go() -> LoopWatch:
        watch = LoopWatch(asyncio.get_running_loop())
        watch.start()
        await asyncio.sleep(0.2)  # quiet: nothing to report
        asyncio.get_running_loop().call_soon(hold_the_loop, 0.4)
        await asyncio.sleep(0.3)
        watch.stop()
        return watch

    with caplog.at_level(logging.WARNING, logger="pairmq.server"):
        watch = asyncio.run(go())
    reports = [r.getMessage() for r in caplog.records if "event loop was held" in r.getMessage()]
    assert len(reports) == 1, reports
    assert "busy in" in reports[0] and "hold_the_loop" in reports[0], reports[0]
    assert 0.35 < watch.longest < 1.0
    assert observed(watch, 0.25) == 1


def test_a_garbage_collection_is_timed_by_generation() -> None:
    async def go() -> LoopWatch:
        watch = LoopWatch(asyncio.get_running_loop())
        watch.start()
        gc.collect(2)
        watch.stop()
        return watch

    watch = asyncio.run(go())
    counts = {s.labels["generation"]: s.value for m in watch.metrics()
              if m.name == "pairmq_gc_pause_seconds"
              for s in m.samples if s.name.endswith("_count")}
    assert counts.get("2", 0) >= 1


def test_looking_at_a_held_loop_keeps_none_of_its_buffers_alive(tmp_path) -> None:
    """A recovery reads segments through an mmap and closes it at the end: the watchdog,
    which looked at the loop meanwhile, must not hold a frame whose memoryview would make
    the close fail ("cannot close exported pointers exist")."""
    import mmap

    path = tmp_path / "segment"
    path.write_bytes(b"x" * 4096)

    def decode(view: memoryview) -> int:
        record = view[:100]  # a local of the frame the watchdog sees
        time.sleep(0.3)
        return len(record)

    def read_segment() -> None:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            whole = memoryview(data)
            decode(whole)
            whole.release()
            data.close()

    async def go() -> None:
        watch = LoopWatch(asyncio.get_running_loop())
        watch.start()
        await asyncio.sleep(0.1)
        read_segment()
        await asyncio.sleep(0.1)
        watch.stop()

    asyncio.run(go())
