"""The durable store: journals the broker's records, pages their bodies, reads them back.

Liveness: every object whose newest record is in a segment (a message held by a
durable queue, a destination, a durable subscription, a remembered dup-id) is in
that segment's `live` set. A segment with nothing live is deleted; an old segment
with little live is compacted by re-appending its live objects at the head, in
small steps on the event loop, then deleting it once those records are on disk.

`Store` is written in parts (store/store_state.py): appends, liveness and reading bodies
back here, recovery in store/recovery.py, compaction in store/compaction.py, a backup's
mirror in store/mirror.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Final

from pairmq.core import Broker, Message
from pairmq.core import records as rec
from pairmq.core.commit_ledger import CommitRun
from pairmq.core.paged_log import PagedLog
from pairmq.core.records import Record
from pairmq.store.reading import DUPS_RECORD, EPOCH_RECORD
from pairmq.store.records import (
    encode_add,
    encode_del,
    encode_delivered,
    encode_dest,
    encode_dup,
    encode_dups,
    encode_durable,
    encode_epoch,
    encode_group,
    encode_producer,
    encode_rule,
    encode_tx_done,
    encode_tx_drop,
    encode_tx_end,
    encode_tx_send,
    encode_undest,
    encode_undurable,
    encode_unrule,
    encode_unuser,
    encode_user,
)
from pairmq.store.recovery import Recovering
from pairmq.store.stall import StallView
from pairmq.store.store_state import KEY_OVERHEAD
from pairmq.store.summary_builder import Added, SummaryBuilder
from pairmq.store.writer import JournalWriter, LiveKey, SegmentInfo

log = logging.getLogger("pairmq.store")

# Record kinds a run of new messages may hold (store/summary.py): the messages and their
# dup-ids, and bookkeeping that writes nothing
_SUMMARISED: Final = frozenset({rec.ADD, rec.DUP, rec.DUP_EVICT, rec.PRODUCER_FORGET})
# the kinds `persist` meets for every message, as module constants (no attribute lookup)
_ADD: Final = rec.ADD
_DEL: Final = rec.DEL
_DELIVERED: Final = rec.DELIVERED
_DUP: Final = rec.DUP
_PRODUCER: Final = rec.PRODUCER
_RUN_GAP: Final = 16 * 1024  # read_bodies: record bytes between two bodies read along with them
_RUN_BYTES: Final = 8 * 1024 * 1024  # ... and at most this much in one pread


class Store(Recovering):
    """The journal of one server (its state: store/store_state.py)."""

    # ------------------------------------------------------------ serving

    def start(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        """Open the journal for appends and account what the recovered broker holds."""
        self._open(broker, loop)

    def _open(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.writer = JournalWriter(self.directory, self.settings.segment_bytes,
                                    self._last_seq, self._segments, loop,
                                    self.settings.stall_timeout_s)
        self.summaries = SummaryBuilder(self.writer.write_summary,
                                        self.settings.partial_summary_bytes,
                                        self.settings.summary_records_per_item)
        if self._accounted is not broker:
            self.account(broker)
        self._listen()

    def _listen(self) -> None:
        assert self.writer is not None
        self.writer.on_synced(self._synced)
        self.writer.on_failure(lambda error: self._notify_full())

    @property
    def full(self) -> bool:
        """New persistent messages cannot be confirmed: the disk failed or the limit is hit."""
        writer = self.writer
        if writer is None:
            return False
        if writer.failure is not None or writer.short_of_space or self._refused_by:
            return True
        limit = self.settings.max_journal_bytes
        return bool(limit) and writer.total_bytes >= limit

    def full_reason(self) -> str:
        if self._refused_by:
            return self._refused_by
        writer = self.writer
        if writer is not None and writer.failure is not None:
            return f"journal write failed: {writer.failure.strerror or writer.failure}"
        if writer is not None and writer.short_of_space:
            return "the disk is full (the journal's reserve is in use)"
        return (f"journal is full ({self.settings.max_journal_bytes} bytes, the configured "
                "max_journal_bytes)")

    def refuse_new(self, reason: str | None) -> None:
        """Something past the disk cannot take new messages ([store] url: the database is
        away): they are refused or held per full_policy, as on a full disk, until None."""
        self._refused_by = reason
        self._notify_full()

    def on_full_change(self, listener: Callable[[bool], None]) -> None:
        self._full_listeners.append(listener)

    def _notify_full(self) -> None:
        full = self.full
        if full == self._was_full:
            return
        self._was_full = full
        for listener in self._full_listeners:
            listener(full)

    def persist(self, records: list[Record]) -> int:
        """Journal one command's records as one atomic group; returns its sequence number."""
        writer = self.writer
        assert writer is not None
        parts: list[bytes] = []
        added: list[tuple[Message, list[str], int, bytes]] = []  # message, queues, body at, body
        keys: list[LiveKey] = []
        pending: dict[int, int] = {}  # id(message) -> its place in `added` (an ADD here)
        # a producer's newest state in this group: one entry each, after the messages
        producers: dict[tuple[str, str], Record] = {}
        size = 0
        paged: list[tuple[Message, int, int]] = []  # paged messages: entry at, its length
        summarised: list[Added] | None = []  # new messages, while nothing else comes
        dups: list[tuple[str, str]] = []  # ... and their dup-ids
        runs_begun: list[CommitRun] = []  # COMMITs in slices whose first TX_SEND this is
        runs_ended: list[CommitRun] = []  # ... and those whose last record this is
        # Typed, not left as the records' Any: the compiled build reads their attributes
        # natively instead of by name (docs/benchmarks.md).
        message: Message
        queue_keys: list[str]
        queue_key: str
        for record in records:
            kind: int = record[0]
            # The kinds every message brings first, the others in `_entry_of`. A run of new
            # messages (`summarised`) ends at any kind but those _SUMMARISED holds.
            if kind == _ADD:
                message, queue_keys = record[1], record[2]
                body = message.body if message.body is not None else self.read_body(message)
                entry, body_at = encode_add(message.order, message.message_id,
                                            message.destination, message.priority,
                                            message.expires, message.persistent, 0,
                                            message.headers, body, queue_keys)
                if summarised is not None:
                    summarised.append((message.destination, queue_keys, size, len(entry),
                                       message.order, message.headers))
                if message.log is not None:  # no object kept: its log gets the entry
                    paged.append((message, size, len(entry)))
                else:
                    pending[id(message)] = len(added)
                    added.append((message, queue_keys, size + body_at, body))
            elif kind == _DEL:
                summarised = None
                queue_key, message = record[1], record[2]
                entry = encode_del(queue_key, message.message_id, message.order)
                at = pending.get(id(message)) if message.journal_queues is None else None
                if at is not None:
                    # Added and removed in this very group (an auto-ack consumer, a
                    # stream's retention): that queue never holds it once this is on disk.
                    held, keys_of, body_at, body = added[at]
                    added[at] = (held, [k for k in keys_of if k != queue_key], body_at, body)
                if message.journal_delivered:
                    message.journal_delivered.pop(queue_key, None)
                self._release(message, queue_key)
            elif kind == _DELIVERED:
                summarised = None
                queue_key, message = record[1], record[2]
                deliveries: int = record[3]
                entry = encode_delivered(queue_key, message.message_id, deliveries,
                                         message.order)
                if message.journal_delivered is None:
                    message.journal_delivered = {}
                message.journal_delivered[queue_key] = deliveries
            elif kind == _PRODUCER:
                producers[(record[1], record[2])] = record
                continue
            else:
                if kind == _DUP:
                    dups.append((record[1], record[2]))
                elif kind not in _SUMMARISED:
                    summarised = None
                found = self._entry_of(record, keys, producers, runs_begun, runs_ended)
                if found is None:
                    continue
                entry = found
            parts.append(entry)
            size += len(entry)
        for record in producers.values():
            parts.append(encode_producer(*record[1:]))
            keys.append(("producer", record[1], record[2]))
        # Even with nothing to write (bookkeeping only) a record is appended: the receipts of
        # the frames that made it wait for this very sequence number (their ticket).
        payload = b"".join(parts)
        seq, segment_id, offset = writer.append(payload, self.epoch)
        if summarised:
            self.summaries.adds(seq, self.epoch, segment_id, offset, offset + len(payload),
                                summarised, [r[1:] for r in producers.values()], dups)
        else:
            self.summaries.opaque(seq, self.epoch, segment_id, offset, offset + len(payload))
        info = writer.segments[segment_id]
        for run in runs_begun:  # kept until the run is done (core/broker/committing.py)
            run.segment = segment_id
        for run in runs_ended:  # ... and its last record is on disk
            if run.segment is not None:
                self._commit_tails[run.segment] = seq
        for message, at, length in paged:
            self.pages.written(seq, message, segment_id, offset + at, length)
            message.journal_seq = seq  # a stream's newest are delivered from memory
        paged_before = self.paged.total
        for message, queue_keys, body_at, body in added:
            if not queue_keys:  # nothing holds it (see DEL above); its delivery still
                message.journal_seq = seq  # waits for this record (server/role/role.py)
                continue
            if message.body is None:
                # A paged-out message moved by compaction (or dead-lettered): its new copy is
                # not on disk yet, so hold the body in memory until it is (it is paged out
                # again once synced).
                if message.journal_queues:
                    self.paged.count(message, -1)
                message.body = body
                message.body_length = len(body)
                self.memory_bytes += len(body)
                self._to_page.append((seq, message))
                self._locate(message, info, queue_keys, offset + body_at, seq, counted=True)
            else:
                self._locate(message, info, queue_keys, offset + body_at, seq)
        for key in keys:
            self._forget(key)
            info.live.add(key)
            info.live_bytes += KEY_OVERHEAD
        if self.paged.total != paged_before and self.broker is not None:
            self.broker.set_paged_bytes(self.paged.total)
        return seq

    def _entry_of(self, record: Record, keys: list[LiveKey],
                  producers: dict[tuple[str, str], Record], runs_begun: list[CommitRun],
                  runs_ended: list[CommitRun]) -> bytes | None:
        """The journal entry of a record of a kind no message brings (`persist` writes
        those itself), noting what keeps its segment; None: bookkeeping, nothing written."""
        kind = record[0]
        if kind == rec.DURABLE:
            entry = encode_durable(record[1], record[2])
            keys.append(("durable", record[1]))
        elif kind == rec.UNDURABLE:
            entry = encode_undurable(record[1])
            self._forget(("durable", record[1]))
        elif kind == rec.DEST:
            entry = encode_dest(*record[1:])  # (destination[, settings])
            keys.append(("dest", record[1]))
        elif kind == rec.UNDEST:
            entry = encode_undest(record[1])
            self._forget(("dest", record[1]))
        elif kind == rec.USER:
            entry = encode_user(record[1], record[2], record[3])
            keys.append(("user", record[1]))
        elif kind == rec.UNUSER:
            entry = encode_unuser(record[1])
            keys.append(("user", record[1]))  # the removal lives on (core/accounts.py)
        elif kind == rec.RULE:
            entry = encode_rule(record[1], record[2])
            keys.append(("rule", record[1]))
        elif kind == rec.UNRULE:
            entry = encode_unrule(record[1])
            keys.append(("rule", record[1]))
        elif kind == _DUP:
            entry = encode_dup(record[1], record[2])
            keys.append(("dup", record[1], record[2]))
        elif kind == rec.GROUP:
            entry = encode_group(record[1], record[2], record[3])
            keys.append(("group", record[1], record[2]))
        elif kind == rec.DUP_EVICT:
            self._forget(("dup", record[1], record[2]))
            return None
        elif kind == rec.PRODUCER_FORGET:
            producers.pop((record[1], record[2]), None)
            self._forget(("producer", record[1], record[2]))
            return None
        elif kind == EPOCH_RECORD:
            entry = encode_epoch(record[1])
            keys.append(("epoch", record[1]))
        elif kind == DUPS_RECORD:
            entry = encode_dups(record[1], record[2])
            keys.extend(("dup", record[1], dup_id) for dup_id in record[2])
        elif kind == rec.TX_SEND:  # a COMMIT in slices (core/broker/committing.py)
            run, send = record[1], record[2]
            entry = encode_tx_send(run.key, send.destination, send.headers, send.body)
            if run.segment is None and (not runs_begun or runs_begun[-1] is not run):
                runs_begun.append(run)
        elif kind == rec.TX_END:
            entry = encode_tx_end(record[1].key, len(record[1].sends))
        elif kind == rec.TX_DONE:
            entry = encode_tx_done(record[1].key, record[2])
            if record[2] == len(record[1].sends):
                runs_ended.append(record[1])
        elif kind == rec.TX_DROP:
            entry = encode_tx_drop(record[1].key)
            runs_ended.append(record[1])
        else:
            raise ValueError(f"unknown record kind {kind}")
        return entry

    def _locate(self, message: Message, info: SegmentInfo, queue_keys: list[str],
                body_offset: int, seq: int, counted: bool = False) -> None:
        if message.journal_queues:
            self._release_all(message, keep_body=counted)  # a compaction copy moves it
        message.journal_segment = info.segment_id
        message.journal_seq = seq
        message.journal_queues = list(queue_keys)
        message.body_offset = body_offset
        if message.body is not None and not counted:
            message.body_length = len(message.body)
            if message.page_out \
                    or self.memory_bytes + message.body_length > self.settings.paging_bytes:
                self._to_page.append((seq, message))
            self.memory_bytes += message.body_length
        info.live.add(message)
        info.live_bytes += message.size

    def _release(self, message: Message, queue_key: str) -> None:
        """One durable queue let go of the message."""
        held = message.journal_queues
        if not held:
            return
        if queue_key in held:
            held.remove(queue_key)
        if not held:
            self._release_all(message)

    def _release_all(self, message: Message, keep_body: bool = False) -> None:
        writer = self.writer
        assert writer is not None
        info = writer.segments.get(message.journal_segment)
        if info is not None and message in info.live:
            info.live.discard(message)
            info.live_bytes -= message.size
        if message.body is None:
            self.paged.count(message, -1)
        elif not keep_body:
            self.memory_bytes -= message.body_length
        message.journal_queues = None

    def _forget(self, key: LiveKey) -> None:
        writer = self.writer
        assert writer is not None
        for info in writer.segments.values():
            if key in info.live:
                info.live.discard(key)
                info.live_bytes -= KEY_OVERHEAD
                return

    def page_in(self, log: PagedLog, numbers: list[int], queue_key: str) -> list[Message]:
        """Paged messages of a queue (its entries `numbers`), read back from the journal;
        each is a live message of that queue from now on (as if it had been in memory all
        along)."""
        segments = self._writer_segments()
        messages = []
        for message, segment_id, body_offset, seq in self.pages.page_in(log, numbers):
            self._locate(message, segments[segment_id], [queue_key], body_offset, seq)
            messages.append(message)
        return messages

    def read_stream(self, log: PagedLog, offsets: list[int]) -> list[Message]:
        """A stream's records at `offsets`, read back from the journal to deliver (the
        stream keeps their entries; nothing else tracks these objects)."""
        messages = []
        for message, _segment, _body_offset, seq in self.pages.page_in(log, offsets):
            message.journal_seq = seq  # delivered once confirmed, as any record
            messages.append(message)
        return messages

    def release_paged(self, log: PagedLog) -> None:
        """Every reader of `log` passed some entries: they hold no segment any more."""
        self.pages.release(log)

    def read_body(self, message: Message) -> bytes:
        """A paged-out body, read back from its segment (page cache, usually)."""
        if message.body is not None:
            return message.body
        segment_id = message.journal_segment
        fd = self._read_fd(segment_id)
        body = os.pread(fd, message.body_length, message.body_offset)
        if len(body) != message.body_length:
            raise OSError(f"journal segment {segment_id}: read {len(body)} of "
                          f"{message.body_length} body bytes of {message.message_id} at offset "
                          f"{message.body_offset}")
        return body

    def read_bodies(self, messages: list[Message]) -> list[bytes | memoryview]:
        """The bodies of consecutive stream messages (a batched MESSAGE): those lying close
        together in one segment, as appended records do, come from one `pread`."""
        bodies: list[bytes | memoryview] = []
        i = 0
        count = len(messages)
        while i < count:
            first = messages[i]
            if first.body is not None:
                bodies.append(first.body)
                i += 1
                continue
            segment_id = first.journal_segment
            start = first.body_offset
            end = start + first.body_length
            j = i + 1
            while j < count:
                m = messages[j]
                if (m.body is not None or m.journal_segment != segment_id
                        or not end <= m.body_offset <= end + _RUN_GAP
                        or m.body_offset + m.body_length - start > _RUN_BYTES):
                    break
                end = m.body_offset + m.body_length
                j += 1
            if j == i + 1:
                bodies.append(self.read_body(first))
                i = j
                continue
            fd = self._read_fds.get(segment_id)
            if fd is None:
                path = self.directory / f"journal-{segment_id:08d}.seg"
                fd = self._read_fds[segment_id] = os.open(path, os.O_RDONLY)
            span = memoryview(os.pread(fd, end - start, start))
            if len(span) != end - start:
                raise OSError(f"journal segment {segment_id}: read {len(span)} of "
                              f"{end - start} body bytes at offset {start}")
            for m in messages[i:j]:
                at = m.body_offset - start
                bodies.append(span[at:at + m.body_length])
            i = j
        return bodies

    def when_synced(self, seq: int, callback: Callable[[], None]) -> None:
        assert self.writer is not None
        self.writer.when_synced(seq, callback)

    def _synced(self, seq: int) -> None:
        located = self.pages.synced(seq)
        if located and self.broker is not None:
            for log in located:
                self.broker.pages_located(log)
        if self._to_page:
            keep = []
            for page_seq, message in self._to_page:
                if page_seq > seq:
                    keep.append((page_seq, message))
                elif message.journal_queues and message.body is not None:
                    message.body = None  # on disk now: hold only the index in memory
                    message.wire = None
                    self.memory_bytes -= message.body_length
                    self.paged.count(message, 1)
            self._to_page = keep
            if self.broker is not None:
                self.broker.set_paged_bytes(self.paged.total)
        self._maybe_compact()
        if self.settings.max_journal_bytes:
            self._notify_full()

    def fence(self, guard: Callable[[], bool]) -> None:
        """Write only while `guard()` says so (a shared journal: while the lock is proven);
        held groups are written once it does again, or dropped with the writer."""
        assert self.writer is not None
        self.writer.guard = guard

    def begin_epoch(self, epoch: int) -> int:
        """This server becomes active with `epoch`: journal it before anything else."""
        assert self.writer is not None
        self.epoch = epoch
        seq = self.persist([(EPOCH_RECORD, epoch)])
        self.epochs.append((epoch, seq))
        return seq

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self._close_read_fds()

    def stall_view(self) -> StallView | None:
        """Whether the journal's disk completes writes (store/stall.py); None when closed."""
        return None if self.writer is None else self.writer.stall_view()

    async def close_off_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """`close`, with the wait for the write in flight in a thread: on a stalled disk
        that wait lasts as long as the stall, and the event loop must go on meanwhile
        (heartbeats, the witness, the other clients: issue 35)."""
        writer = self.writer
        if writer is not None:
            writer.stop()
            await loop.run_in_executor(None, writer.release)
        self._close_read_fds()
