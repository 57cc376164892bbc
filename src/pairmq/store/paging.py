"""Which persistent bodies the server keeps in memory, and which only in the journal.

A body leaves memory once its record is synced when the paging budget (`paging_bytes`)
is spent, or when its destination was full under address_full_policy page (the broker
marks such a message `page_out`); it is read back from its segment when delivered.
`PagedBytes` counts what is on disk only, for the memory guard (core/capacity.py) and
the metrics; `load_bodies` decides what a recovery brings back into memory.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pairmq.core import Message
from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.replay import Replay


class Report(Protocol):
    paged: bool
    in_memory: int


class PagedBytes:
    """Body bytes of live persistent messages kept on disk only, in all and per destination."""

    __slots__ = ("by_destination", "total")

    def __init__(self) -> None:
        self.total = 0
        self.by_destination: dict[str, int] = {}

    def count(self, message: Message, sign: int) -> None:
        """The message's body left memory (+1), or it is no longer paged out (-1)."""
        change = sign * message.body_length
        self.total += change
        per = self.by_destination
        left = per.get(message.destination, 0) + change
        if left:
            per[message.destination] = left
        else:
            per.pop(message.destination, None)


def load_bodies(directory: Path, replay: Replay, report: Report, budget: int, used: int,
                paged_beyond: Callable[[str], int] | None) -> int:
    """Bring bodies into memory queue by queue, each in journal order (oldest first), until
    the paging budget is spent; the rest stay on disk and are read back when delivered.
    A destination with a cap (`paged_beyond`: under address_full_policy page, its limit)
    gets no more than that. Returns the body bytes in memory."""
    taken: dict[str, int] = {}  # destination -> bytes of its entries loaded so far
    by_segment: dict[int, list[Message]] = {}
    chosen: set[int] = set()  # a message shared by several queues is loaded once
    spent = False
    for queue_key, held in replay.queues.items():
        if not held or queue_key.startswith(STREAM_PREFIX):
            continue  # a stream's bodies stay in the journal until read
        # Every message of a queue was sent (or dead-lettered) to the same destination.
        destination = next(iter(held.values())).message.destination
        cap = paged_beyond(destination) if paged_beyond is not None else 0
        room = cap - taken.get(destination, 0) if cap else -1
        for entry in held.values():
            message = entry.message
            if cap:
                if message.size > room:
                    report.paged = True
                    break  # the rest of this queue stays on disk
                room -= message.size
            if id(message) in chosen:
                continue
            if used + message.body_length > budget:
                report.paged = spent = True
                break
            chosen.add(id(message))
            used += message.body_length
            by_segment.setdefault(message.journal_segment, []).append(message)
        if cap:
            taken[destination] = cap - room
        if spent:
            break
    report.in_memory = len(chosen)
    for segment_id, messages in by_segment.items():
        path = directory / f"journal-{segment_id:08d}.seg"
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for message in messages:
                start = message.body_offset
                message.body = data[start:start + message.body_length]
    return used
