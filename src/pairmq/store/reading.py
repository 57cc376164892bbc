"""Reading a journal back into a `Replay`, resumable.

A start reads the journal once (`advance(final=True)` on a new reading). A backup of the
shared-store policy reads it ahead while the active server appends to it and compacts it
(`advance(final=False)`, as often as it likes): when it takes over, only the records
appended since its last pass are left to read, so failover does not grow with what the
journal retains.

Why reading ahead misses nothing: the writer appends records with consecutive sequence
numbers, and compaction re-appends the live objects of the oldest segment at the head
before it deletes that segment. A reading ahead therefore follows the segments in order
from where it stopped and requires every record it reads to carry the next sequence
number (`next_seq`); a segment deleted under it is fine once it was read to its end
(what was live in it was re-appended at the head, and replaying a copy is idempotent).
If a record it did not read is gone (it fell behind a compaction), the sequence numbers
show a gap and the reading says so: the caller starts a new one. A reading ahead never
changes a file and stops at the first incomplete record, which the writer may still be
writing; the final pass, under the lock, cuts a torn end as a start does.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pairmq.core import Message
from pairmq.core.commit_ledger import CommitLedger
from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.replay import Replay
from pairmq.core.session import PendingSend
from pairmq.core.stream_log import OFFSET_HEADER
from pairmq.store import record_decoding as decoding
from pairmq.store import records as disk
from pairmq.store.record_decoding import DecodedEntry, decode_entries
from pairmq.store.records import BAD_BYTES, SEGMENT_HEADER, CorruptRecord
from pairmq.store.segments import Visitor, list_segments, scan_segment
from pairmq.store.summary import (
    ADDS,
    Item,
    SegmentSummary,
    keep_summary_within,
    read_summary,
    remove_summary,
    stray_summaries,
)
from pairmq.store.writer import LiveKey, SegmentInfo

log = logging.getLogger("pairmq.store")

EPOCH_RECORD = 100  # a store-level record kind (not core's): (EPOCH_RECORD, epoch)
DUPS_RECORD = 101  # (DUPS_RECORD, destination, [dup ids oldest first]): compaction's copy
# A run of new messages whose first ones stay in memory is read record by record in steps
# of this many bytes, until its address pages (`JournalReading._apply_summary`).
HEAD_CHUNK_BYTES = 256 * 1024


class JournalCorrupt(Exception):
    """Damage in the middle of the journal: refuse to start rather than lose data silently."""


@dataclass
class SegmentRead:
    """How far one segment was read, and which records it held."""

    path: Path
    valid_end: int
    first_seq: int = 0
    last_seq: int = 0


class JournalReading:
    def __init__(self, directory: Path, dup_cache_size: int | Callable[[str], int] = 20000,
                 rebuild: bool = True, ahead: bool = False,
                 paged_beyond: Callable[[str], int] | None = None) -> None:
        self.directory = directory
        self.rebuild = rebuild  # False: only check the records (tools), do not decode them
        self.ahead = ahead  # reading ahead of a writer: every record must follow the last
        self.replay = Replay(dup_cache_size, paged_beyond=paged_beyond)
        self.records = 0
        self.read_ahead = 0  # records read before the final pass
        self.torn_bytes = 0
        self.last_seq = 0
        self.epoch = 0  # the epoch of the newest record
        self.epochs: list[tuple[int, int]] = []  # (epoch, first seq written in it)
        self.where: dict[LiveKey, int] = {}  # destination/durable/dup/epoch key -> segment id
        self.segments: dict[int, SegmentRead] = {}
        self.bytes_read = 0  # by the last pass
        self.summarised = 0  # segments read through their summaries (store/summary.py)
        self.summarised_bytes = 0  # ... the bytes those covered (the rest read record by record)
        self._unused: dict[int, str] = {}  # segment id -> why its summary was not used

    def advance(self, final: bool, limit_bytes: int = 0) -> bool:
        """Read what was appended since the last call (reading ahead: about `limit_bytes`,
        0 = all). False when reading ahead cannot go on (records it did not read are gone):
        start a new reading. With `final`, a torn end of the newest segment is cut and
        damage elsewhere raises JournalCorrupt, as a start needs."""
        self.bytes_read = 0
        if final:
            self.read_ahead = self.records
        found = list_segments(self.directory)
        present = {segment_id for segment_id, _ in found}
        for segment_id in [s for s in self.segments if s not in present]:
            del self.segments[segment_id]  # compacted after what was live moved to the head
        for index, (segment_id, path) in enumerate(found):
            newest = index == len(found) - 1
            known = self.segments.get(segment_id)
            if known is None and self.segments and segment_id < max(self.segments):
                return self._lost(f"segment {segment_id} appeared behind the reading")
            follows = self.ahead and self.records > 0
            if known is None and self.rebuild:
                kept = read_summary(self.directory, segment_id, path)
                summary = kept.summary
                # (a summary that matches a segment that does not follow: the scan says so)
                if summary is not None and summary.first_seq > self.last_seq \
                        and (not follows or summary.first_seq == self.last_seq + 1):
                    self._apply_summary(summary, segment_id, path)
                    # Read up to where it ends; what follows (records appended after a
                    # prefix summary, a torn end) is read below as if read before.
                    known = SegmentRead(path, summary.size, summary.first_seq,
                                        summary.last_seq)
                    self.segments[segment_id] = known
                    self.summarised += 1
                    self.summarised_bytes += summary.size
                    follows = self.ahead
                elif kept.problem is not None:
                    self._unused[segment_id] = kept.problem
                    if final:
                        self._drop_summary(segment_id, kept.problem)
            visit = self._visitor(segment_id, path)
            left = limit_bytes - self.bytes_read if limit_bytes and not final else 0
            start = known.valid_end if known else 0
            try:
                scan = scan_segment(segment_id, path, visit, self.last_seq, start=start,
                                    next_seq=self.last_seq + 1 if follows else 0,
                                    limit_bytes=left)
            except FileNotFoundError:
                if final:
                    raise
                self.segments.pop(segment_id, None)  # compacted since it was listed
                continue
            if scan.records:
                first = known.first_seq if known is not None and known.first_seq \
                    else scan.first_seq
                known = SegmentRead(path, scan.valid_end, first, scan.last_seq)
                self.records += scan.records
                self.last_seq = scan.last_seq
            elif known is None:
                known = SegmentRead(path, scan.valid_end)
            self.segments[segment_id] = known
            self.bytes_read += max(0, scan.valid_end - start)
            if left and self.bytes_read >= limit_bytes:
                return True  # this pass read its share; the next one goes on from here
            if scan.problem is None:
                continue
            if scan.gap:
                return self._lost(f"journal segment {path.name}: {scan.problem}")
            if not final:
                # Reading ahead: the writer may be writing there now; read on from here
                # next time (damage elsewhere is for the final pass to report).
                return True
            if newest and scan.at_tail:
                self._cut_torn_end(segment_id, path, scan.size, scan.valid_end, scan.problem)
            else:
                raise JournalCorrupt(
                    f"journal segment {path} is damaged at offset {scan.valid_end}: "
                    f"{scan.problem}. Nothing was changed; inspect it with "
                    f"`pairmq journal check {self.directory}` and cut the damage "
                    f"explicitly with `pairmq journal repair {self.directory}`")
        if final and self.rebuild:
            self._drop_unused_summaries()
        return True

    def _drop_summary(self, segment_id: int, problem: str) -> None:
        """Say why a segment's summary is not used, and delete it (a start, the journal its
        own: never while reading ahead)."""
        self._unused.pop(segment_id, None)
        log.warning("The summary of journal segment %d %s: reading that segment record by "
                    "record, and removing the summary", segment_id, problem)
        remove_summary(self.directory, segment_id)

    def _drop_unused_summaries(self) -> None:
        """The end of a start: the summaries reading ahead found unusable (unless they are
        now), then a `.tmp` a crash left, a summary whose segment is gone."""
        for segment_id in sorted(self._unused):
            if segment_id in self.segments:
                problem = read_summary(self.directory, segment_id,
                                       self.segments[segment_id].path).problem
                if problem is not None:
                    self._drop_summary(segment_id, problem)
        self._unused.clear()
        for segment_id, path, problem in stray_summaries(self.directory, self.segments):
            log.warning("The summary of journal segment %d %s: removing it", segment_id,
                        problem)
            path.unlink(missing_ok=True)

    def _apply_summary(self, summary: SegmentSummary, segment_id: int, path: Path) -> None:
        """The bytes a summary covers (all of a sealed segment, a prefix of the newest):
        runs of new messages straight into their paged logs, any other record read as
        `advance` reads it. A run whose first messages stay in memory is read record by
        record only until its address pages: the rest of it goes to the log at once."""
        visit = self._visitor(segment_id, path)
        for item in summary.items:
            if item.kind == ADDS and self._take(item, segment_id):
                self._item_read(item, item.records)
                continue
            at, seq, read = item.start, item.first_seq, 0
            splittable = item.kind == ADDS and item.stream_first < 0 and not item.dups \
                and self.replay.pages(item.destination)
            while at < item.end:
                limit = HEAD_CHUNK_BYTES if splittable else item.end - at
                scan = scan_segment(segment_id, path, visit, self.last_seq, start=at,
                                    next_seq=seq, limit_bytes=min(limit, item.end - at))
                if scan.problem is not None or not scan.records or scan.valid_end > item.end:
                    raise self._not_as_summarised(path, scan.valid_end, scan.problem)
                self.records += scan.records
                self.last_seq = scan.last_seq
                at, seq, read = scan.valid_end, scan.last_seq + 1, read + scan.records
                if splittable and at < item.end and self._take_rest(item, segment_id, at):
                    self._item_read(item, item.records - read)
                    at, seq, read = item.end, item.last_seq + 1, item.records
            if at != item.end or seq != item.last_seq + 1 or read != item.records:
                raise self._not_as_summarised(path, at, None)

    def _not_as_summarised(self, path: Path, offset: int, problem: str | None
                           ) -> JournalCorrupt:
        return JournalCorrupt(
            f"journal segment {path} is damaged at offset {offset}: "
            f"{problem or 'its records are not those its summary lists'}. "
            f"Nothing was changed; inspect it with `pairmq journal check "
            f"{self.directory}`")

    def _item_read(self, item: Item, records: int) -> None:
        """The last `records` records of an ADDS item were taken at once."""
        if item.epoch != self.epoch:
            self.epochs.append((item.epoch, item.last_seq - records + 1))
            self.epoch = item.epoch
        self.records += records
        self.last_seq = item.last_seq

    def _take(self, item: Item, segment_id: int, first: int = 0) -> bool:
        """An ADDS item (its messages from number `first`) into the replay at once; False
        when its records must be read."""
        replay = self.replay
        if item.stream_first >= 0:
            replay.stream_run(item.destination, item.stream_first, item.stamps, segment_id,
                              item.offsets, item.lengths, item.orders, item.sizes)
        elif not replay.paged_run(item.destination, item.queue_keys, segment_id,
                                  item.offsets[first:], item.lengths[first:],
                                  item.orders[first:], item.sizes[first:]):
            return False
        where = self.where
        # The newest state of each producer the item names (a record read before holds an
        # older one), and its dup-ids (an item with any is never split: `_apply_summary`).
        for (destination, producer), (epoch, seq, seen) in item.producers.items():
            replay.producer(destination, producer, epoch, seq, seen)
            where[("producer", destination, producer)] = segment_id
        for dup_id in item.dups:  # in order: the cache evicts the oldest
            replay.dup(item.destination, dup_id)
            where[("dup", item.destination, dup_id)] = segment_id
        return True

    def _take_rest(self, item: Item, segment_id: int, read_to: int) -> bool:
        """After its records up to offset `read_to` were read one by one: the rest of an
        ADDS item at once, if its address pages now. The messages read are exactly those
        whose entries lie before `read_to`, the newest of them the last one the replay
        took (else the summary is not trusted this far: False, read on)."""
        first = bisect_left(item.offsets, read_to)
        if not 0 < first < len(item.orders) \
                or item.orders[first - 1] != self.replay.top_order:
            return False
        return self._take(item, segment_id, first)

    def segment_infos(self) -> list[SegmentInfo]:
        return [SegmentInfo(segment_id, read.path, read.valid_end, read.valid_end,
                            last_seq=read.last_seq, first_seq=read.first_seq)
                for segment_id, read in sorted(self.segments.items())]

    def _lost(self, why: str) -> bool:
        log.info("Reading the journal again from its start: %s", why)
        return False

    def _cut_torn_end(self, segment_id: int, path: Path, size: int, valid_end: int,
                      problem: str) -> None:
        dropped = size - valid_end
        self.torn_bytes += dropped
        if valid_end < SEGMENT_HEADER.size:
            path.unlink()
            del self.segments[segment_id]
            log.warning("Journal segment %s held only a torn header: removed it "
                        "(%d bytes dropped)", path.name, dropped)
            return
        keep_summary_within(self.directory, segment_id, valid_end)
        os.truncate(path, valid_end)
        log.warning("Journal segment %s ended with a torn write (%s): dropped %d "
                    "bytes at offset %d", path.name, problem, dropped, valid_end)

    def _visitor(self, segment_id: int, path: Path) -> Visitor:
        replay, rebuild, adds, apply = self.replay, self.rebuild, _apply_adds, self._apply
        where = self.where

        def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int,
                  add: int = disk.ADD, acks: tuple[int, int] = _ACKS) -> None:
            try:
                if rebuild and len(payload):  # (an empty record changes nothing)
                    first = payload[0]
                    taken = adds(replay, where, payload, segment_id, offset) \
                        if first == add else first in acks and _apply_acks(replay, payload)
                    if not taken:
                        apply(decode_entries(payload, load_bodies=False), segment_id, offset)
            except (CorruptRecord, *BAD_BYTES) as e:
                raise JournalCorrupt(
                    f"journal segment {path} has an undecodable record (seq {seq}) at "
                    f"offset {offset}: {e}") from None
            if epoch != self.epoch:
                self.epochs.append((epoch, seq))
                self.epoch = epoch

        return visit

    def _apply(self, entries: list[DecodedEntry], segment_id: int, offset: int) -> None:
        replay, where = self.replay, self.where
        for entry in entries:
            kind = entry[0]
            if kind == disk.ADD:
                e = entry[1]
                size = e.body_length + e.meta_length + 64
                if e.destination.startswith(STREAM_PREFIX):
                    start, length = disk.add_span(e.body_offset, e.body_length, e.meta_length)
                    _stream_record(replay, e.destination, e.headers, segment_id,
                                   offset + start, length, e.order, size)
                    continue
                if replay.to_log(e.destination, e.queues, e.message_id, size, e.order):
                    start, length = disk.add_span(e.body_offset, e.body_length, e.meta_length)
                    replay.add_to_log(e.destination, e.queues, segment_id, offset + start,
                                      length, e.order, size)
                    continue
                message = message_of(e)
                message.body_offset = offset + e.body_offset
                message.journal_segment = segment_id
                shared = replay.add(message, e.queues, e.deliveries)
                if shared is not message:  # a compaction copy: the newest location wins
                    shared.journal_segment = segment_id
                    shared.body_offset = message.body_offset
            elif kind == disk.DEL:
                replay.remove(entry[1], entry[2], entry[3])
            elif kind == disk.DELIVERED:
                replay.delivered(entry[1], entry[2], entry[3], entry[4])
            elif kind == disk.DURABLE:
                replay.durable(entry[1], entry[2])
                where[("durable", entry[1])] = segment_id
            elif kind == disk.UNDURABLE:
                replay.undurable(entry[1])
                where.pop(("durable", entry[1]), None)
            elif kind == disk.DEST:
                replay.destination(*entry[1:])  # (destination[, settings])
                where[("dest", entry[1])] = segment_id
            elif kind == disk.UNDEST:
                replay.undestination(entry[1])
                where.pop(("dest", entry[1]), None)
            elif kind == disk.USER:
                replay.accounts.set_user(entry[1], entry[2], entry[3])
                where[("user", entry[1])] = segment_id
            elif kind == disk.UNUSER:
                replay.accounts.remove_user(entry[1])
                where[("user", entry[1])] = segment_id
            elif kind == disk.RULE:
                replay.accounts.set_rule(entry[1], entry[2])
                where[("rule", entry[1])] = segment_id
            elif kind == disk.UNRULE:
                replay.accounts.remove_rule(entry[1])
                where[("rule", entry[1])] = segment_id
            elif kind == disk.DUP:
                replay.dup(entry[1], entry[2])
                where[("dup", entry[1], entry[2])] = segment_id
            elif kind == disk.DUPS:
                replay.dup_snapshot(entry[1], entry[2])
                for dup_id in entry[2]:
                    where[("dup", entry[1], dup_id)] = segment_id
            elif kind == disk.GROUP:
                replay.group(entry[1], entry[2], entry[3])
                where[("group", entry[1], entry[2])] = segment_id
            elif kind == disk.EPOCH:
                where[("epoch", entry[1])] = segment_id
            elif kind == disk.PRODUCER:
                replay.producer(entry[1], entry[2], entry[3], entry[4], entry[5])
                where[("producer", entry[1], entry[2])] = segment_id
            elif kind in COMMIT_ENTRIES:
                follow_commit(replay.commits, entry, segment_id)


COMMIT_ENTRIES = (disk.TX_SEND, disk.TX_END, disk.TX_DONE, disk.TX_DROP)


def follow_commit(commits: CommitLedger, entry: DecodedEntry, segment_id: int) -> None:
    """A COMMIT in slices (core/broker/committing.py), as recovery and a backup read it."""
    kind = entry[0]
    if kind == disk.TX_SEND:
        commits.staged(entry[1], PendingSend(entry[2], entry[3], entry[4]), segment_id)
    elif kind == disk.TX_END:
        commits.decided(entry[1], entry[2])
    elif kind == disk.TX_DONE:
        commits.done(entry[1], entry[2])
    else:
        commits.dropped(entry[1])


def message_of(e: decoding.AddEntry) -> Message:
    """The message an ADD entry read back from a journal describes (body left on disk)."""
    message = Message(e.message_id, e.destination, e.headers, None, e.persistent, e.priority,
                      e.expires, e.body_length + e.meta_length + 64, e.order)
    message.body_length = e.body_length
    return message


def _stream_record(replay: Replay, stream: str, headers: Mapping[str, str], segment_id: int,
                   at: int, length: int, order: int, size: int) -> None:
    """A stream's record: its entry into the stream's log, by the offset it names."""
    replay.add_stream_record(stream, int(headers[OFFSET_HEADER]),
                             int(headers.get("timestamp", "0")), segment_id, at, length,
                             order, size)


_ACKS = (disk.DEL_ORDER, disk.DELIVERED_ORDER)


def _apply_acks(replay: Replay, payload: memoryview) -> bool:
    """A record of acknowledgements and deliveries only, applied as `_apply` would; False
    when it holds other entries."""
    # the entries of messages older than all a queue holds change nothing: most of a
    # start's after a long drain (the record adds nothing, so a bound holds through it)
    entries = decoding.decode_acks(payload, replay.held_below)
    if entries is None:
        return False
    remove, delivered, removal = replay.remove, replay.delivered, disk.DEL
    for kind, queue_key, message_id, count, order in entries:
        if kind == removal:
            remove(queue_key, message_id, order)
        else:
            delivered(queue_key, message_id, count, order)
    return True


def _apply_adds(replay: Replay, where: dict[LiveKey, int], payload: memoryview, segment_id: int,
                offset: int) -> bool:
    """The common record, messages added (and their producers' sequences) and nothing
    else, straight into Messages: a million of them are read at every start, and by a
    shared-store backup. False when the record holds other entries (the general path
    decodes it then)."""
    producers: list[DecodedEntry] = []
    adds = decoding.decode_adds(payload, producers)
    if adds is None:
        return False
    for _, destination, producer, epoch, seq, seen in producers:
        replay.producer(destination, producer, epoch, seq, seen)
        where[("producer", destination, producer)] = segment_id
    add, to_log = replay.add, replay.to_log
    for (order, expires, priority, persistent, deliveries, message_id, destination,
         headers, queues, body_at, body_length, meta_length) in adds:
        size = body_length + meta_length + 64
        if destination.startswith(STREAM_PREFIX):
            start, length = disk.add_span(body_at, body_length, meta_length)
            _stream_record(replay, destination, headers, segment_id, offset + start, length,
                           order, size)
            continue
        if to_log(destination, queues, message_id, size, order):
            start, length = disk.add_span(body_at, body_length, meta_length)
            replay.add_to_log(destination, queues, segment_id, offset + start, length, order,
                              size)
            continue
        body_offset = offset + body_at
        message = Message(message_id, destination, headers, None, bool(persistent),
                          priority, expires, body_length + meta_length + 64, order,
                          segment_id, None, body_offset, body_length)
        shared = add(message, queues, deliveries)
        if shared is not message:  # a compaction copy: the newest location wins
            shared.journal_segment = segment_id
            shared.body_offset = body_offset
    return True
