"""The Broker's stream side (a mixin, like core/broker/intake.py): appending to `/stream/NAME`,
consumer-group commits, retention, stream subscriptions (cursors) and their credit,
recovery and a backup's following of stream records.

A stream's messages are journaled as persistent queue messages are: one ADD with the
stream's name as queue key (the offset is in the stored headers, `x-stream-offset`), a DEL
when retention removes one; so durability, compaction, replication and the delivery gate
treat them as they treat any persistent message. A group commit is a GROUP record.
"""

from __future__ import annotations

from typing import Final

from pairmq.core import records as rec
from pairmq.core.admission import ACCEPTED, Outcome
from pairmq.core.broker.paging import Paging
from pairmq.core.capacity import INDEX_BYTES
from pairmq.core.destinations import STREAM, STREAM_PREFIX, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.message import DEFAULT_PRIORITY, Entry, Message
from pairmq.core.paged_log import PagedLog
from pairmq.core.queue import Address
from pairmq.core.replay import Replay
from pairmq.core.selective import stream_match
from pairmq.core.session import Session
from pairmq.core.settings import AddressFullPolicy
from pairmq.core.stream_log import (
    BATCH_HEADER,
    END_HEADER,
    OFFSET_HEADER,
    CursorState,
    StartKind,
    StreamBatch,
    StreamCursor,
    StreamLog,
    parse_batch,
    parse_count,
    parse_start,
)
from pairmq.core.subscription import ACK_AUTO, Delivery, ack_mode_of

_SERVER_HEADERS: Final = (OFFSET_HEADER, END_HEADER, "x-stream-group", "x-stream-commit-offset")
STREAM_READ: Final = 1000  # records read back from the journal for one plain (unbatched) cursor


class Streams(Paging):
    """The Broker's streams (a mixin)."""

    # ----------------------------------------------------------------- the log

    def _stream(self, destination: str) -> StreamLog:
        stream = self.streams.get(destination)
        if stream is None:
            address = self.addresses.get(destination)
            if address is None:
                address = self.addresses[destination] = Address(
                    destination, STREAM, 0, AddressFullPolicy.PAGE,
                    self.settings.dup_cache_size)
            retention = self.settings.retention_for(destination[len(STREAM_PREFIX):])
            stream = self.streams[destination] = StreamLog(destination, address, retention)
            self.records.append((rec.DEST, destination))
        return stream

    def _stream_route(self, destination: str, stored: dict[str, str], body: bytes,
                      now: int) -> Outcome:
        """A SEND to a stream: a group commit, or an append (always persistent)."""
        stream = self._stream(destination)
        commit = stored.get("x-stream-commit-offset")
        if commit is not None:
            group = stored.get("x-stream-group")
            if not group:
                raise CoreError("x-stream-commit-offset needs an x-stream-group header naming "
                                "the consumer group")
            offset = parse_count("x-stream-commit-offset", commit)
            if stream.commit(group, offset):
                self.records.append((rec.GROUP, destination, group, offset))
                self._retain(stream, now)
            return ACCEPTED
        dup_id = stored.get("dup-id")
        if dup_id is not None:
            self._remember_dup(stream.address, dup_id)
        for name in _SERVER_HEADERS:
            stored.pop(name, None)
        stored.pop("expires", None)  # retention, not expiry, decides how long it stays
        stamp = stream.stamp_for(now)
        stored["timestamp"] = str(stamp)
        stored["persistent"] = "true"
        stored[OFFSET_HEADER] = str(stream.next)
        size = 64 + len(body) + sum(len(k) + len(v) for k, v in stored.items())
        self._message_seq += 1
        self._order_seq += 1
        message = Message(f"{self.id_prefix}{self._message_seq}", destination, stored, body,
                          True, DEFAULT_PRIORITY, 0, size, self._order_seq)
        self.stats["received"] += 1
        stream.address.enqueued += 1
        self.records.append((rec.ADD, message, [stream.key]))
        stream.append(message, stamp)  # in its paged log once on disk (core/paged_log.py)
        self._held(message, 1)
        self._cool(stream)
        self._retain(stream, now)
        self._feed_stream(stream)
        return ACCEPTED

    def _cool(self, stream: StreamLog) -> None:
        """Objects of records past the stream's newest HOT leave memory (their entries stay
        in its log)."""
        for message in stream.cool():
            self._held(message, -1)

    def _stream_located(self, log: PagedLog) -> None:
        """Records of a stream are on disk: the objects of those past its HOT newest may
        leave memory (its one reader is the stream itself, core/stream_log.py), and retention
        may now remove them (it only removes records on disk). The time is the newest
        record's stamp: never later than now, so an age limit removes no more than the
        next tick would. A backup follows the active's removals instead."""
        for stream in log.cursors:
            assert isinstance(stream, StreamLog)
            self._cool(stream)
            if not self.following:
                self._retain(stream, stream.newest_stamp)

    def _held(self, message: Message, sign: int) -> None:
        capacity = self.capacity
        capacity.memory += sign * (message.size + INDEX_BYTES)
        if sign > 0 and capacity.memory > capacity.trip_at:
            self._server_changed(capacity.check_memory())

    def _retain(self, stream: StreamLog, now: int) -> None:
        n = stream.to_remove(now)
        if not n:
            return
        self._removed(stream, stream.drop_head(n))

    def _removed(self, stream: StreamLog, gone: list[tuple[int, int, Message | None]]
                 ) -> None:
        """Head records removed: journaled (by enqueue order: most have no object), and
        their log entries let go of."""
        for order, size, message in gone:
            if message is not None:
                self._held(message, -1)
            else:  # only in the journal: the removal names it by its order
                message = Message("", stream.name, {}, None, True, DEFAULT_PRIORITY, 0, size,
                                  order)
            self.records.append((rec.DEL, stream.key, message))
        if gone:
            self.moved_logs[stream.log] = None

    def retain_streams(self, now: int) -> int:
        """Apply every stream's retention (the periodic tick); returns messages removed."""
        removed = 0
        for stream in self.streams.values():
            before = stream.first
            self._retain(stream, now)
            removed += stream.first - before
        return removed

    def stream_status(self) -> dict[str, dict[str, int]]:
        return {name: stream.status() for name, stream in self.streams.items()}

    def stream_groups(self, stream: str) -> dict[str, int]:
        """A stream's consumer groups and the offset each will read next."""
        found = self.streams.get(stream)
        return dict(found.groups) if found is not None else {}

    def group_offset(self, stream: str, group: str) -> int | None:
        found = self.streams.get(stream)
        return found.groups.get(group) if found is not None else None

    # ----------------------------------------------------------------- reading

    def subscribe_stream(self, conn_id: int, sub_id: str, destination: str,
                         headers: dict[str, str], ack: str = "auto",
                         prefetch: int | None = None) -> tuple[int, int]:
        """A SUBSCRIBE to a stream; returns the stream's (first, next) offsets as of now."""
        session = self._session(conn_id)
        session.check_free(sub_id, self.settings.max_subscriptions_per_connection)
        ack_mode = ack_mode_of(ack)
        kind, _ = parse_destination(destination)
        self._may_create(destination, kind)
        if kind != STREAM:
            raise CoreError(f"{destination!r} is not a stream")
        start = parse_start(headers.get("x-stream-offset"))
        end_value = headers.get("x-stream-end-offset")
        end = parse_count("x-stream-end-offset", end_value) if end_value is not None else None
        batch = parse_batch(headers.get(BATCH_HEADER))
        match = stream_match(headers)  # a selector, x-stream-filter (core/selective.py)
        group = headers.get("x-stream-group")
        if start.kind is StartKind.GROUP and not group:
            raise CoreError("x-stream-offset:group needs an x-stream-group header")
        stream = self.streams.get(destination)
        if stream is None:
            if headers.get("x-stream-must-exist") == "true":
                raise CoreError(f"unknown stream {destination}")
            stream = self._stream(destination)
        if start.kind is StartKind.GROUP:
            assert group is not None
            position = stream.groups.get(group, stream.first)
        else:
            position = stream.resolve(start)
        if end is not None and start.kind is StartKind.OFFSET and end < start.value:
            raise CoreError(f"x-stream-end-offset {end} is before the start offset "
                            f"{start.value}")
        if not prefetch or prefetch <= 0:
            prefetch = self.settings.default_prefetch
        cursor = StreamCursor(session, sub_id, stream, position, end, ack_mode, prefetch,
                              batch, match)
        session.cursors[sub_id] = cursor
        stream.cursors.append(cursor)
        info = (stream.first, stream.next)
        self._feed(cursor)
        return info

    def _stream_unsubscribe(self, session: Session, sub_id: str | None) -> bool:
        cursor = session.cursors.pop(sub_id, None) if sub_id is not None else None
        if cursor is None:
            return False
        self._close_cursor(cursor)
        return True

    def _drop_cursors(self, session: Session) -> None:
        for cursor in session.cursors.values():
            self._close_cursor(cursor)
        session.cursors.clear()

    @staticmethod
    def _close_cursor(cursor: StreamCursor) -> None:
        if cursor in cursor.stream.cursors:
            cursor.stream.cursors.remove(cursor)
        cursor.state = CursorState.ENDED

    def _stream_acked(self, session: Session, ack_id: str) -> bool:
        """An ACK or NACK of a stream delivery: it only gives back credit."""
        for cursor in session.cursors.values():
            if ack_id in cursor.unacked:
                settled = set(cursor.take_acked(ack_id))
                index = session.legacy_index
                if index:  # STOMP 1.0/1.1: forget the message ids that named them
                    for key in [k for k, v in index.items() if v in settled]:
                        del index[key]
                self._feed(cursor)
                return True
        return False

    def _feed_streams(self, session: Session) -> None:
        for cursor in list(session.cursors.values()):
            self._feed(cursor)

    def _resume_cursors(self, session: Session, last_ack: int) -> int:
        """Deliveries after `last_ack` were lost with the socket: read them again."""
        lost = 0
        for cursor in session.cursors.values():
            gone = [(k, o) for k, o in cursor.unacked.items() if k.isdigit() and int(k) > last_ack]
            for key, (offset, count) in gone:
                del cursor.unacked[key]
                cursor.outstanding -= count
                cursor.position = min(cursor.position, offset)
                cursor.state = CursorState.READING
                lost += count
        return lost

    def _feed_stream(self, stream: StreamLog) -> None:
        for cursor in list(stream.cursors):
            self._feed(cursor)

    def _feed(self, cursor: StreamCursor) -> None:
        """Hand the cursor what it may take now: messages up to its window (in batches of
        consecutive records with x-stream-batch), then (for a bounded range) the end
        marker."""
        stream = cursor.stream
        session = cursor.session
        box = self.outbox.get(session.id)
        while cursor.can_take():
            if cursor.position < stream.first:
                cursor.position = stream.first  # retention removed what it would read
            if cursor.at_end():
                assert cursor.end is not None
                self._deliver_cursor(cursor, self._end_marker(cursor), cursor.end)
                cursor.state = CursorState.ENDED
                return
            if cursor.ack_mode == ACK_AUTO:
                if box is None:
                    box = self.outbox.get(session.id)
                # a turn's output is bounded by the window, in records (so about
                # prefetch / batch batched frames)
                if box is not None and len(box) * (cursor.batch or 1) >= cursor.prefetch:
                    if cursor.position < stream.next:
                        self._capped.add(session.id)  # the rest next turn (as for queues)
                    return
            if stream.cold(cursor.position):  # only in the journal: the store reads it back
                self.stream_reads[cursor] = None
                return
            if cursor.batch is not None:
                run = stream.run(cursor.position, cursor.batch_room())
                if not run:
                    return  # waits for appends
                self._deliver_batch(cursor, run)
                continue
            message = stream.at(cursor.position)
            if message is None:
                return  # waits for appends
            self._deliver_record(cursor, message)

    def take_stream_reads(self, most: int, cut: bool = True
                          ) -> list[tuple[StreamCursor, list[int]]]:
        """(cursor, offsets to read back) for cursors whose next records are held only in
        the journal, `most` records in all (reading them back and sending them is a turn's
        work: the other cursors wait in `stream_reads` for the next call); the store reads
        them and `stream_read` delivers them. Only the first read of a call, and only with
        `cut`, may be cut short by `most`: a cursor whose run does not fit waits for the
        next call, or a turn that read 1,000 records for one reader would send the next a
        batch of 24, and both readers then ACK ever smaller batches."""
        wanted, self.stream_reads = self.stream_reads, {}
        out: list[tuple[StreamCursor, list[int]]] = []
        for cursor in wanted:
            if not cursor.can_take() or cursor not in cursor.stream.cursors:
                continue  # fed again once it can take (set_writable, an ACK)
            if most <= 0:
                self.stream_reads[cursor] = None
                continue
            room = cursor.batch_room() if cursor.batch is not None else min(
                cursor.prefetch - cursor.outstanding if cursor.ack_mode != ACK_AUTO
                else cursor.prefetch, STREAM_READ)
            if cursor.end is not None:
                room = min(room, cursor.end - cursor.position)
            if room > most and (out or not cut):
                self.stream_reads[cursor] = None
                continue
            offsets = cursor.stream.cold_run(cursor.position, max(1, min(room, most)))
            if offsets:
                out.append((cursor, offsets))
                most -= len(offsets)
        return out

    def stream_read(self, cursor: StreamCursor, offsets: list[int],
                    messages: list[Message]) -> None:
        """The store read these records back: deliver them (if the cursor still reads
        there), then go on."""
        if cursor.state is CursorState.ENDED or cursor.position != offsets[0] \
                or cursor not in cursor.stream.cursors:
            return
        if cursor.batch is not None:
            self._deliver_batch(cursor, messages)
        else:
            for message in messages:
                self._deliver_record(cursor, message)
        self._feed(cursor)

    def _deliver_batch(self, cursor: StreamCursor, run: list[Message]) -> None:
        """The records from the cursor's position on, in one MESSAGE; the cursor moves past
        them all, and a filtering cursor sends only those it keeps (nothing if none)."""
        offset = cursor.position
        cursor.position += len(run)
        match = cursor.match
        if match is not None:
            run = [m for m in run if match(m.headers)]
            if not run:
                return
            offset = int(run[0].headers[OFFSET_HEADER])
        session = cursor.session
        ack_id = None
        first = run[0]
        if cursor.ack_mode != ACK_AUTO:
            session.ack_seq += 1
            ack_id = str(session.ack_seq)
            cursor.delivered(ack_id, offset, len(run))
            index = session.legacy_index
            if index is not None:
                index[(cursor.id, first.message_id)] = ack_id
                index[("", first.message_id)] = ack_id
        self.stats["delivered"] += len(run)
        box = self.outbox.get(session.id)
        if box is None:
            box = self.outbox[session.id] = []
        box.append(StreamBatch(cursor, run, offset, ack_id))

    def _deliver_record(self, cursor: StreamCursor, message: Message) -> None:
        """The record at the cursor's position, unless the cursor filters it out; the
        cursor moves past it either way."""
        offset = cursor.position
        cursor.position = offset + 1
        if cursor.match is None or cursor.match(message.headers):
            self._deliver_cursor(cursor, message, offset)

    def _deliver_cursor(self, cursor: StreamCursor, message: Message, offset: int) -> None:
        session = cursor.session
        ack_id = None
        if cursor.ack_mode != ACK_AUTO:
            session.ack_seq += 1
            ack_id = str(session.ack_seq)
            cursor.delivered(ack_id, offset, 1)
            index = session.legacy_index
            if index is not None:
                index[(cursor.id, message.message_id)] = ack_id
                index[("", message.message_id)] = ack_id
        self.stats["delivered"] += 1
        box = self.outbox.get(session.id)
        if box is None:
            box = self.outbox[session.id] = []
        box.append(Delivery(cursor, Entry(message, 1), ack_id, 1))

    def _end_marker(self, cursor: StreamCursor) -> Message:
        self._message_seq += 1
        return Message(f"{self.id_prefix}{self._message_seq}", cursor.destination,
                       {END_HEADER: "true", OFFSET_HEADER: str(cursor.end)}, b"", False)

    # ----------------------------------------------------------------- recovery, following

    def _restore_streams(self, replay: Replay) -> int:
        """Streams the journal rebuilt (each a paged log by offset); returns the highest
        enqueue order among them."""
        top = 0
        for key, (log, first, nbytes, last_stamp) in replay.streams.items():
            stream = self._stream(key)
            stream.restore(log, first, nbytes, last_stamp)
            top = max(top, log.last_order)
        for destination, groups in replay.groups.items():
            stream = self._stream(destination)
            stream.groups.update(groups)
        return top

    def _follow_stream_add(self, key: str, message: Message) -> Message:
        """A backup: the stream's message, appended (or, at an offset it holds, a copy:
        ignored; the object comes back without a log, nothing to locate)."""
        stream = self._stream(key)
        offset = int(message.headers[OFFSET_HEADER])
        if message.order > self._order_seq:
            self._order_seq = message.order
        if stream.place(offset, message) is None:
            return message
        self._held(message, 1)
        self._cool(stream)
        return message

    def _follow_stream_remove(self, key: str, message_id: str, order: int = -1
                              ) -> Message | None:
        stream = self.streams.get(key)
        if stream is not None:
            self._removed(stream, stream.remove_head(order))
        return None

    def follow_group(self, stream: str, group: str, offset: int) -> None:
        self._stream(stream).commit(group, offset)

    def _settle_streams(self) -> list[Message]:
        """Nothing a stream holds waits to be put in place (records come in offset order:
        segments holding a stream's records are never compacted)."""
        dropped: list[Message] = []
        return dropped
