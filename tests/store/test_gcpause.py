"""The collector in steps (store/gcpause.py): a step collects what was made since the last
one and freezes it; while few objects are frozen it thaws them first, so a reference
cycle is collected; with many frozen, a step leaves them alone (its pause stays short)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from pairmq.store import gcpause
from tests.support.build import COMPILED


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    gc.unfreeze()
    gc.collect()
    try:
        gcpause.collect_oldest_in_steps()
        assert gc.get_threshold()[2] == gcpause.NEVER
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_a_step_freezes_what_it_kept_and_collects_a_cycle_while_the_heap_is_small(
    collector, monkeypatch
):
    kept = [Node() for _ in range(1000)]
    gcpause.collection_step()
    assert gc.get_freeze_count() >= 1000
    # "small" relative to this process: in a full test run (PySpark and all) far more
    # than the default THAW_BELOW objects are alive before the test starts
    monkeypatch.setattr(gcpause, "THAW_BELOW", gc.get_freeze_count() + 100_000)
    gone = cycle()
    gcpause.collection_step()  # the cycle was just made: collected
    assert gone() is None
    frozen_cycle = cycle()
    gc.freeze()  # as if it had lived through a step, then became garbage
    assert frozen_cycle() is not None
    gcpause.collection_step()  # few objects frozen: thawed, collected
    assert frozen_cycle() is None
    assert kept[0] is not None


def test_with_many_objects_frozen_a_step_leaves_them_alone(collector, monkeypatch):
    monkeypatch.setattr(gcpause, "THAW_BELOW", 10)
    sentinel = Node()
    gc.freeze()  # everything alive now, far more than 10 objects
    frozen_cycle = cycle()
    gc.freeze()
    gcpause.collection_step()
    assert frozen_cycle() is not None, "not thawed: its collection would scan the backlog"
    # What was frozen stays frozen: out of every generation. (Counting frozen objects
    # raced with other threads of a full run, whose frozen objects refcounting may free.)
    assert not any(obj is sentinel for obj in gc.get_objects())


def test_no_step_runs_while_a_recovery_pauses_the_collector(collector) -> None:
    """A recovery in a thread (a step-down, a takeover) keeps the collector paused across
    awaits; a step the loop's timer ran meanwhile would scan everything built so far, on
    the loop. It waits for the pause to end, which freezes what was built."""
    enabled = gc.isenabled()
    with gcpause.gc_paused(freeze=True):
        gone = cycle()
        assert gcpause.collection_step() == 0
        assert gone() is not None, "no collection ran"
    assert gc.isenabled() == enabled
    frozen = gc.get_freeze_count()
    assert frozen > 0 and gone() is not None
    gcpause.collection_step()  # runs again once the pause is over


def test_the_plan_thaws_now_and_then_and_steps_sooner_when_a_step_ran_long() -> None:
    """A thawed step scans the whole heap (76 ms at 125,000 objects): at most every
    THAW_EVERY_S. A step that scanned much (what was allocated since the last one) brings
    the next one closer, down to MIN_EVERY_S; quick steps move it back to FULL_EVERY_S."""
    plan = gcpause.StepPlan()
    quiet = 0.0
    assert not plan.thaws(100.0 - gcpause.THAW_EVERY_S, quiet)  # the first step: never
    assert plan.thaws(100.0, quiet)
    assert not plan.thaws(100.5, quiet)
    assert not plan.thaws(100.0 + gcpause.THAW_EVERY_S - 0.01, quiet)
    assert plan.thaws(100.0 + gcpause.THAW_EVERY_S, quiet)
    long_step = gcpause.STEP_TARGET_S * 2
    assert plan.next_in(long_step, thawed=True) == gcpause.FULL_EVERY_S  # the heap's size
    delays = [plan.next_in(long_step, thawed=False) for _ in range(6)]
    assert delays[0] == gcpause.FULL_EVERY_S / 2
    assert delays[-1] == gcpause.MIN_EVERY_S and min(delays) == gcpause.MIN_EVERY_S
    quick = [plan.next_in(0.0, thawed=False) for _ in range(8)]
    assert quick[0] > gcpause.MIN_EVERY_S and quick[-1] == gcpause.FULL_EVERY_S


def test_a_busy_server_thaws_rarely_a_quiet_one_every_few_seconds() -> None:
    """A thawed step scans the whole heap (36-41 ms in a 2M-message drain): while the
    loop's thread is busy, only every THAW_BUSY_EVERY_S; once it is quiet, at the next
    step past THAW_EVERY_S."""
    plan = gcpause.StepPlan()
    busy = gcpause.QUIET_BELOW + 0.5
    assert not plan.thaws(0.0, busy)  # the first step: never
    assert not plan.thaws(gcpause.THAW_EVERY_S, busy)
    assert not plan.thaws(gcpause.THAW_BUSY_EVERY_S - 0.01, busy)
    assert plan.thaws(gcpause.THAW_BUSY_EVERY_S, busy)
    assert not plan.thaws(gcpause.THAW_BUSY_EVERY_S + 1.0, gcpause.QUIET_BELOW / 2)
    assert plan.thaws(gcpause.THAW_BUSY_EVERY_S + gcpause.THAW_EVERY_S,
                      gcpause.QUIET_BELOW / 2)


@pytest.mark.skipif(COMPILED, reason="replaces a module function, which compiled callers "
                                    "do not look up")
def test_the_collector_measures_how_busy_the_loop_was_since_its_last_step(
    collector, monkeypatch
) -> None:
    thawed: list[bool] = []
    monkeypatch.setattr(gcpause, "collection_step", lambda thaw=True: thawed.append(thaw))
    monkeypatch.setattr(gcpause, "THAW_BELOW", 1 << 40)  # a small heap, however run
    steps = gcpause.SteppedCollector()
    steps.step(0.0, 0.0)  # the first step: never thaws
    # the thread ran 9 of the next 10 s: busy, no thaw
    steps.step(10.0, 9.0)
    # ran 1 of the next 10 s: quiet, thaw
    steps.step(20.0, 10.0)
    assert thawed == [False, False, True]


def test_the_start_is_frozen_before_the_first_step(collector) -> None:
    """What the start made (modules, classes) is frozen before the process serves, so the
    first step does not scan it on the event loop."""
    made = [Node() for _ in range(1000)]
    gcpause.freeze_the_start()
    assert gc.get_freeze_count() >= 1000
    assert not any(obj is made[0] for obj in gc.get_objects())  # out of every generation
