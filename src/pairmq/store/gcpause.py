"""Pausing the garbage collector while a start builds millions of long-lived objects.

Each collection would scan every one of them again (about 40% of a million-message
recovery); after recovery they are frozen, so later collections skip them too.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
    """No collection inside; with freeze, what was built is kept out of all later ones."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


YOUNG_THRESHOLD = 20_000  # allocations between two collections of the youngest objects


def collect_young_less_often() -> None:
    """Collect the youngest generation every YOUNG_THRESHOLD allocations instead of 700.

    A broker allocates a few objects per message (the message, its queue entry, a journal
    record), most of them long-lived until consumed; at 700 the collector ran about every
    150 messages and, with 200,000 messages waiting, doubled the core's cost of taking a
    message (13.5 against 7 µs, docs/benchmarks.md). Refcounting still frees everything
    but cycles at once; older generations keep their thresholds."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def report_slow_collections(threshold_s: float, report) -> None:
    """Call `report(generation, seconds)` after every collection that took longer than
    `threshold_s`: a pause of the whole process (leases and lock proofs run meanwhile)."""
    started: dict[str, float] = {}

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            took = time.perf_counter() - started.pop("t")
            if took > threshold_s:
                report(info.get("generation"), took)

    gc.callbacks.append(callback)
