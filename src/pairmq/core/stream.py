"""Streams (`/stream/NAME`): an append-only log addressed by dense offsets, and the cursors
that read it. Pure: time comes in as `now`, nothing here journals or delivers (the
Broker's stream side, core/streaming.py, does).

A stream holds, per message, only its index in memory: the `Message` (id, headers, size,
where its body lies in the journal) and its append time. Bodies are paged out once their
record is on disk and read back when delivered. Offsets are dense: the message at offset
`first + i` is the i-th one held; retention removes whole messages from the head only,
and always keeps the newest, so `next` survives a restart without another record.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from pairmq.core.errors import CoreError
from pairmq.core.message import Entry, Message
from pairmq.core.queue import Address
from pairmq.core.settings import Retention
from pairmq.core.subscription import ACK_AUTO, ACK_CLIENT, Delivery

if TYPE_CHECKING:  # session.py names stream cursors too (as queue and subscription do)
    from pairmq.core.session import Session

OFFSET_HEADER = "x-stream-offset"
END_HEADER = "x-stream-end"
BATCH_HEADER = "x-stream-batch"
MAX_BATCH = 10000  # records in one batched MESSAGE, at most
BATCH_BYTES = 1024 * 1024  # a batch stops once its records' sizes reach this (>= 1 record)
_COMPACT_AT = 4096  # dropped head slots kept before the lists are cut


class StartKind(StrEnum):
    """Where a subscription starts (SUBSCRIBE header x-stream-offset, as RabbitMQ)."""

    FIRST = "first"  # the oldest message still held
    LAST = "last"  # the newest message (or what comes next, if none)
    NEXT = "next"  # only what is appended from now on (the default)
    OFFSET = "offset"  # offset=N, or a bare N
    TIMESTAMP = "timestamp"  # the first message appended at or after MS
    GROUP = "group"  # where the consumer group (x-stream-group) stopped


@dataclass(frozen=True, slots=True)
class Start:
    kind: StartKind
    value: int = 0  # the offset or the time, for OFFSET and TIMESTAMP


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
        return Start(StartKind(name), parse_count(f"x-stream-offset {name}", number))
    if word.isdigit() and word.isascii():
        return Start(StartKind.OFFSET, parse_count("x-stream-offset", word))
    raise CoreError(f"x-stream-offset must be first, last, next, group, offset=N, N or "
                    f"timestamp=MS, got {value!r}")


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
    """One stream's messages in offset order, its consumer groups' offsets and readers."""

    __slots__ = ("_head", "_loose", "_messages", "_stamps", "address", "bytes", "cursors",
                 "first", "groups", "key", "name", "retention")

    def __init__(self, destination: str, address: Address, retention: Retention) -> None:
        self.name = destination  # "/stream/NAME"
        self.key = destination  # its journal queue key
        self.address = address  # dup-ids live here; it has no size limit
        self.retention = retention
        self.first = 0  # offset of the oldest message held (== next when empty)
        self.bytes = 0  # sizes (body, headers, 64) of the messages held
        self.groups: dict[str, int] = {}  # consumer group -> offset it processed all below
        self.cursors: list[StreamCursor] = []
        self._messages: list[Message] = []
        self._stamps: list[int] = []  # append time of each message, never decreasing
        self._head = 0  # slots of the lists before it were removed by retention
        self._loose: dict[int, tuple[int, Message]] = {}  # a backup's out-of-order copies

    @property
    def next(self) -> int:
        return self.first + len(self._messages) - self._head

    @property
    def count(self) -> int:
        return len(self._messages) - self._head

    def stamp_for(self, now: int) -> int:
        """The append time of a message appended at `now`: never before the previous one,
        so that a time lookup is a binary search even if the clock stepped back."""
        return max(now, self._stamps[-1]) if self.count else now

    def append(self, message: Message, stamp: int) -> int:
        """Add the message at `next` (its headers already say so); returns its offset."""
        offset = self.next
        self._messages.append(message)
        self._stamps.append(stamp)
        self.bytes += message.size
        return offset

    def at(self, offset: int) -> Message | None:
        if offset < self.first or offset >= self.next:
            return None
        return self._messages[self._head + offset - self.first]

    def run(self, offset: int, most: int, max_bytes: int = BATCH_BYTES) -> list[Message]:
        """Up to `most` consecutive messages from `offset` (fewer at the stream's end), and
        no more once their sizes reach `max_bytes` (one at least): a batch stays a frame
        any client accepts."""
        if offset < self.first:
            return []
        i = self._head + offset - self.first
        run = self._messages[i:i + most]
        total = 0
        for n, message in enumerate(run):
            total += message.size
            if total >= max_bytes:
                return run[:n + 1]
        return run

    def offset_at_time(self, ms: int) -> int:
        """The first offset appended at or after `ms` (`next` when none is)."""
        i = bisect_left(self._stamps, ms, lo=self._head)
        return self.first + i - self._head

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

    def to_remove(self, now: int) -> int:
        """How many head messages retention removes now: while the stream is over
        `max_bytes`, or they are older than `max_age_ms`; never the newest, never one at or
        past the protecting group's offset (all, while that group has committed nothing)."""
        retention = self.retention
        limit = self.count - 1
        if retention.group is not None:
            limit = min(limit, self.groups.get(retention.group, self.first) - self.first)
        if limit <= 0 or not (retention.max_bytes or retention.max_age_ms):
            return 0
        too_old = now - retention.max_age_ms if retention.max_age_ms else None
        left = self.bytes
        n = 0
        head = self._head
        while n < limit:
            over = retention.max_bytes and left > retention.max_bytes
            old = too_old is not None and self._stamps[head + n] < too_old
            if not (over or old):
                break
            left -= self._messages[head + n].size
            n += 1
        return n

    def drop_head(self, n: int) -> list[Message]:
        """Remove the `n` oldest messages; returns them."""
        head = self._head
        gone = self._messages[head:head + n]
        self._head = head + n
        self.first += n
        self.bytes -= sum(m.size for m in gone)
        if self._head >= _COMPACT_AT and self._head * 2 >= len(self._messages):
            del self._messages[:self._head]
            del self._stamps[:self._head]
            self._head = 0
        return gone

    # ----------------------------------------------------------------- rebuilding

    def place(self, offset: int, stamp: int, message: Message) -> Message:
        """A message read back from the journal (recovery, a backup following): at the end
        when it is the next offset; otherwise kept aside until `settle`. Returns the message
        held at that offset (an earlier copy, if there is one)."""
        held = self.at(offset)
        if held is not None and held.message_id == message.message_id:
            return held
        loose = self._loose.get(offset)
        if loose is not None and loose[1].message_id == message.message_id:
            return loose[1]
        if (offset == self.next and self.count) or not (self.count or self._loose):
            if not self.count:
                self.first = offset
                self._head = len(self._messages)
            self.append(message, stamp)
        else:
            self._loose[offset] = (stamp, message)
        return message

    def settle(self) -> list[Message]:
        """Put what arrived out of order in its place; returns messages that cannot be
        (older than a gap: retention removed what was between), now dropped."""
        if not self._loose:
            return []
        held = {self.first + i: (self._stamps[self._head + i], m)
                for i, m in enumerate(self._messages[self._head:])}
        held.update(self._loose)
        self._loose = {}
        offsets = sorted(held)
        start = 0
        for i in range(1, len(offsets)):
            if offsets[i] != offsets[i - 1] + 1:
                start = i
        dropped = [held[o][1] for o in offsets[:start]]
        kept = offsets[start:]
        self._messages = [held[o][1] for o in kept]
        self._stamps = [held[o][0] for o in kept]
        self._head = 0
        self.first = kept[0] if kept else self.next
        self.bytes = sum(m.size for m in self._messages)
        return dropped

    def remove(self, message_id: str) -> Message | None:
        """A backup applies a retention DEL: the head message (or one kept aside)."""
        if self.count and self._messages[self._head].message_id == message_id:
            return self.drop_head(1)[0]
        for offset, (_, message) in self._loose.items():
            if message.message_id == message_id:
                del self._loose[offset]
                return message
        return None

    def entries(self) -> Iterator[Entry]:
        """What the stream holds, as the store accounts durable queues."""
        for message in self._messages[self._head:]:
            yield Entry(message)
        for _, message in self._loose.values():
            yield Entry(message)

    def status(self) -> dict[str, int]:
        return {"first_offset": self.first, "next_offset": self.next,
                "messages": self.count, "bytes": self.bytes, "readers": len(self.cursors)}


class CursorState(StrEnum):
    READING = "reading"  # delivering, or waiting for appends
    ENDED = "ended"  # its range is delivered and the end marker sent: nothing more


class StreamBatch(NamedTuple):
    """K consecutive records for one batched MESSAGE (x-stream-batch): an outbox item beside
    the plain Delivery; the server encodes it (server/wire.py)."""

    subscription: StreamCursor
    messages: list[Message]
    offset: int  # the first record's
    ack_id: str | None  # None for ack:auto


Outgoing = Delivery | StreamBatch  # what the broker's outbox holds for a connection


class StreamCursor:
    """One subscription's position in a stream. Consuming removes nothing: ACK/NACK only
    give back window (prefetch) credit, counted in records (a batch of K takes K)."""

    __slots__ = ("ack_mode", "batch", "destination", "end", "id", "outstanding", "position",
                 "prefetch", "session", "state", "stream", "unacked")

    def __init__(self, session: Session, sub_id: str, stream: StreamLog, position: int,
                 end: int | None, ack_mode: int, prefetch: int,
                 batch: int | None = None) -> None:
        self.session = session
        self.id = sub_id
        self.destination = stream.name
        self.stream = stream
        self.position = position  # the next offset to deliver
        self.end = end  # exclusive end of a bounded range (None: read on forever)
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.batch = batch  # records per MESSAGE (None: plain, one record per MESSAGE)
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
