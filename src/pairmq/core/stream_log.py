"""Streams (`/stream/NAME`): an append-only log addressed by dense offsets, and the cursors
that read it. Pure: time comes in as `now`, nothing here journals or delivers (the
Broker's stream side, core/broker/streams.py, does).

A stream keeps every record in the journal and, in memory, 28 bytes and an append time
per record (its paged log, core/paged_log.py) plus the objects of its newest records; older
ones are read back when a reader gets there (issue 18). Offsets are dense: the message at
offset `first + i` is the i-th one held; retention removes whole messages from the head
only, and always keeps the newest, so `next` survives a restart without another record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from itertools import islice
from typing import TYPE_CHECKING, Final, NamedTuple

from pairmq.core.errors import CoreError
from pairmq.core.message import Message
from pairmq.core.paged_log import PagedLog
from pairmq.core.queue import Address
from pairmq.core.settings import Retention
from pairmq.core.subscription import ACK_AUTO, ACK_CLIENT, Delivery

if TYPE_CHECKING:  # objects that point at each other: a StreamCursor holds its session, a
    # Session its cursors (session.py)
    from pairmq.core.session import Session

OFFSET_HEADER: Final = "x-stream-offset"
END_HEADER: Final = "x-stream-end"
BATCH_HEADER: Final = "x-stream-batch"
MAX_BATCH: Final = 10000  # records in one batched MESSAGE, at most
BATCH_BYTES: Final = 1024 * 1024  # a batch stops once its records' sizes reach this (>= 1 record)
HOT: Final = 1024  # newest records of a stream whose objects stay in memory, for tail readers


class StartKind(StrEnum):
    """Where a subscription starts (SUBSCRIBE header x-stream-offset, as RabbitMQ)."""

    FIRST = "first"  # the oldest message still held
    LAST = "last"  # the newest message (or what comes next, if none)
    NEXT = "next"  # only what is appended from now on (the default)
    OFFSET = "offset"  # offset=N, or a bare N
    TIMESTAMP = "timestamp"  # the first message appended at or after MS (or seconds)
    GROUP = "group"  # where the consumer group (x-stream-group) stopped


@dataclass(frozen=True, slots=True)
class Start:
    kind: StartKind
    value: int = 0  # the offset or the time (ms), for OFFSET and TIMESTAMP


# x-stream-offset timestamp=T: RabbitMQ's T is in seconds since the epoch, pairmq's own in
# ms (every other time on the wire is). A value below this is read as seconds, one at or
# above as ms: 10^11 s is the year 5138, 10^11 ms is 1973-03-03, so neither form of a time
# this side of those is read as the other (pairmq's Spark source relies on it too).
SECONDS_BELOW: Final = 10**11


def parse_count(header: str, value: str) -> int:
    """A non-negative integer header, or an error naming the header and the value."""
    if not (value.isascii() and value.isdigit()) or len(value) > 19:  # int() takes it
        raise CoreError(f"{header} must be a non-negative integer, got {value[:40]!r}")
    return int(value)


def parse_start(value: str | None) -> Start:
    """The x-stream-offset header of a SUBSCRIBE (None: `next`)."""
    if value is None:
        return Start(StartKind.NEXT)
    word = value.strip()
    for kind in (StartKind.FIRST, StartKind.LAST, StartKind.NEXT, StartKind.GROUP):
        if word == kind.value:
            return Start(kind)
    name, sep, number = word.partition("=")
    if sep and name in (StartKind.OFFSET.value, StartKind.TIMESTAMP.value):
        found = parse_count(f"x-stream-offset {name}", number)
        if name == StartKind.TIMESTAMP.value and found < SECONDS_BELOW:
            found *= 1000  # seconds, as RabbitMQ writes it
        return Start(StartKind(name), found)
    if word.isdigit() and word.isascii():
        return Start(StartKind.OFFSET, parse_count("x-stream-offset", word))
    raise CoreError(f"x-stream-offset must be first, last, next, group, offset=N, N or "
                    f"timestamp=T (seconds, or ms from 10^11 on), got {value!r}")


def parse_batch(value: str | None) -> int | None:
    """The x-stream-batch header of a SUBSCRIBE: records per MESSAGE (None: the header is
    absent, one plain MESSAGE per record)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 5 \
            or not 1 <= int(value) <= MAX_BATCH:
        raise CoreError(f"{BATCH_HEADER} must be an integer from 1 to {MAX_BATCH}, "
                        f"got {value[:40]!r}")
    return int(value)


class StreamLog:
    """One stream's messages in offset order, its consumer groups' offsets and readers.

    Every record lives in the journal; in memory a stream keeps a paged log (28 bytes and
    an append time per record: where its entry lies, core/paged_log.py), numbered by offset,
    and the objects of its newest HOT records (and of those whose record is not on disk
    yet) for the readers at its tail. A reader further back has its records read back by
    the store (core/broker/streams.py asks, `take_stream_reads`)."""

    __slots__ = ("_hot", "_last_stamp", "address", "bytes", "cursors", "first", "groups",
                 "key", "log", "name", "retention")

    def __init__(self, destination: str, address: Address, retention: Retention) -> None:
        self.name = destination  # "/stream/NAME"
        self.key = destination  # its journal queue key
        self.address = address  # dup-ids live here; it has no size limit
        self.retention = retention
        self.first = 0  # offset of the oldest message held (== next when empty)
        self.bytes = 0  # sizes (body, headers, 64) of the messages held
        self.groups: dict[str, int] = {}  # consumer group -> offset it processed all below
        self.cursors: list[StreamCursor] = []
        self.log = PagedLog(stamped=True)  # every record, by offset (pending until synced)
        self.log.attach(self)  # its one reader: retention, which passes the head
        self._hot: deque[Message] = deque()  # the newest records' objects, to `next`
        self._last_stamp = 0

    @property
    def next(self) -> int:
        return self.log.end

    @property
    def count(self) -> int:
        return self.next - self.first

    @property
    def hot_first(self) -> int:
        """The oldest offset whose object is in memory."""
        return self.next - len(self._hot)

    @property
    def newest_stamp(self) -> int:
        """The stamp of the newest record (0 while there is none)."""
        return self._last_stamp if self.count else 0

    def stamp_for(self, now: int) -> int:
        """The append time of a message appended at `now`: never before the previous one,
        so that a time lookup is a binary search even if the clock stepped back."""
        return max(now, self._last_stamp) if self.count else now

    def append(self, message: Message, stamp: int) -> int:
        """Add the message at `next` (its headers already say so); returns its offset."""
        offset = self.next
        message.log = self.log
        self.log.append(message)
        self._hot.append(message)
        self._last_stamp = stamp
        self.bytes += message.size
        return offset

    def cool(self) -> list[Message]:
        """Let go of the objects of located records past the HOT newest (their entries
        stay in the log); returns them (the broker stops counting their memory)."""
        gone: list[Message] = []
        hot = self._hot
        located = self.log.located_end
        while len(hot) > HOT and self.hot_first < located:
            gone.append(hot.popleft())
        return gone

    def at(self, offset: int) -> Message | None:
        """The record at `offset`, if its object is in memory (None: past the end, or only
        in the journal: `cold`)."""
        first = self.hot_first
        if offset < max(first, self.first) or offset >= self.next:
            return None
        return self._hot[offset - first]

    def cold(self, offset: int) -> bool:
        """Is the record at `offset` held only in the journal (read back to deliver it)?"""
        return self.first <= offset < self.hot_first

    def run(self, offset: int, most: int, max_bytes: int = BATCH_BYTES) -> list[Message]:
        """Up to `most` consecutive in-memory records from `offset` (fewer at the stream's
        end), and no more once their sizes reach `max_bytes` (one at least): a batch
        stays a frame any client accepts."""
        first = self.hot_first
        if offset < max(first, self.first):
            return []
        i = offset - first
        run = list(islice(self._hot, i, i + most))
        total = 0
        for n, message in enumerate(run):
            total += message.size
            if total >= max_bytes:
                return run[:n + 1]
        return run

    def cold_run(self, offset: int, most: int, max_bytes: int = BATCH_BYTES) -> list[int]:
        """The offsets of up to `most` consecutive records from `offset` held only in the
        journal, within `max_bytes` as `run`."""
        end = min(offset + most, self.hot_first, self.log.located_end)
        numbers: list[int] = []
        total = 0
        for number in range(max(offset, self.first), end):
            numbers.append(number)
            total += self.log.size_of(number)
            if total >= max_bytes:
                break
        return numbers

    def offset_at_time(self, ms: int) -> int:
        """The first offset appended at or after `ms` (`next` when none is)."""
        found = self.log.first_stamp_at_or_after(ms) if self.log.located_end > self.first \
            else self.first
        found = max(found, self.first)
        if found < min(self.hot_first, self.log.located_end):
            return found
        for offset in range(max(self.hot_first, self.first), self.next):
            message = self._hot[offset - self.hot_first]
            if int(message.headers.get("timestamp", "0")) >= ms:
                return offset
        return self.next

    def resolve(self, start: Start) -> int:
        """The offset a subscription starting at `start` reads first."""
        kind = start.kind
        if kind is StartKind.FIRST:
            return self.first
        if kind is StartKind.LAST:
            return max(self.first, self.next - 1)
        if kind is StartKind.NEXT:
            return self.next
        if kind is StartKind.TIMESTAMP:
            return self.offset_at_time(start.value)
        return max(self.first, start.value)

    def commit(self, group: str, offset: int) -> bool:
        """Group `group` processed everything below `offset`; False when that is not
        news (offsets only move forward)."""
        if offset <= self.groups.get(group, -1):
            return False
        self.groups[group] = offset
        return True

    # ----------------------------------------------------------------- retention

    def _size_at(self, offset: int) -> int:
        first = self.hot_first
        return self._hot[offset - first].size if offset >= first \
            else self.log.size_of(offset)

    def _stamp_at(self, offset: int) -> int:
        first = self.hot_first
        if offset >= first:
            return int(self._hot[offset - first].headers.get("timestamp", "0"))
        return self.log.stamp_of(offset)

    def to_remove(self, now: int) -> int:
        """How many head messages retention removes now: while the stream is over
        `max_bytes`, or they are older than `max_age_ms`; never the newest, never one at or
        past the protecting group's offset (all, while that group has committed nothing),
        never one whose record is not on disk yet."""
        retention = self.retention
        limit = min(self.count - 1, self.log.located_end - self.first)
        if retention.group is not None:
            limit = min(limit, self.groups.get(retention.group, self.first) - self.first)
        if limit <= 0 or not (retention.max_bytes or retention.max_age_ms):
            return 0
        too_old = now - retention.max_age_ms if retention.max_age_ms else None
        left = self.bytes
        n = 0
        while n < limit:
            over = retention.max_bytes and left > retention.max_bytes
            old = too_old is not None and self._stamp_at(self.first + n) < too_old
            if not (over or old):
                break
            left -= self._size_at(self.first + n)
            n += 1
        return n

    def drop_head(self, n: int) -> list[tuple[int, int, Message | None]]:
        """Remove the `n` oldest messages; returns (enqueue order, size, its object if it
        was in memory) of each, for the journal's removal and the memory count."""
        gone: list[tuple[int, int, Message | None]] = []
        first = self.first
        hot_first = self.hot_first
        for offset in range(first, first + n):
            if offset >= hot_first:
                message = self._hot.popleft()
                hot_first += 1
                gone.append((message.order, message.size, message))
            else:
                gone.append((self.log.order_of(offset), self.log.size_of(offset), None))
            self.bytes -= gone[-1][1]
        self.first = first + n
        self.log.advance(self, self.first, 0)
        return gone

    # ----------------------------------------------------------------- rebuilding

    def restore(self, log: PagedLog, first: int, nbytes: int, last_stamp: int) -> None:
        """What a recovery rebuilt: the records from offset `first` on, in `log`."""
        self.log = log
        log.cursors = {self: first}
        log.held = {self: 0}
        log.released = min(log.released, first)
        self.first = first
        self.bytes = nbytes
        self._last_stamp = last_stamp

    def place(self, offset: int, message: Message) -> Message | None:
        """A backup follows an append: at `next` it is appended (and returned); an offset
        below `next` is a copy of one held (ignored: None); past it, what was between is
        gone (retention, before this backup joined): an empty stream starts there, one that
        holds records ignores it (None)."""
        if offset < self.next:
            return None
        if offset > self.next:
            if self.count:
                return None  # a gap in a stream that holds records: not ours to fill
            self.log.start_at(offset)
            self.log.cursors[self] = offset
            self.first = offset
        self.append(message, int(message.headers.get("timestamp", "0")))
        return message

    def remove_head(self, order: int) -> list[tuple[int, int, Message | None]]:
        """A backup applies a retention removal: the head record, when it is that one."""
        if not self.count:
            return []
        first = self.first
        head_order = self._hot[0].order if first >= self.hot_first \
            else self.log.order_of(first)
        if order >= 0 and head_order != order:
            return []
        return self.drop_head(1)

    def status(self) -> dict[str, int]:
        return {"first_offset": self.first, "next_offset": self.next,
                "messages": self.count, "bytes": self.bytes, "readers": len(self.cursors),
                "in_memory": len(self._hot)}


class CursorState(StrEnum):
    READING = "reading"  # delivering, or waiting for appends
    ENDED = "ended"  # its range is delivered and the end marker sent: nothing more


class StreamCursor:
    """One subscription's position in a stream. Consuming removes nothing: ACK/NACK only
    give back window (prefetch) credit, counted in records (a batch of K takes K)."""

    __slots__ = ("ack_mode", "batch", "destination", "end", "id", "match", "outstanding",
                 "position", "prefetch", "session", "state", "stream", "unacked")

    def __init__(self, session: Session, sub_id: str, stream: StreamLog, position: int,
                 end: int | None, ack_mode: int, prefetch: int,
                 batch: int | None = None,
                 match: Callable[[Mapping[str, str]], bool] | None = None) -> None:
        self.session = session
        self.id = sub_id
        self.destination = stream.name
        self.stream = stream
        self.position = position  # the next offset to deliver
        self.end = end  # exclusive end of a bounded range (None: read on forever)
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.batch = batch  # records per MESSAGE (None: plain, one record per MESSAGE)
        # the records it keeps (a selector, x-stream-filter: core/selective.py); None: all.
        # The others are passed over: they take no credit and no MESSAGE.
        self.match = match
        self.state = CursorState.READING
        # ack id -> (first offset, records in that MESSAGE), in delivery order
        self.unacked: dict[str, tuple[int, int]] = {}
        self.outstanding = 0  # records delivered and not acknowledged (client-ack modes)

    def can_take(self) -> bool:
        if not self.session.writable or self.state is CursorState.ENDED:
            return False
        return self.ack_mode == ACK_AUTO or self.outstanding < self.prefetch

    def batch_room(self) -> int:
        """Records the next batched MESSAGE may carry: its size, the credit left, and never
        past the range's end."""
        room = self.batch or 1
        if self.ack_mode != ACK_AUTO:
            room = min(room, self.prefetch - self.outstanding)
        if self.end is not None:
            room = min(room, self.end - self.position)
        return room

    def delivered(self, ack_id: str, offset: int, count: int) -> None:
        self.unacked[ack_id] = (offset, count)
        self.outstanding += count

    def at_end(self) -> bool:
        """The bounded range is delivered (what retention removed counts as passed)."""
        return self.end is not None and max(self.position, self.stream.first) >= self.end

    def take_acked(self, ack_id: str) -> list[str]:
        """The ack ids an ACK or NACK of `ack_id` settles (cumulative for ack:client)."""
        if ack_id not in self.unacked:
            return []
        if self.ack_mode == ACK_CLIENT:
            ids = []
            for key in self.unacked:
                ids.append(key)
                if key == ack_id:
                    break
        else:
            ids = [ack_id]
        for key in ids:
            self.outstanding -= self.unacked.pop(key)[1]
        return ids


# After StreamCursor, which it names: a NamedTuple naming a class defined later in its
# module breaks the module's import once compiled by mypyc (docs/benchmarks.md).
class StreamBatch(NamedTuple):
    """K records for one batched MESSAGE (x-stream-batch), in offset order, consecutive
    unless the cursor filters: an outbox item beside the plain Delivery; the server
    encodes it (server/stomp/wire.py), each record with its own offset."""

    subscription: StreamCursor
    messages: list[Message]
    offset: int  # the first record's
    ack_id: str | None  # None for ack:auto


Outgoing = Delivery | StreamBatch  # what the broker's outbox holds for a connection
