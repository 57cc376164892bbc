"""The server-wide guards: memory held by messages and disk usage, fed in like `now`.

The broker keeps `memory` current as entries are queued and leave (each one's size, the
same count as the destinations' sizes, plus INDEX_BYTES); the store reports how many
body bytes it keeps on disk only (`paged_bytes`, taken off `memory`); the server samples
the data directory's disk usage. From these, which shortages are in force is an explicit value
(`shortages`), changed only here, each change reported once as a sentence for the log.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pairmq.core.settings import CoreSettings


class Shortage(StrEnum):
    """A server-wide reason to hold or refuse new messages."""

    MEMORY = "memory"  # global_max_size_bytes reached: every SEND
    DISK = "disk"  # max_disk_usage reached: persistent SENDs
    JOURNAL = "journal"  # the journal is full or failing: persistent SENDs


NO_SHORTAGE: frozenset[Shortage] = frozenset()
# What a queued message costs in memory besides the bytes its size counts (body, headers,
# 64 of bookkeeping): its objects (message, entry, headers dict, ids), about 700 bytes
# measured with tracemalloc for a paged-out 1 KiB message with three headers.
INDEX_BYTES: Final = 640


class Capacity:
    __slots__ = ("disk_usage", "full_policy", "max_disk_usage", "memory", "memory_limit",
                 "memory_resume", "paged_bytes", "shortages", "trip_at")

    def __init__(self, settings: CoreSettings) -> None:
        self.memory_limit = settings.global_max_size_bytes  # 0 = none
        self.memory_resume = int(settings.global_max_size_bytes * settings.resume_ratio)
        self.max_disk_usage = settings.max_disk_usage  # 100 = no check
        self.full_policy = settings.full_policy
        # Bytes of messages held in memory: every queued entry's size and index, minus the
        # bodies paged out. Kept current by the broker (one addition per entry).
        self.memory = 0
        # What `memory` is compared with on every enqueue: the limit, or never reached.
        self.trip_at = self.memory_limit or 1 << 62
        self.paged_bytes = 0  # input: bodies the store keeps on disk only
        self.disk_usage: float | None = None  # input: percent used, None before a sample
        self.shortages = NO_SHORTAGE

    def set_paged(self, paged_bytes: int) -> None:
        self.memory -= paged_bytes - self.paged_bytes
        self.paged_bytes = paged_bytes

    def check_memory(self) -> tuple[bool, str] | None:
        """After held or paged bytes changed: (entered, sentence) when the memory guard
        changes state, else None."""
        limit = self.memory_limit
        if not limit:
            return None
        used = self.memory
        short = Shortage.MEMORY in self.shortages
        if not short and used > limit:
            self.shortages = self.shortages | {Shortage.MEMORY}
            return True, (f"messages held in memory take {used} bytes, over "
                          f"global_max_size_bytes ({limit}): new messages are "
                          f"{self._action()} until consumers catch up")
        if short and used <= self.memory_resume:
            self.shortages = self.shortages - {Shortage.MEMORY}
            return False, (f"messages held in memory are down to {used} bytes (under "
                           f"{self.memory_resume}, 90% of global_max_size_bytes): new "
                           "messages are taken again")
        return None

    def check_disk(self, percent: float) -> tuple[bool, str] | None:
        """A new sample of the data directory's disk usage, in percent."""
        self.disk_usage = percent
        limit = self.max_disk_usage
        short = Shortage.DISK in self.shortages
        over = limit < 100 and percent >= limit
        if over and not short:
            self.shortages = self.shortages | {Shortage.DISK}
            return True, (f"disk usage of the data directory is {percent:.1f}%, at or over "
                          f"max_disk_usage ({limit}%): new persistent messages are "
                          f"{self._action()} until there is room")
        if short and not over:
            self.shortages = self.shortages - {Shortage.DISK}
            return False, (f"disk usage of the data directory is down to {percent:.1f}% "
                           f"(max_disk_usage {limit}%): persistent messages are taken again")
        return None

    def _action(self) -> str:
        return "held" if self.full_policy == "block" else "refused with an ERROR"
