"""The garbage collector of a broker that holds millions of long-lived objects.

A full collection scans every tracked object: with two million messages waiting it held
the whole process, heartbeats and lease included, for 1.9 s (issue 18), long enough for
the pair to take its active server for dead. So:

- a start (recovery) builds its objects with the collector paused, then freezes them:
  later collections skip them (`gc_paused`);
- the server never lets the collector run a full collection by itself
  (`collect_in_steps` sets the oldest generation's threshold out of reach): every
  `FULL_EVERY_S` the server collects what was made since the previous step, then freezes
  it too. A step's pause is bounded by what the server allocated in that time, not by
  what it holds;
- frozen objects are still freed when nothing refers to them (reference counting), but
  a reference cycle among them is not, until they are thawed: each step thaws everything
  first while fewer than `THAW_BELOW` objects are frozen (a full collection of them is
  short), so cycles are collected whenever the heap is small, and at worst wait for a
  backlog to drain.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

_pauses = 0  # gc_paused blocks open now (one may span an await: a recovery in a thread)


@contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
    """No collection inside, not even a `collection_step`; with freeze, what was built is
    kept out of all later ones."""
    global _pauses
    enabled = gc.isenabled()
    gc.disable()
    _pauses += 1
    try:
        yield
    finally:
        _pauses -= 1
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


YOUNG_THRESHOLD = 20_000  # allocations between two collections of the youngest objects
NEVER = 1 << 30  # the oldest generation's threshold: the server collects it in steps
FULL_EVERY_S = 0.5  # between two steps: at 2 s, a drain's steps took 50-76 ms
THAW_BELOW = 150_000  # frozen objects under which a step collects everything


def collect_young_less_often() -> None:
    """Collect the youngest generation every YOUNG_THRESHOLD allocations instead of 700.

    A broker allocates a few objects per message (the message, its queue entry, a journal
    record), most of them long-lived until consumed; at 700 the collector ran about every
    150 messages and, with 200,000 messages waiting, doubled the core's cost of taking a
    message (13.5 against 7 µs, docs/benchmarks.md). Refcounting still frees everything
    but cycles at once; older generations keep their thresholds."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def collect_oldest_in_steps() -> None:
    """No automatic full collection from now on: the server calls `collection_step`."""
    young, older, _ = gc.get_threshold()
    gc.set_threshold(young, older, NEVER)


def collection_step() -> int:
    """Collect what was made since the last step (everything, while the heap is small),
    then freeze it. Returns the objects the collection found unreachable. Nothing while a
    `gc_paused` block is open: a recovery running in a thread (a step-down, a shared-store
    takeover) builds objects faster than a step could scan them without holding the
    event loop (94 ms for 70,000 messages built in half a second)."""
    if _pauses:
        return 0
    if gc.get_freeze_count() < THAW_BELOW:
        gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found


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
