"""How a store is configured ([store] in the server's file): a value of its own, which the
store and its parts read and the server's configuration builds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

FULL_POLICIES = ("fail", "block")
# A summary of the segment being written each time it grew this much (store/
# summary_builder.py says why 8 MiB)
PARTIAL_SUMMARY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class StoreSettings:
    segment_bytes: int = 64 * 1024 * 1024
    max_journal_bytes: int = 0  # 0 = only the disk limits it
    full_policy: str = "fail"  # "fail" (ERROR to the sender) or "block" (stop reading)
    paging_bytes: int = 256 * 1024 * 1024  # message bodies held in memory before paging
    stall_timeout_s: float = 0.0  # a write in flight this long is a stalled disk; 0 = off
    compact_ratio: float = 0.5  # rewrite the oldest segment once less than this is live
    # PARTIAL_SUMMARY_BYTES (0: only sealed segments get a summary). Not a [store] key:
    # tests make it small.
    partial_summary_bytes: int = PARTIAL_SUMMARY_BYTES
    # ... only while its records average at least this many per summary item (store/
    # summary_builder.py, RECORDS_PER_ITEM). Not a [store] key either.
    summary_records_per_item: int = 16
    # Destination name -> bytes of its messages recovery loads before leaving the rest on
    # disk (a destination under address_full_policy "page": its limit); 0 = no such cap.
    paged_beyond: Callable[[str], int] | None = None
