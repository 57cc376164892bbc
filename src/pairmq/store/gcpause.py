"""The garbage collector of a broker that holds millions of long-lived objects.

A full collection scans every tracked object: with two million messages waiting it held
the whole process, heartbeats and lease included, for 1.9 s (issue 18), long enough for
the pair to take its active server for dead. So:

- a start (recovery) builds its objects with the collector paused, then freezes them:
  later collections skip them (`gc_paused`);
- the server never lets the collector run a full collection by itself
  (`collect_oldest_in_steps` sets the oldest generation's threshold out of reach): it
  runs `SteppedCollector.step` from a timer, which collects what was made since the
  previous step, then freezes it too. A step's pause is bounded by what the server
  allocated since, not by what it holds; a step that took longer than `STEP_TARGET_S`
  brings the next one closer (down to `MIN_EVERY_S`), so that it finds less;
- frozen objects are still freed when nothing refers to them (reference counting), but
  a reference cycle among them is not, until they are thawed: while fewer than
  `THAW_BELOW` objects are frozen (a full collection of them is short), a step thaws
  everything first, every `THAW_EVERY_S`, so cycles are collected whenever the heap is
  small, and at worst wait for a backlog to drain. A thawed step scans the whole heap
  (36-41 ms in a 2M-message drain, in a turn that then also served clients: 54-76 ms), so
  it waits for a quiet moment, when the loop's thread was busy less than `QUIET_BELOW` of
  the time since the last step; a server that is never quiet thaws every
  `THAW_BUSY_EVERY_S`, and the first step never thaws (`freeze_the_start` froze what
  the start made: the first step would otherwise scan it all, 44-59 ms on a backup in its
  first second of following).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

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


YOUNG_THRESHOLD: Final = 20_000  # allocations between two collections of the youngest objects
NEVER: Final = 1 << 30  # the oldest generation's threshold: the server collects it in steps
FULL_EVERY_S: Final = 0.5  # between two steps at most: at 2 s, a drain's steps took 50-76 ms
MIN_EVERY_S: Final = 0.1  # ... and at least, however much the server allocates
STEP_TARGET_S: Final = 0.02  # a step longer than this brings the next one closer
# A thawed step collects the whole heap: 0.5-0.6 us an object here (30,000 objects, the
# code's own, 22 ms; 125,000, 76 ms), so only below this, and not at every step.
THAW_BELOW = 50_000
THAW_EVERY_S: Final = 5.0  # between two thawed steps, at least
QUIET_BELOW: Final = 0.25  # the share of its time the loop's thread ran, below which it is quiet
THAW_BUSY_EVERY_S: Final = 300.0  # a server never quiet thaws this often (cycles wait that long)


def collect_young_less_often() -> None:
    """Collect the youngest generation every YOUNG_THRESHOLD allocations instead of 700.

    A broker allocates a few objects per message (the message, its queue entry, a journal
    record), most of them long-lived until consumed; at 700 the collector ran about every
    150 messages and, with 200,000 messages waiting, doubled the core's cost of taking a
    message (13.5 against 7 µs, docs/benchmarks.md). Refcounting still frees everything
    but cycles at once; older generations keep their thresholds."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def freeze_the_start() -> None:
    """Before the process serves anything: collect once, and freeze what the start made
    (modules, classes, configuration). Otherwise the first step finds nothing frozen,
    thaws, and scans them all on the event loop: 44-51 ms on a backup, in its first second
    of following the active (benchmarks/backlog.py)."""
    gc.collect()
    gc.freeze()


def collect_oldest_in_steps() -> None:
    """No automatic full collection from now on: the server calls `collection_step`."""
    young, older, _ = gc.get_threshold()
    gc.set_threshold(young, older, NEVER)


def collection_step(thaw: bool = True) -> int:
    """Collect what was made since the last step (with `thaw`, everything, if the heap is
    small), then freeze it. Returns the objects the collection found unreachable. Nothing
    while a `gc_paused` block is open: a recovery running in a thread (a step-down, a
    shared-store takeover) builds objects faster than a step could scan them without
    holding the event loop (94 ms for 70,000 messages built in half a second)."""
    if _pauses:
        return 0
    if thaw and gc.get_freeze_count() < THAW_BELOW:
        gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    return found


@dataclass
class StepPlan:
    """When the next step runs and whether it thaws: decided on the time and the last
    step's length, both given (no clock here)."""

    interval: float = FULL_EVERY_S
    thawed_at: float | None = None

    def thaws(self, now: float, busy: float) -> bool:
        """Whether the step about to run may thaw (it does if the heap is small), given
        the share of the time since the last step the loop's thread ran (`busy`). Not the
        first step: a server's first seconds are its busiest (a backup's first sync)."""
        if self.thawed_at is None:
            self.thawed_at = now
            return False
        since = now - self.thawed_at
        if since < THAW_EVERY_S or (busy >= QUIET_BELOW and since < THAW_BUSY_EVERY_S):
            return False
        self.thawed_at = now
        return True

    def next_in(self, took: float, thawed: bool) -> float:
        """Seconds until the next step. A thawed step's length says how large the heap is,
        not how much was allocated: it does not move the next one."""
        if not thawed:
            if took > STEP_TARGET_S:
                self.interval = max(MIN_EVERY_S, self.interval / 2)
            elif took < STEP_TARGET_S / 4:
                self.interval = min(FULL_EVERY_S, self.interval * 1.5)
        return self.interval


class SteppedCollector:
    """The server's timer calls `step(now, cpu)` (`cpu`: the loop thread's CPU time) and
    runs the next one after what it returns."""

    def __init__(self) -> None:
        self.plan = StepPlan()
        self._last: tuple[float, float] | None = None  # (now, cpu) at the last step

    def step(self, now: float, cpu: float) -> float:
        last, self._last = self._last, (now, cpu)
        busy = 1.0 if last is None or now <= last[0] else (cpu - last[1]) / (now - last[0])
        thaw = self.plan.thaws(now, busy) and gc.get_freeze_count() < THAW_BELOW
        started = time.perf_counter()
        collection_step(thaw)
        return self.plan.next_in(time.perf_counter() - started, thaw)


def report_slow_collections(threshold_s: float,
                            report: Callable[[int | None, float], object]) -> None:
    """Call `report(generation, seconds)` after every collection that took longer than
    `threshold_s`: a pause of the whole process (leases and lock proofs run meanwhile)."""
    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            took = time.perf_counter() - started.pop("t")
            if took > threshold_s:
                report(info.get("generation"), took)

    gc.callbacks.append(callback)
