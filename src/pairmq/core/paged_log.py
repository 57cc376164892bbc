"""Paging as a mode of a destination (issue 18, docs/durability.md "Paging"): past its
memory budget, an address's new persistent messages live only in the journal, and the
server keeps no Python object for them, only where each one's journal entry lies.

A `PagedLog` is one address's such messages, in routing order, as compact arrays (28
bytes a message). Every durable queue of the address reads it with its own cursor
(a topic's durable subscriptions share one log: one copy on disk, one cursor each): a
paged message goes to every durable queue the address has when it is routed, and a queue
made later starts at the log's end. A queue holds in memory only a small window, refilled
from its cursor as consumers take messages ("page-in", done by the store, which reads the
entries back).

Entries are numbered from 0 for the log's life (`start` .. `end`). A message routed to
the log is *pending* (its object kept here) until its journal record is on disk; the store
then `locate`s it and the object is dropped. Only located entries are paged in, so a
page-in never reads what the writer has not written. Entries every cursor has passed are
dropped (`drop_passed`); the store releases their hold on the journal.

Pure data: no I/O; the store fills in locations and reads entries.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Hashable, Iterator, Mapping
from typing import Final, Protocol

from pairmq.core.array_sums import total as total_of


class Routed(Protocol):
    """What the log needs of a message it holds until its record is on disk."""

    order: int
    size: int


Queue = Hashable  # a reader of the log: the broker's queues (identity is what counts)

CHUNK: Final = 4096  # entries per chunk: the unit in which passed entries are freed


class Chunk:
    """Up to CHUNK consecutive located entries: segment, offset and length of each one's
    journal entry, its message's enqueue order and size (what the address counts for it),
    and the newest record sequence among them (a consumer is handed a paged-in message
    only once that record is confirmed)."""

    __slots__ = ("length", "length_total", "offset", "order", "segment", "seq", "size",
                 "size_total", "stamp", "summed")

    def __init__(self) -> None:
        self.segment = array("I")
        self.offset = array("I")
        self.length = array("I")
        self.order = array("Q")
        self.size = array("I")
        self.stamp = array("Q")  # a stream's append times (empty for a queue's log)
        self.seq = 0
        # The sums of `length` and `size` of the first `summed` entries, kept by `extend`
        # (a start accounts ten million recovered entries by chunk, store/pages.py, not
        # entry by entry); `add`, on the serving path, leaves them (then summed < len).
        self.length_total = 0
        self.size_total = 0
        self.summed = 0

    def __len__(self) -> int:
        return len(self.order)


def _last_order(chunk: Chunk) -> int:
    return chunk.order[-1]


def _last_stamp(chunk: Chunk) -> int:
    return chunk.stamp[-1]


class PagedLog:
    """One address's paged messages, and the cursors of the queues that read them."""

    __slots__ = ("_chunks", "_found", "cursors", "deliveries", "held", "located_end", "pending",
                 "released", "skip", "stamped", "start")

    def __init__(self, stamped: bool = False) -> None:
        self.stamped = stamped  # a stream's: each entry keeps its append time too
        self._chunks: list[Chunk] = []
        self._found = 0  # the chunk `find` found last (where the next one most likely is)
        self.start = 0  # number of the first entry still held (the older ones are dropped)
        self.located_end = 0  # one past the last located entry
        self.released = 0  # entries before this one no longer hold their journal segment
        self.pending: deque[Routed] = deque()  # routed here, record not on disk yet
        self.cursors: dict[Queue, int] = {}  # queue -> number of its next entry to page in
        self.held: dict[Queue, int] = {}  # queue -> bytes of its entries not paged in yet
        # A backup follows acknowledgements of messages it never paged in (the active did):
        # entries a queue has deleted past its cursor, and delivery counts of entries handed
        # out but not acknowledged (so a message redelivered after a takeover says so).
        self.skip: dict[Queue, set[int]] = {}
        self.deliveries: dict[int, int] = {}

    # ------------------------------------------------------------ size

    @property
    def end(self) -> int:
        """One past the last entry, pending ones included."""
        return self.located_end + len(self.pending)

    def waiting(self, q: Queue) -> int:
        """Messages of `q` in the log (located or pending) it has not paged in yet."""
        cursor = self.cursors.get(q)
        return 0 if cursor is None else self.end - cursor - len(self.skip.get(q, ()))

    def ready(self, q: Queue) -> int:
        """Located entries `q` may page in now."""
        cursor = self.cursors.get(q)
        return 0 if cursor is None else max(0, self.located_end - cursor)

    def min_cursor(self) -> int:
        return min(self.cursors.values(), default=self.end)

    @property
    def busy(self) -> bool:
        """Some queue still has messages here: new ones for the address come here too, so
        that each queue gets its messages in order."""
        return any(cursor < self.end for cursor in self.cursors.values())

    # ------------------------------------------------------------ queues

    def attach(self, q: Queue) -> None:
        """A durable queue of the address: it reads from what is routed from now on."""
        if q not in self.cursors:
            self.cursors[q] = self.end
            self.held[q] = 0

    def detach(self, q: Queue) -> int:
        """`q` reads no more; returns the bytes of its messages it had not paged in."""
        self.cursors.pop(q, None)
        self.skip.pop(q, None)
        return self.held.pop(q, 0)

    # ------------------------------------------------------------ entries

    def append(self, message: Routed) -> None:
        """A message routed here for every reader; its record is not on disk yet."""
        self.pending.append(message)
        held = self.held
        for q in held:
            held[q] += message.size

    def locate(self, message: Routed, segment: int, offset: int, length: int,
               seq: int, stamp: int | None = None) -> int:
        """The oldest pending message's record is on disk: keep where its entry lies and
        drop the object. Returns the entry's number."""
        head = self.pending.popleft()
        assert head is message, "paged messages are located in the order they were routed"
        return self.add(segment, offset, length, message.order, message.size, seq, stamp)

    def add(self, segment: int, offset: int, length: int, order: int, size: int,
            seq: int, stamp: int | None = None) -> int:
        """A located entry at the end (a recovery builds the log this way). Orders grow
        along the log (`find` relies on it)."""
        chunks = self._chunks
        if not chunks or len(chunks[-1].order) >= CHUNK:
            chunks.append(Chunk())
        chunk = chunks[-1]
        chunk.segment.append(segment)
        chunk.offset.append(offset)
        chunk.length.append(length)
        chunk.order.append(order)
        chunk.size.append(size)
        if stamp is not None:
            chunk.stamp.append(stamp)
        if seq > chunk.seq:
            chunk.seq = seq
        number = self.located_end
        self.located_end = number + 1
        return number

    def extend(self, segment: int, offsets: array[int], lengths: array[int], orders: array[int],
               sizes: array[int], stamps: array[int] | None = None) -> int:
        """Located entries at the end, all in one segment, as arrays (a recovery reading a
        segment's summary, store/summary.py): what `add` does for each, without a call
        each. Orders grow along the log. Returns the sum of their sizes."""
        chunks = self._chunks
        count = len(orders)
        at = total = 0
        while at < count:
            if not chunks or len(chunks[-1].order) >= CHUNK:
                chunks.append(Chunk())
            chunk = chunks[-1]
            summed = chunk.summed == len(chunk.order)  # its totals cover all it holds
            upto = min(count, at + CHUNK - len(chunk.order))
            chunk.segment.extend(array("I", (segment,)) * (upto - at))
            chunk.offset.extend(offsets[at:upto])
            chunk.length.extend(lengths[at:upto])
            chunk.order.extend(orders[at:upto])
            part = sizes[at:upto]
            chunk.size.extend(part)
            part_total = total_of(part)
            total += part_total
            if summed:
                chunk.length_total += total_of(lengths[at:upto])
                chunk.size_total += part_total
                chunk.summed = len(chunk.order)
            if stamps is not None:
                chunk.stamp.extend(stamps[at:upto])
            at = upto
        self.located_end += count
        return total

    def where(self, number: int) -> tuple[int, int, int, int, int, int]:
        """(segment, offset, length, order, size, seq) of located entry `number`."""
        chunk, i = self._chunk_of(number)
        return (chunk.segment[i], chunk.offset[i], chunk.length[i], chunk.order[i],
                chunk.size[i], chunk.seq)

    def start_at(self, number: int) -> None:
        """An empty log whose first entry will be `number` (a stream's offsets)."""
        assert not self._chunks and not self.pending, "only an empty log starts anew"
        self.start = self.located_end = self.released = number

    def size_of(self, number: int) -> int:
        chunk, i = self._chunk_of(number)
        return chunk.size[i]

    def stamp_of(self, number: int) -> int:
        chunk, i = self._chunk_of(number)
        return chunk.stamp[i]

    def order_of(self, number: int) -> int:
        chunk, i = self._chunk_of(number)
        return chunk.order[i]

    def first_stamp_at_or_after(self, ms: int) -> int:
        """The first located entry appended at or after `ms` (stamps never decrease along
        a stream); `located_end` when none is."""
        chunks = self._chunks
        lo = bisect_left(chunks, ms, key=_last_stamp)  # the first chunk that reaches ms
        if lo == len(chunks):
            return self.located_end
        return self.start + lo * CHUNK + bisect_left(chunks[lo].stamp, ms)

    def move(self, number: int, segment: int, offset: int) -> None:
        """Entry `number` was copied elsewhere in the journal (compaction)."""
        chunk, i = self._chunk_of(number)
        chunk.segment[i] = segment
        chunk.offset[i] = offset

    def first_order(self) -> int | None:
        """The enqueue order of the first located entry held, None if there is none."""
        chunks = self._chunks
        return chunks[0].order[0] if chunks and len(chunks[0]) else None

    def find(self, order: int) -> int | None:
        """The number of the located entry of the message with this enqueue order (orders
        grow along the log), or None."""
        chunks = self._chunks
        if not chunks or order > chunks[-1].order[-1]:
            return None  # newer than every entry (the common case: a new message)
        if order < chunks[0].order[0]:
            return None  # older: a removal replayed after its segment was let go
        # Acknowledgements come in the log's order, mostly: try the chunk found last.
        lo = self._found
        if not (lo < len(chunks) and chunks[lo].order[0] <= order <= chunks[lo].order[-1]):
            lo = bisect_left(chunks, order, key=_last_order)  # the first chunk reaching it
            if lo == len(chunks):
                return None
            self._found = lo
        chunk = chunks[lo]
        i = bisect_left(chunk.order, order)
        if i < len(chunk) and chunk.order[i] == order:
            return self.start + lo * CHUNK + i
        return None

    def next_numbers(self, q: Queue, count: int, most_bytes: int = 0) -> list[int]:
        """The numbers of the next `count` located entries `q` has to page in (those it
        deleted already skipped), in order; with `most_bytes`, no more than their sizes
        reach (the first always comes, however large)."""
        cursor = self.cursors[q]
        skip = self.skip.get(q)
        end = self.located_end
        numbers: list[int] = []
        taken = 0
        while cursor < end and len(numbers) < count:
            if not skip or cursor not in skip:
                if most_bytes:
                    if taken >= most_bytes:
                        break
                    taken += self.size_of(cursor)
                numbers.append(cursor)
            cursor += 1
        return numbers

    def advance(self, q: Queue, upto: int, size: int) -> int:
        """`q` paged in its entries before `upto` (`size` bytes of them); returns its new
        cursor."""
        self.cursors[q] = upto
        self.held[q] -= size
        skip = self.skip.get(q)
        if skip:
            skip.difference_update([n for n in skip if n < upto])
        return upto

    def delete(self, q: Queue, number: int) -> int:
        """`q` let go of entry `number` without paging it in (a backup following the
        active's acknowledgements); returns the bytes its message counted."""
        size = self.size_of(number)
        self.held[q] -= size
        self.deliveries.pop(number, None)
        cursor = self.cursors[q]
        if number != cursor:
            self.skip.setdefault(q, set()).add(number)
            return size
        skip = self.skip.get(q)
        cursor += 1
        while skip and cursor in skip:
            skip.discard(cursor)
            cursor += 1
        self.cursors[q] = cursor
        return size

    def drop_passed(self) -> None:
        """Free the chunks every cursor has passed (their journal hold is released first,
        by the store: `released` must have reached them)."""
        limit = min(self.min_cursor(), self.released)
        chunks = self._chunks
        while chunks and self.start + len(chunks[0]) <= limit \
                and (len(chunks) > 1 or len(chunks[0]) == CHUNK):  # a partial last one stays
            self.start += len(chunks.pop(0))

    def chunks_from(self, number: int) -> Iterator[tuple[int, Chunk, int]]:
        """(number of the first, chunk, index in it) of each chunk holding entries from
        `number` on: whole arrays, for bulk work (a recovery's accounting)."""
        if number >= self.located_end:
            return
        chunk_index, i = divmod(number - self.start, CHUNK)
        for k in range(chunk_index, len(self._chunks)):
            first = self.start + k * CHUNK + i
            yield first, self._chunks[k], i
            i = 0

    def _chunk_of(self, number: int) -> tuple[Chunk, int]:
        index = number - self.start
        if index < 0:
            raise IndexError(f"paged entry {number} was dropped (log starts at {self.start})")
        return self._chunks[index // CHUNK], index % CHUNK

    @property
    def last_order(self) -> int:
        """The enqueue order of the newest located entry (0: none)."""
        return self._chunks[-1].order[-1] if self._chunks else 0

    @property
    def newest_order(self) -> int:
        """The enqueue order of the newest entry, pending ones included (0: none)."""
        return self.pending[-1].order if self.pending else self.last_order

    def rekey(self, readers: Mapping[Queue, Queue]) -> None:
        """Name the readers anew (a recovery knows them by queue key until the broker's
        queues exist); readers not in `readers` are gone."""
        self.cursors = {readers[k]: v for k, v in self.cursors.items() if k in readers}
        self.held = {readers[k]: v for k, v in self.held.items() if k in readers}
        self.skip = {readers[k]: v for k, v in self.skip.items() if k in readers}

    @property
    def nbytes(self) -> int:
        """Memory the located entries take."""
        return sum(28 * len(c) for c in self._chunks)
