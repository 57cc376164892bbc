"""The reader's and writer's decisions, pure: where a query starts, how far a micro-batch
goes and whether it starts yet, how it is split into tasks, which delivered offsets a task
keeps, what retention removed before it was read (data loss), and the producer that numbers
each task's written rows. The Spark classes (reader.py, writer.py) only do the I/O around
these; time is a parameter here, never read.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any


class DataLossError(RuntimeError):
    """Offsets a query still had to read were removed by retention (option failOnDataLoss):
    the message names them and the stream."""


def data_loss_message(stream: str, start: int, end: int) -> str:
    """What a query lost: offsets [start, end) of `stream` (/stream/NAME)."""
    which = f"offset {start}" if end - start == 1 else f"offsets {start} to {end - 1}"
    verb = "was" if end - start == 1 else "were"
    return (f"{which} of {stream} {verb} removed by retention before they were read; set "
            f"failOnDataLoss=false to skip them")


def initial_offset(position: str, first: int, next_offset: int) -> int:
    """The first offset a new query reads: `earliest`, `latest` or a number (a number
    below what retention kept starts at the first offset kept, as the server would: that is
    data loss, `removed` says which offsets)."""
    if position == "earliest":
        return first
    if position == "latest":
        return next_offset
    return max(int(position), first)


def ending_offset(position: str, first: int, next_offset: int) -> int:
    """A batch read's end (exclusive): `latest`, `earliest` (nothing) or a number, never past
    the stream's end."""
    if position == "latest":
        return next_offset
    if position == "earliest":
        return first
    return min(int(position), next_offset)


def removed(start: int, first: int, end: int | None = None) -> Range | None:
    """The offsets a read from `start` (to `end`, exclusive) will not find because retention
    removed them (everything below `first`, the first offset kept), or None."""
    stop = first if end is None else min(first, end)
    return Range(start, stop) if start < stop else None


def batch_end(start: int, first: int, next_offset: int, max_rows: int | None,
              cap: int | None = None) -> int:
    """The end (exclusive) of the next micro-batch that starts at `start`.

    `max_rows` (maxOffsetsPerTrigger) counts offsets that still exist: when retention
    removed the start of the range, the batch counts from the first offset kept. `cap` is the
    end fixed by Trigger.AvailableNow. Never before `start` (offsets only go forward)."""
    end = next_offset if cap is None else min(next_offset, cap)
    if max_rows is not None:
        end = min(end, max(start, first) + max_rows)
    return max(start, end)


def batch_due(available: int, min_rows: int | None, max_delay_ms: int, now_ms: int,
              last_batch_ms: int | None) -> bool:
    """Whether a micro-batch of `available` offsets starts now (minOffsetsPerTrigger, as
    Kafka's): never without an offset; with `min_rows`, once that many are available or
    `max_delay_ms` (maxTriggerDelay) passed since the last batch (`last_batch_ms`; None: no
    batch yet in this run, which is never delayed, as Kafka's first trigger)."""
    if available <= 0:
        return False
    if min_rows is None or last_batch_ms is None:
        return True
    return available >= min_rows or now_ms - last_batch_ms >= max_delay_ms


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


_OFFSET = itemgetter(0)


class RangeCursor:
    """What one task has yielded of its range, so a delivery that starts over (the client
    re-creates the subscription on the new server after a failover, from the range's start)
    yields every offset once; and what retention removed of the range before it was read.

    Unfiltered, the server delivers every offset of the range still stored, in order, so an
    offset that does not come (a jump forward, or the end marker before the range's end) was
    removed by retention. `filtered` (a selector or a filter): the server skips what does not
    match, so jumps are normal and say nothing; the caller compares the stream's first kept
    offset with the range (`removed_below`). What is lost raises DataLossError with
    `fail_on_loss`, else is kept in `lost` for the caller to log."""

    def __init__(self, start: int, end: int, stream: str = "", filtered: bool = False,
                 fail_on_loss: bool = False) -> None:
        self.next = start  # the next offset to yield; at `end` once the range is complete
        self.end = end
        self.stream = stream
        self.filtered = filtered
        self.fail_on_loss = fail_on_loss
        self.lost: list[Range] = []

    @property
    def done(self) -> bool:
        return self.next >= self.end

    def _loss(self, start: int, end: int) -> None:
        if self.fail_on_loss:
            raise DataLossError(data_loss_message(self.stream, start, end))
        self.lost.append(Range(start, end))

    def _arrived(self, offset: int) -> None:
        """The first new offset of a delivery: what lies between it and `next` is gone."""
        if offset > self.next and not self.filtered:
            self._loss(self.next, offset)

    def removed_below(self, first: int) -> None:
        """The stream's first kept offset, asked when the read began: what the range has
        below it was removed (the one check of a filtered read)."""
        gone = removed(self.next, first, self.end)
        if gone is not None:
            self._loss(gone.start, gone.end)

    def accept(self, offset: int) -> bool:
        """Whether one delivered offset is new."""
        if self.done or offset < self.next or offset >= self.end:
            return False
        self._arrived(offset)
        self.next = offset + 1
        return True

    def accept_run(self, records: Sequence[Sequence[Any]]) -> tuple[int, int]:
        """A batch of records in offset order, each with its own offset first (consecutive
        unless the server filters): the slice [lo, hi) of it that is new (what was yielded
        before a failover, or lies past the range, is not)."""
        count = len(records)
        if self.done or not count:
            return 0, 0
        first = records[0][0]
        if records[-1][0] - first == count - 1:  # consecutive: no search
            lo = min(count, max(0, self.next - first))
            hi = max(0, min(count, self.end - first))
        else:
            lo = bisect_left(records, self.next, key=_OFFSET)
            hi = bisect_left(records, self.end, key=_OFFSET)
        if lo >= hi:
            return 0, 0
        self._arrived(records[lo][0])
        self.next = records[hi - 1][0] + 1
        return lo, hi

    def ended(self, marker_offset: int) -> bool:
        """The server's end marker came. True: the range is complete. False: it is a marker
        of an earlier delivery (before a failover) for less than the range: ignore it."""
        if marker_offset >= self.end:
            if not self.done and not self.filtered:
                self._loss(self.next, self.end)  # nothing came of it: removed
            self.next = self.end
        return self.done


def producer_of(query_id: str, partition: int) -> str:
    """The producer a task's rows are numbered as (docs/spark.md, "Exactly once"): the same
    for every attempt of the task and every micro-batch of the query (the batch id is the
    epoch), different for every other task."""
    return f"{query_id}:{partition}"
