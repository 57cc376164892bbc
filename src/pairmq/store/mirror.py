"""A backup's store: the active server's records appended as they are, and applied to the
backup's broker as they arrive, so that taking over is switching the journal to appends.

One part of the Store (store/store_state.py). Each mirrored record is decoded as recovery
decodes it (store/record_decoding.py) and applied by the broker's follower
(core/broker/follow.py); the store keeps the same liveness it keeps when serving (which
segment holds the newest record of each live object) and pages bodies the same way (over
the paging budget, or for a full destination under address_full_policy page, a body stays
in the journal once synced and the broker keeps its index). A backup never compacts: the
active's compaction copies come through the stream and its horizon drops the segments
they emptied. `serve_mirrored` ends following; compaction then runs as on any active.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Final

from pairmq.core import Broker, Message
from pairmq.core.destinations import STREAM_PREFIX
from pairmq.store import record_decoding as decoding
from pairmq.store import records as disk
from pairmq.store.paging import PagedBytes
from pairmq.store.reading import COMMIT_ENTRIES, follow_commit, message_of
from pairmq.store.record_decoding import AckEntry, DecodedEntry, LoneAdd, decode_entries
from pairmq.store.records import RECORD_HEADER
from pairmq.store.segments import list_segments
from pairmq.store.store_state import KEY_OVERHEAD, StoreState
from pairmq.store.summary import remove_all_summaries
from pairmq.store.summary_builder import SummaryBuilder, summarise_entries
from pairmq.store.writer import JournalWriter, LiveKey, SegmentInfo

log = logging.getLogger("pairmq.store")
ACK_KINDS: Final = (disk.DEL_ORDER, disk.DELIVERED_ORDER)  # `decoding.decode_acks` reads these


class Mirroring(StoreState):
    """The Store's backup side."""

    def open_mirror(self, loop: asyncio.AbstractEventLoop, broker: Broker) -> None:
        """Open the recovered journal for a backup: records come framed from the active and
        are applied to `broker`, which holds what recovery rebuilt (and may index it for
        following already: in a thread, with the recovery)."""
        self.mirror = True
        self._open(broker, loop)
        if not broker.following:
            broker.start_following()

    def serve_mirrored(self) -> None:
        """Taking over: the broker holds what the journal holds; appends go on from here."""
        broker = self.broker
        assert broker is not None and self.mirror
        for message in broker.end_following():
            if message.journal_queues:
                self._release_all(message)
        self.mirror = False
        self._maybe_compact()

    def append_mirrored(self, records: list[tuple[int, int, bytes]]) -> None:
        """Append the active's records (seq, epoch, bytes) and apply them to the broker.
        All are queued and handed to the writer thread first, then applied while the thread
        writes and syncs them: the backup's acknowledgement, which waits for the sync, no
        longer waits for the apply too. It cannot overtake the apply either: the sync is
        reported on this loop, after this call returns. So every record the backup has
        acknowledged is applied, and a takeover (which runs on the loop) finds them all."""
        writer = self.writer
        assert writer is not None and self.mirror
        places = [writer.append_record(seq, record) for seq, _, record in records]
        writer.write_now()
        for (seq, epoch, record), (_, segment_id, offset) in zip(records, places, strict=True):
            self._apply_mirrored(seq, epoch, record, segment_id, offset)

    def _apply_mirrored(self, seq: int, epoch: int, record: bytes, segment_id: int,
                        offset: int) -> None:
        writer = self.writer
        assert writer is not None
        if epoch != self.epoch:
            self.epochs.append((epoch, seq))
            self.epoch = epoch
        payload = memoryview(record)[RECORD_HEADER.size:]
        info = writer.segments[segment_id]
        end = offset + len(payload)
        kind = payload[0]
        if kind == disk.ADD or kind == disk.PRODUCER:
            lone = decoding.decode_lone_add(payload) if kind == disk.ADD else None
            if lone is not None:  # the common record, one message added
                if lone[4]:  # delivered before: not a summary's plain add
                    self.summaries.opaque(seq, epoch, segment_id, offset, end)
                else:
                    self.summaries.adds(seq, epoch, segment_id, offset, end,
                                        [(lone[6], lone[8], 0, len(payload), lone[0], lone[7])],
                                        [], [])
                self._follow_lone_add(lone, payload, seq, info, offset, (0, len(payload)))
                broker = self.broker
                assert broker is not None
                broker.take_records()
                broker.take_events()
                return
            producers: list[DecodedEntry] = []
            acks: list[tuple[int, AckEntry]] = []
            adds = decoding.decode_adds(payload, producers, acks)
            if adds is not None:  # a turn's messages, handed to consumers in the same turn
                self._follow_adds(adds, producers, acks, payload, seq, epoch, info, offset)
                return
        elif kind in ACK_KINDS:
            only_acks = decoding.decode_acks(payload)
            if only_acks is not None:  # the other common record: consumers' acknowledgements
                self.summaries.opaque(seq, epoch, segment_id, offset, end)
                self._follow_acks(only_acks)
                return
        entries = decode_entries(payload, load_bodies=False)
        summarise_entries(self.summaries, entries, seq, epoch, segment_id, offset, end)
        self._follow(entries, payload, seq, info, offset)

    def _follow_lone_add(self, add: LoneAdd, payload: memoryview, seq: int, info: SegmentInfo,
                         offset: int, span: tuple[int, int]) -> None:
        """One message added, from its `decoding.decode_lone_add` fields: its headers stay
        packed, as recovery keeps them (a million of them are held)."""
        (order, expires, priority, persistent, deliveries, message_id, destination, headers,
         queues, body_at, body_length, meta_length) = add
        message = Message(message_id, destination, headers, None, bool(persistent), priority,
                          expires, body_length + meta_length + 64, order)
        message.body_length = body_length
        self._follow_add(message, queues, deliveries, payload, body_at, seq, info, offset, span)

    def _follow_adds(self, adds: list[LoneAdd], producers: list[DecodedEntry],
                     acks: list[tuple[int, AckEntry]], payload: memoryview, seq: int,
                     epoch: int, info: SegmentInfo, offset: int) -> None:
        """A record of ADDs, their producers' sequences, and the deliveries and
        acknowledgements of the same turn (`decoding.decode_adds`): applied in the record's
        order, as `_follow` would, without an AddEntry for each message."""
        broker = self.broker
        assert broker is not None
        end = offset + len(payload)
        spans = [disk.add_span(add[9], add[10], add[11]) for add in adds]
        if acks or not adds or any(add[4] for add in adds):  # not plain adds to summarise
            self.summaries.opaque(seq, epoch, info.segment_id, offset, end)
        else:
            self.summaries.adds(seq, epoch, info.segment_id, offset, end,
                                [(add[6], add[8], span[0], span[1], add[0], add[7])
                                 for add, span in zip(adds, spans, strict=True)],
                                [producer[1:] for producer in producers], [])
        paged_before = self.paged.total
        keys: list[LiveKey] = []
        forget: list[LiveKey] = []
        for _, destination, producer, producer_epoch, producer_seq, seen in producers:
            evicted = broker.follow_producer(destination, producer, producer_epoch,
                                             producer_seq, seen)
            keys.append(("producer", destination, producer))
            if evicted is not None:
                forget.append(("producer", destination, evicted))
        next_ack = 0
        for index, add in enumerate(adds):
            while next_ack < len(acks) and acks[next_ack][0] <= index:
                self._follow_ack(broker, acks[next_ack][1])
                next_ack += 1
            self._follow_lone_add(add, payload, seq, info, offset, spans[index])
        for _, ack in acks[next_ack:]:
            self._follow_ack(broker, ack)
        self._keep_alive(info, keys, forget)
        self._followed(broker, paged_before)

    def _follow(self, entries: list[DecodedEntry], payload: memoryview, seq: int,
                info: SegmentInfo, offset: int) -> None:
        """Apply one record's entries to the broker and to the liveness of the segments."""
        broker = self.broker
        assert broker is not None
        paged_before = self.paged.total
        keys: list[LiveKey] = []
        forget: list[LiveKey] = []
        for entry in entries:
            kind = entry[0]
            if kind == disk.ADD:
                e = entry[1]
                message = message_of(e)
                self._follow_add(message, e.queues, e.deliveries, payload, e.body_offset, seq,
                                 info, offset,
                                 disk.add_span(e.body_offset, e.body_length, e.meta_length))
            elif kind == disk.DEL:
                self._follow_remove(broker, entry[1], entry[2], entry[3])
            elif kind == disk.DELIVERED:
                self._follow_delivered(broker, entry[1], entry[2], entry[3], entry[4])
            elif kind == disk.DURABLE:
                self._release_each(broker.follow_durable(entry[1], entry[2]),
                                   f"durable:{entry[1]}")
                keys.append(("durable", entry[1]))
            elif kind == disk.UNDURABLE:
                self._release_each(broker.follow_undurable(entry[1]), f"durable:{entry[1]}")
                forget.append(("durable", entry[1]))
            elif kind == disk.DEST:
                broker.follow_destination(*entry[1:])  # (destination[, settings])
                keys.append(("dest", entry[1]))
            elif kind == disk.UNDEST:
                broker.follow_undestination(entry[1])
                forget.append(("dest", entry[1]))
            elif kind == disk.USER:
                broker.accounts.set_user(entry[1], entry[2], entry[3])
                keys.append(("user", entry[1]))
            elif kind == disk.UNUSER:
                broker.accounts.remove_user(entry[1])
                keys.append(("user", entry[1]))
            elif kind == disk.RULE:
                broker.accounts.set_rule(entry[1], entry[2])
                keys.append(("rule", entry[1]))
            elif kind == disk.UNRULE:
                broker.accounts.remove_rule(entry[1])
                keys.append(("rule", entry[1]))
            elif kind == disk.DUP:
                evicted = broker.follow_dup(entry[1], entry[2])
                keys.append(("dup", entry[1], entry[2]))
                if evicted is not None:
                    forget.append(("dup", entry[1], evicted))
            elif kind == disk.DUPS:
                forget.extend(("dup", entry[1], gone)
                              for gone in broker.follow_dups(entry[1], entry[2]))
                keys.extend(("dup", entry[1], dup_id) for dup_id in entry[2])
            elif kind == disk.GROUP:
                broker.follow_group(entry[1], entry[2], entry[3])
                keys.append(("group", entry[1], entry[2]))
            elif kind == disk.EPOCH:
                keys.append(("epoch", entry[1]))
            elif kind in COMMIT_ENTRIES:
                follow_commit(broker.commits, entry, info.segment_id)
            elif kind == disk.PRODUCER:
                evicted = broker.follow_producer(*entry[1:])
                keys.append(("producer", entry[1], entry[2]))
                if evicted is not None:
                    forget.append(("producer", entry[1], evicted))
        self._keep_alive(info, keys, forget)
        self._followed(broker, paged_before)

    def _keep_alive(self, info: SegmentInfo, keys: list[LiveKey], forget: list[LiveKey]) -> None:
        """`keys` live in this record's segment now (no longer where they were before);
        `forget`, nowhere."""
        for key in keys:
            self._forget(key)
            info.live.add(key)
            info.live_bytes += KEY_OVERHEAD
        for key in forget:
            self._forget(key)

    def _follow_acks(self, acks: list[AckEntry]) -> None:
        """Apply a record of acknowledgements and deliveries only (`decoding.decode_acks`):
        one for every few messages a consumer acknowledges, as many as the messages."""
        broker = self.broker
        assert broker is not None
        paged_before = self.paged.total
        for ack in acks:
            self._follow_ack(broker, ack)
        self._followed(broker, paged_before)

    def _follow_ack(self, broker: Broker, ack: AckEntry) -> None:
        kind, queue_key, message_id, count, order = ack
        if kind == disk.DEL:
            self._follow_remove(broker, queue_key, message_id, order)
        else:
            self._follow_delivered(broker, queue_key, message_id, count, order)

    def _follow_remove(self, broker: Broker, queue_key: str, message_id: str,
                       order: int) -> None:
        removed = broker.follow_remove(queue_key, message_id, order)
        if removed is not None:
            if removed.journal_delivered:
                removed.journal_delivered.pop(queue_key, None)
            self._release(removed, queue_key)

    def _follow_delivered(self, broker: Broker, queue_key: str, message_id: str, count: int,
                          order: int) -> None:
        delivered = broker.follow_delivered(queue_key, message_id, count, order)
        if delivered is not None:
            if delivered.journal_delivered is None:
                delivered.journal_delivered = {}
            delivered.journal_delivered[queue_key] = count

    def _followed(self, broker: Broker, paged_before: int) -> None:
        """What every applied record ends with."""
        for log in broker.take_moved_logs():  # entries acknowledged on the active
            self.pages.release(log)
        broker.take_records()  # what following changed is this record, already written
        broker.take_events()
        if self.paged.total != paged_before:
            broker.set_paged_bytes(self.paged.total)

    def _follow_add(self, message: Message, queue_keys: list[str], deliveries: int,
                    payload: memoryview, body_at: int, seq: int, info: SegmentInfo,
                    offset: int, span: tuple[int, int]) -> None:
        """`span`: where the ADD entry lies in the payload (a paged log keeps that)."""
        broker = self.broker
        assert broker is not None
        moved = broker.follow_moved(message, queue_keys)
        if moved is not None:  # a compaction copy of a message kept in a paged log
            self.pages.moved(seq, moved[0], moved[1], info.segment_id, offset + span[0])
            return
        paged_before = self.paged.total
        shared = broker.follow_add(message, queue_keys, deliveries)
        if queue_keys[0].startswith(STREAM_PREFIX):
            if shared.log is not None:  # appended: among the newest, kept with its body
                shared.body = bytes(payload[body_at:body_at + message.body_length])
                self.pages.written(seq, shared, info.segment_id, offset + span[0], span[1])
            return  # (else a copy of a record the stream holds: its entry stays)
        if shared.log is not None:  # kept in its address's paged log: no object, no body
            self.pages.written(seq, shared, info.segment_id, offset + span[0], span[1])
            return
        if shared is message:
            message.body = bytes(payload[body_at:body_at + message.body_length])
            self._locate(message, info, queue_keys, offset + body_at, seq)
        else:
            self._relocate(shared, info, queue_keys, offset + body_at)
        if self.paged.total != paged_before:
            broker.set_paged_bytes(self.paged.total)

    def _relocate(self, message: Message, info: SegmentInfo, queue_keys: list[str],
                  body_offset: int) -> None:
        """A compaction copy of a message the broker holds: its newest record is here now."""
        if message.journal_queues:
            self._release_all(message)
        message.journal_segment = info.segment_id
        message.journal_queues = list(queue_keys)
        message.body_offset = body_offset
        if message.body is None:
            self.paged.count(message, 1)
        else:
            self.memory_bytes += message.body_length
        info.live.add(message)
        info.live_bytes += message.size

    def _release_each(self, messages: list[Message], queue_key: str) -> None:
        for message in messages:
            self._release(message, queue_key)

    def wipe(self, first_seq: int, loop: asyncio.AbstractEventLoop) -> None:
        """A full resynchronisation: drop this journal, and everything the broker took from
        it; continue from the active's first seq."""
        if self.writer is not None:
            self.writer.close()
        self._close_read_fds()
        remove_all_summaries(self.directory)  # first: no summary outlives its segment
        for _, path in list_segments(self.directory):
            path.unlink()
        self._segments = []
        self._last_seq = first_seq - 1
        self.epoch = 0
        self.epochs = []
        self._to_page = []
        self._where.clear()
        self.memory_bytes = 0
        self.paged = PagedBytes()
        self.writer = JournalWriter(self.directory, self.settings.segment_bytes,
                                    first_seq - 1, [], loop, self.settings.stall_timeout_s)
        self.summaries = SummaryBuilder(self.writer.write_summary,
                                        self.settings.partial_summary_bytes,
                                        self.settings.summary_records_per_item)
        broker = self.broker
        if broker is not None:
            broker.follow_reset()
            self.account(broker)
            self._listen()

    @property
    def oldest_seq(self) -> int:
        """The first sequence number this journal still holds (1 before anything)."""
        writer = self.writer
        if writer is None or not writer.segments:
            return self.appended_seq + 1
        firsts = [s.first_seq for s in writer.segments.values() if s.first_seq]
        return min(firsts) if firsts else self.appended_seq + 1

    def drop_below(self, seq: int) -> None:
        """A backup: the active compacted away everything before seq; drop those segments
        (what is live in them was copied to newer ones, so nothing here points there)."""
        writer = self.writer
        if writer is None:
            return
        for info in sorted(writer.segments.values(), key=lambda s: s.segment_id):
            if info is writer.current or not info.last_seq or info.last_seq >= seq:
                break
            if info.last_seq <= writer.synced_seq:
                if info.live:
                    log.debug("Journal segment %d dropped below the active's horizon still "
                              "counts %d live objects", info.segment_id, len(info.live))
                self._drop_segment(info.segment_id)

    def segments_for(self, from_seq: int) -> list[tuple[int, Path]]:
        """Segment files holding records from from_seq on, oldest first."""
        writer = self.writer
        assert writer is not None
        return [(s.segment_id, s.path) for s in sorted(writer.segments.values(),
                                                        key=lambda s: s.segment_id)
                if s.last_seq >= from_seq]

    def release_compaction(self) -> None:
        self.hold_compaction -= 1
        if not self.hold_compaction:
            self._maybe_compact()

