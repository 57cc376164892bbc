"""The reader's and writer's decisions, pure: where a query starts, how far a micro-batch
goes, how it is split into tasks, which delivered offsets a task keeps, and the producer
that numbers each task's written rows. The Spark classes (reader.py, writer.py) only do
the I/O around these.
"""

from __future__ import annotations

from dataclasses import dataclass


def initial_offset(position: str, first: int, next_offset: int) -> int:
    """The first offset a new query reads: `earliest`, `latest` or a number (a number
    below what retention kept starts at the first offset kept, as the server would)."""
    if position == "earliest":
        return first
    if position == "latest":
        return next_offset
    return max(int(position), first)


def ending_offset(position: str, next_offset: int) -> int:
    """A batch read's end (exclusive): `latest` or a number, never past the stream's end."""
    if position == "latest":
        return next_offset
    return min(int(position), next_offset)


def batch_end(start: int, first: int, next_offset: int, max_rows: int | None,
              cap: int | None = None) -> int:
    """The end (exclusive) of the next micro-batch that starts at `start`.

    `max_rows` (maxRecordsPerBatch) counts offsets that still exist: when retention removed
    the start of the range, the batch counts from the first offset kept. `cap` is the end
    fixed by Trigger.AvailableNow. Never before `start` (offsets only go forward)."""
    end = next_offset if cap is None else min(next_offset, cap)
    if max_rows is not None:
        end = min(end, max(start, first) + max_rows)
    return max(start, end)


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one stream: one task's share of a micro-batch."""

    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


def split(start: int, end: int, partitions: int, max_per_partition: int) -> list[Range]:
    """[start, end) in contiguous ranges of near-equal size: at least `partitions` of them
    (when there are that many offsets), none longer than `max_per_partition`.

    Deterministic in its arguments, so a micro-batch replayed from the checkpoint's offset
    log is split exactly as the first time."""
    total = end - start
    if total <= 0:
        return []
    count = min(total, max(partitions, -(-total // max_per_partition)))
    size, extra = divmod(total, count)
    ranges = []
    at = start
    for i in range(count):
        length = size + (1 if i < extra else 0)
        ranges.append(Range(at, at + length))
        at += length
    return ranges


class RangeCursor:
    """What one task has yielded of its range, so a delivery that starts over (the client
    re-creates the subscription on the new server after a failover, from the range's start)
    yields every offset once."""

    def __init__(self, start: int, end: int) -> None:
        self.next = start  # the next offset to yield; at `end` once the range is complete
        self.end = end

    @property
    def done(self) -> bool:
        return self.next >= self.end

    def accept(self, offset: int) -> bool:
        """Whether a delivered offset is new; offsets jump forward past what retention
        removed."""
        if self.done or offset < self.next or offset >= self.end:
            return False
        self.next = offset + 1
        return True

    def accept_run(self, first: int, count: int) -> tuple[int, int]:
        """A batch of `count` consecutive offsets from `first`: the slice [lo, hi) of it
        that is new (what was yielded before a failover, or lies past the range, is not)."""
        if self.done:
            return 0, 0
        lo = max(0, self.next - first)
        hi = min(count, self.end - first)
        if lo >= hi:
            return 0, 0
        self.next = first + hi
        return lo, hi

    def ended(self, marker_offset: int) -> bool:
        """The server's end marker came. True: the range is complete. False: it is a marker
        of an earlier delivery (before a failover) for less than the range: ignore it."""
        if marker_offset >= self.end:
            self.next = self.end  # what is missing below it, retention removed
        return self.done


def producer_of(query_id: str, partition: int) -> str:
    """The producer a task's rows are numbered as (docs/spark.md, "Exactly once"): the same
    for every attempt of the task and every micro-batch of the query (the batch id is the
    epoch), different for every other task."""
    return f"{query_id}:{partition}"
