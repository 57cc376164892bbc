"""How long the journal's group commits take (a group's writes and their data sync): a
histogram the writer's thread fills.

Kept in store/ without a metrics library (the management port turns it into Prometheus'
form). One per process: a server has one journal open at a time, whatever its role, and
the figure is about its disk.
"""

from __future__ import annotations

import threading

# seconds: a fast SSD syncs in about 0.2 ms here, a struggling disk in tens of ms
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class SyncTimes:
    """Cumulative counts per bucket, as Prometheus histograms are read."""

    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.buckets = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._sum += seconds
            for i, bound in enumerate(self.buckets):
                if seconds <= bound:
                    self._counts[i] += 1
                    return
            self._counts[-1] += 1

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """([(upper bound, cumulative count)], sum), the last bound "+Inf"."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return cumulative, total


SYNC_TIMES = SyncTimes()
