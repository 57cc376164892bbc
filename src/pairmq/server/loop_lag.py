"""How long the event loop is held, and by what: the pair's heartbeats, its lease and every
client wait behind the longest turn (issue 18, docs/operations.md).

- `LoopWatch` runs a timer every `INTERVAL_S` on the loop: how late it fires is the lag
  every other callback saw then. Each lag goes to the `pairmq_event_loop_lag_seconds`
  histogram; one over `REPORT_S` is logged as a warning, saying what held the loop.
- What held it is seen from outside: a watchdog thread looks at the loop's thread while
  the timer is overdue and notes the innermost pairmq frames it is running (no code has to
  announce what it does). It reads the stack as `faulthandler` writes it, never holding a
  frame object: a frame would keep the loop's locals alive (a memoryview of a journal
  segment being closed, say). A garbage collection holds every thread, so it is timed by
  the collector's own callbacks instead (`pairmq_gc_pause_seconds`).
- A report also says how much CPU the loop's thread had meanwhile: on a busy machine a
  process can wait for a core, which holds the loop as surely as work does, and the two
  call for different remedies.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import re
import tempfile
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # prometheus_client loads with the management port, not at every start
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("pairmq.server")

INTERVAL_S: Final = 0.05  # the watch timer's period
REPORT_S: Final = 0.1  # a turn longer than this is logged
WATCHDOG_S: Final = 0.025  # how often the watchdog thread looks
BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_FRAMES: Final = 3  # pairmq frames named in a report


class Buckets:
    """A histogram's counts, as Prometheus keeps them (each bucket counts the values up to
    its bound), turned into its metric only when /metrics asks."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last: over every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(BUCKETS, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, values up to it) per bucket, +Inf last."""
        running, out = 0, []
        for bound, count in zip([*map(str, BUCKETS), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class LoopWatch:
    """The loop's lag and the garbage collector's pauses, measured and reported."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lag = Buckets()  # pairmq_event_loop_lag_seconds
        # pairmq_gc_pause_seconds by generation: every series from the start, at 0
        self.gc_pause = {str(generation): Buckets() for generation in range(3)}
        self.longest = 0.0  # seconds, since start
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._beat = time.monotonic()  # when the loop last ran the watch timer
        self._last = (0.0, 0.0)  # loop time and the loop thread's CPU time at that timer
        self._busy_in: str | None = None  # what the watchdog saw the loop doing, this stall
        self._gc: tuple[float, float, int] | None = None  # last collection: end, took, gen
        self._gc_started = 0.0
        self._stop = threading.Event()
        self._watchdog_thread: threading.Thread | None = None
        self._loop_thread = threading.get_ident()

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        self._due = self.loop.time() + INTERVAL_S
        self._last = (self.loop.time(), time.thread_time())
        self._timer = self.loop.call_at(self._due, self._tick)
        self._watchdog_thread = threading.Thread(target=self._watchdog,
                                                 name="pairmq-loopwatch", daemon=True)
        self._watchdog_thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def metrics(self) -> Iterator[Metric]:
        """The two histograms, for the management port's collector."""
        from prometheus_client.core import HistogramMetricFamily

        lag = HistogramMetricFamily(
            "pairmq_event_loop_lag_seconds", "how late the event loop ran a timer due every "
            "50 ms: the wait every callback saw then", buckets=self.lag.cumulative(),
            sum_value=self.lag.total)
        yield lag
        gc_pause = HistogramMetricFamily(
            "pairmq_gc_pause_seconds", "pauses of the whole process by the garbage collector",
            labels=["generation"])
        for generation, pauses in self.gc_pause.items():
            gc_pause.add_metric([generation], pauses.cumulative(), pauses.total)
        yield gc_pause

    # ------------------------------------------------------------ on the loop

    def _tick(self) -> None:
        now = self.loop.time()
        cpu = time.thread_time()
        lag = max(0.0, now - self._due)
        self.lag.observe(lag)
        if lag > self.longest:
            self.longest = lag
        if lag > REPORT_S:
            window = now - self._last[0]
            log.warning("The event loop was held for %.0f ms (%s; its thread had %.0f ms "
                        "of CPU in those %.0f ms)", lag * 1000, self._cause(lag),
                        (cpu - self._last[1]) * 1000, window * 1000)
        self._last = (now, cpu)
        self._busy_in = None
        self._beat = time.monotonic()
        self._due = now + INTERVAL_S
        self._timer = self.loop.call_at(self._due, self._tick)

    def _cause(self, lag: float) -> str:
        collected = self._gc
        if collected is not None and time.monotonic() - collected[0] < lag + INTERVAL_S \
                and collected[1] > lag / 2:
            return f"a garbage collection of generation {collected[2]} took " \
                   f"{collected[1] * 1000:.0f} ms of it"
        return f"busy in {self._busy_in}" if self._busy_in else "not seen by the watchdog"

    # ------------------------------------------------------------ off the loop

    def _watchdog(self) -> None:
        with tempfile.TemporaryFile() as dump:
            while not self._stop.wait(WATCHDOG_S):
                if self._busy_in is None and time.monotonic() - self._beat > REPORT_S:
                    dump.seek(0)
                    dump.truncate()
                    faulthandler.dump_traceback(dump, all_threads=True)
                    dump.seek(0)
                    text = dump.read().decode(errors="replace")
                    self._busy_in = describe(text, self._loop_thread)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        generation = info.get("generation", 0)
        pauses = self.gc_pause.get(str(generation))
        if pauses is not None:
            pauses.observe(took)
        self._gc = (time.monotonic(), took, generation)


_THREAD: Final = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-f]+)", re.MULTILINE)
_LINE: Final = re.compile(r'^\s+File "([^"]+)", line (\d+) in (\S+)', re.MULTILINE)


def describe(dump: str, thread: int) -> str:
    """The innermost pairmq frames of `thread` in a faulthandler dump, innermost first
    (its innermost frame when none is ours; "?" when the thread is not in the dump)."""
    sections = _THREAD.split(dump)  # text, id, stack, id, stack...
    for i in range(1, len(sections) - 1, 2):
        if int(sections[i], 16) != thread:
            continue
        frames = _LINE.findall(sections[i + 1])  # innermost first
        ours = [f for f in frames if "/pairmq/" in f[0]][:_FRAMES]
        shown = ours or frames[:1]
        return " <- ".join(f"{path.rsplit('/pairmq/', 1)[-1]}:{line} {name}"
                           for path, line, name in shown) or "?"
    return "?"
