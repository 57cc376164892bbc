"""Whether the journal's disk completes writes (store/stall.py): the pure watch, and the
writer reporting a write that does not return, with a real thread held in `_write`."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from pairmq.store.stall import Disk, StallWatch, check_interval
from pairmq.store.writer import JournalWriter


def test_a_write_in_flight_past_the_timeout_is_a_stall_once() -> None:
    watch = StallWatch(5.0)
    assert watch.check(100.0) is None and watch.disk is Disk.IDLE
    watch.began(10.0)
    assert watch.check(14.9) is None and watch.disk is Disk.WRITING
    assert watch.check(15.0) == 5.0 and watch.disk is Disk.STALLED
    assert watch.check(20.0) is None  # said once per stall
    assert watch.view(22.0).in_flight_s == 12.0
    assert watch.ended(40.0) == 30.0  # the stall is over, and how long it lasted
    assert watch.disk is Disk.IDLE and watch.stalls == 1 and watch.longest_s == 30.0
    watch.began(41.0)
    assert watch.ended(41.2) is None  # a write that did not stall
    assert watch.view(50.0).in_flight_s == 0.0


def test_no_timeout_no_stall() -> None:
    watch = StallWatch(0.0)
    watch.began(0.0)
    assert watch.check(1e9) is None


def test_the_check_interval_bounds_how_late_a_stall_is_seen() -> None:
    assert check_interval(5.0) == 0.25
    assert check_interval(0.4) == 0.1


def test_the_writer_reports_a_write_that_does_not_return(tmp_path: Path) -> None:
    """The writer's thread held in a write (as a frozen file system holds it): the event
    loop goes on, the stall is reported after the timeout, and its end once it returns."""
    release = threading.Event()

    def held_in_the_thread() -> bool:
        # The write guard (a shared store's lock check) is asked on the loop, then again in
        # the writer's thread just before it writes: held there, as a frozen disk holds it.
        # (A hook of the writer's own, not a patched method: the compiled build calls its
        # methods directly.)
        if threading.current_thread() is not threading.main_thread():
            release.wait(10)
        return True

    said: list[float | None] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        writer = JournalWriter(tmp_path, 1 << 20, 0, [], loop, stall_timeout_s=0.2)
        writer.guard = held_in_the_thread
        writer.on_stall(said.append)
        synced = asyncio.Event()
        seq, _, _ = writer.append(b"x" * 100, 1)
        writer.when_synced(seq, synced.set)
        await asyncio.sleep(0.5)  # the loop is free meanwhile
        assert len(said) == 1 and said[0] is not None and said[0] >= 0.2
        assert writer.stall_view().disk is Disk.STALLED
        assert not synced.is_set()
        release.set()
        await asyncio.wait_for(synced.wait(), 5)
        assert said[1:] == [None]
        assert writer.stall_view().disk is Disk.IDLE and writer.stall_view().stalls == 1
        writer.close()

    asyncio.run(run())
