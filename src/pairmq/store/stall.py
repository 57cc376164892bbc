"""Whether the journal's disk completes writes: a gray failure's first sign (issue 35).

A disk or network volume can stop completing writes while the process around it is
well: a frozen EBS or NFS volume, `fsfreeze`, a dying disk retrying a sector. The event
loop goes on (the writes are in the journal's thread), heartbeats go on, and nothing is
confirmed. The writer tells this watch when it hands a group to its thread and when
the group is written and synced; the watch says when a group has been in flight longer
than `[store] stall_timeout_ms`, and how long the stall lasted once it ends.

Pure: times are given (the loop's clock), as in ha/lease.py. The writer checks it every
`check_interval_s` and on every completion; a stall is seen at most that late.

Why a timeout in seconds, not Artemis' two minutes (critical-analyzer-timeout): the
longest group write measured under load here is tens of milliseconds (docs/benchmarks.md,
"Gray failures"), and a pair's backup holds every confirmed record, so stepping down
costs clients a reconnection, while waiting costs every client the whole wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Disk(StrEnum):
    IDLE = "idle"  # no group in flight
    WRITING = "writing"  # a group in flight, for less than the timeout
    STALLED = "stalled"  # a group in flight for longer than the timeout


@dataclass(frozen=True)
class StallView:
    """What /status and /metrics show of the journal's disk at one instant."""

    disk: Disk
    in_flight_s: float  # how long the group in flight has been (0: none)
    longest_s: float  # the longest group write completed since the start
    stalls: int  # stalls seen since the start


def check_interval(timeout_s: float) -> float:
    """How often the writer looks: a stall is seen at most this late."""
    return min(0.25, timeout_s / 4) if timeout_s > 0 else 0.25


class StallWatch:
    __slots__ = ("disk", "longest_s", "since", "stalls", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s  # 0: never stalled (the check is off)
        self.disk = Disk.IDLE
        self.since = 0.0  # when the group in flight was handed over
        self.longest_s = 0.0
        self.stalls = 0

    def began(self, now: float) -> None:
        """A group was handed to the writer's thread."""
        self.disk = Disk.WRITING
        self.since = now

    def ended(self, now: float) -> float | None:
        """The group in flight is written and synced. Returns how long it took when it had
        stalled (the stall is over), else None."""
        took = now - self.since
        if took > self.longest_s:
            self.longest_s = took
        was = self.disk
        self.disk = Disk.IDLE
        return took if was is Disk.STALLED else None

    def check(self, now: float) -> float | None:
        """Returns how long the group in flight has been when it has just stalled (once per
        stall), else None."""
        if self.disk is not Disk.WRITING or not self.timeout_s:
            return None
        took = now - self.since
        if took < self.timeout_s:
            return None
        self.disk = Disk.STALLED
        self.stalls += 1
        return took

    def view(self, now: float) -> StallView:
        in_flight = now - self.since if self.disk is not Disk.IDLE else 0.0
        return StallView(self.disk, round(in_flight, 3), round(self.longest_s, 3),
                         self.stalls)
