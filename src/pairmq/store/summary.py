"""Segment summaries: what a start needs of a sealed segment, as arrays, so that it does
not decode every record of a backlog it keeps on disk anyway (docs/durability.md,
"Segment summaries").

A start reads every record back, about 6 µs each in Python: 60 s for ten million waiting
messages, of which all but the first few hundred thousand only become entries of a paged
log (segment, offset, length, order, size: core/paged_log.py). A summary lists, for one
segment, its records in order as *items*:

- ADDS: consecutive records that only add new messages to one destination (the same
  queues for each; their producers' sequences and dup-ids too), as arrays of where each
  entry lies,
  its order and size (a stream's: its offsets and append times too). A start appends
  them to the paged log in one call (`Replay.paged_run`) when the destination pages
  already, which is the case for all but its first few segments; otherwise it reads
  those records as it always did.
- OPAQUE: any other records (acknowledgements, subscriptions, compaction copies...): a
  byte range the start reads record by record.

Why this is safe:
- A summary is a cache, never the truth: the segment is. It is written only for a
  segment the server wrote from its first record, once the segment is sealed and its
  records are on disk (the writer thread writes it after their `fdatasync`), under a
  temporary name then renamed: a crash leaves the whole summary or a `.tmp` (which a
  start removes), never a part of one under the real name (after a power loss an
  unsynced summary may read back empty or as garbage: its checksum says so).
- A start uses it only if its checksum holds, it holds together (its items follow one
  another from the segment's first record to its end, bytes and sequence numbers
  without a gap) and it matches the file (`summary_mismatch`): the same size; at every
  item's start a record header with the item's first sequence number and epoch; at the
  offset of the last record one with the last sequence number and epoch, whose length
  reaches the end of the file. One `pread` per item and one more: a run of n new
  messages is one item. Otherwise the segment is read record by record as before, and
  the start logs why and deletes the summary.
- Why those headers suffice against a summary of an earlier content of the same segment
  id (the journal cut, the segment written again, the old summary left beside it): a
  record is named by its (sequence number, epoch). The writer numbers records
  consecutively and every server that becomes active in a pair starts a new epoch, so
  records written again after a cut carry a later epoch (at least the last record's
  header no longer matches) or lie elsewhere (an item's start no longer holds its
  record). What is left is the same (sequence number, epoch) written twice with other
  bytes at exactly the same item boundaries: only a server alone, which keeps its epoch,
  writing again over a journal cut by hand, and only if the old summary outlived the
  cut. So the journal's own cuts and deletions remove a summary *before* they change its
  segment (the writer's deletions, a backup's full resync, `pairmq journal repair`, the
  database copy's cut): a crash between the two leaves a segment without a summary,
  never the reverse. A start removes a summary whose segment is gone (so that a later
  segment of the same id never meets it), and the writer the summary of a segment it
  goes on writing into (the newest, when the one after it was lost). These checks need
  nothing a summary did not hold already: SUMMARY_VERSION stays 2.
- An ADDS item is applied only where replaying its records one by one would have put
  every message into the paged log (`Replay.paged_run` checks it, or replays them).

What a start does not check, and why: the records' checksums (the summary would need one
per record and the start a read of every header, which is what the summary saves: a
paged message's entry is checked when it is read back), and that a run's entries are its
records' (the same: that needs every record). A summary whose checksum holds and whose
item boundaries match is believed; `pairmq journal check` reads every record and
compares every item with them (store/summary_check.py), and `pairmq journal repair`
removes a summary that does not match. Artemis does not read its page files at start
either.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.stream_log import OFFSET_HEADER
from pairmq.store.records import (
    ADD,
    ADD_SIZE_OVER_ENTRY,
    DUP,
    PRODUCER,
    RECORD_HEADER,
    SEGMENT_HEADER,
    DecodedEntry,
    add_span,
)

log = logging.getLogger("pairmq.store")

SUMMARY_MAGIC = b"PMQS"
SUMMARY_VERSION = 2
_HEAD = struct.Struct("<4sHHIQQQQI")  # magic, version, 0, segment, first seq, last seq,
#                                      size, offset of the last record, items
_ITEM = struct.Struct("<BIQQIQQ")  # kind, epoch, first seq, last seq, records, start, end
_RUN = struct.Struct("<IIIq")  # entries, producers, dup-ids, a stream's first offset (-1)
_PRODUCER = struct.Struct("<QQQ")  # epoch, seq, ms
_U32 = struct.Struct("<I")

OPAQUE = 0
ADDS = 1

_SWAP = sys.byteorder != "little"  # arrays are stored little-endian


def summary_name(segment_id: int) -> str:
    return f"journal-{segment_id:08d}.sum"


def summary_path(directory: Path, segment_id: int) -> Path:
    return directory / summary_name(segment_id)


def remove_summary(directory: Path, segment_id: int) -> None:
    try:
        os.unlink(summary_path(directory, segment_id))
    except FileNotFoundError:
        pass


def write_summary_file(directory: Path, segment_id: int, data: bytes) -> None:
    """Under a temporary name, then renamed (the writer thread, after the segment's
    records are on disk). No fsync: a summary lost in a crash is only not used."""
    path = summary_path(directory, segment_id)
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except OSError as e:
        log.warning("Could not write the summary of journal segment %d (%s): a start reads "
                    "that segment record by record", segment_id, e)
        temporary.unlink(missing_ok=True)


def remove_all_summaries(directory: Path) -> None:
    for path in directory.glob("journal-*.sum*"):
        path.unlink(missing_ok=True)


@dataclass(slots=True)
class Item:
    """Consecutive records of a segment, bytes `start`..`end`."""

    kind: int
    epoch: int
    first_seq: int
    last_seq: int
    records: int
    start: int
    end: int
    # ADDS: the destination, its queues, and per message where its entry lies (payload
    # offset in the file, length), its enqueue order and the size it counts
    destination: str = ""
    queue_keys: tuple[str, ...] = ()
    offsets: array[int] = field(default_factory=lambda: array("I"))
    lengths: array[int] = field(default_factory=lambda: array("I"))
    orders: array[int] = field(default_factory=lambda: array("Q"))
    sizes: array[int] = field(default_factory=lambda: array("I"))
    stream_first: int = -1  # a stream's records: the offset of the first (-1: not a stream)
    stamps: array[int] = field(default_factory=lambda: array("Q"))
    producers: dict[tuple[str, str], tuple[int, int, int]] = field(default_factory=dict)
    dups: list[str] = field(default_factory=list)  # dup-ids of the destination, in order


@dataclass
class SegmentSummary:
    segment_id: int
    first_seq: int
    last_seq: int
    size: int  # the segment file's size: every record's bytes
    last_start: int  # where its last record's header lies
    items: list[Item]


# ------------------------------------------------------------------ building


Added = tuple[str, list[str], int, int, int, Mapping[str, str]]
"""One message a record adds: destination, queue keys, its entry's offset in the
record's payload and length, its order, its headers (a stream's offset and time)."""


class SummaryBuilder:
    """Fed every record appended to the journal, in order; hands a sealed segment's
    summary to `seal(segment id, bytes)` (the writer writes it once the segment is on
    disk)."""

    def __init__(self, seal: Callable[[int, bytes], None]) -> None:
        self._seal = seal
        self._segment = 0
        self._whole = False  # saw the segment from its first record
        self._items: list[Item] = []
        self._first_seq = 0
        self._last_seq = 0
        self._size = 0
        self._last_start = 0
        self._top_order = 0  # the newest order added: an older one is a compaction copy

    def _enter(self, segment_id: int, start: int) -> bool:
        if segment_id != self._segment:
            self.seal()
            self._segment = segment_id
            self._whole = start == SEGMENT_HEADER.size
            self._first_seq = 0
        return self._whole

    def resume(self, segment_id: int) -> None:
        """Summarise `segment_id` from its next record as if from its first, with nothing
        seen before (`pairmq journal check` rebuilds an item from its records)."""
        self._segment, self._whole, self._first_seq = segment_id, True, 0
        self._items, self._top_order = [], 0

    @property
    def items(self) -> list[Item]:
        """The items of the segment summarised now, so far."""
        return self._items

    def seal(self) -> None:
        """The current segment is complete (the writer moved on): summarise it."""
        if self._whole and self._items:
            summary = SegmentSummary(self._segment, self._first_seq, self._last_seq,
                                     self._size, self._last_start, self._items)
            self._seal(self._segment, encode_summary(summary))
        self._whole = False
        self._items = []

    def _noted(self, seq: int, start: int, end: int) -> None:
        if not self._first_seq:
            self._first_seq = seq
        self._last_seq = seq
        self._last_start = start
        self._size = end

    def opaque(self, seq: int, epoch: int, segment_id: int, payload_at: int,
               payload_end: int) -> None:
        """A record the start must read."""
        start = payload_at - RECORD_HEADER.size
        if not self._enter(segment_id, start):
            return
        items = self._items
        last = items[-1] if items else None
        if last is not None and last.kind == OPAQUE and last.epoch == epoch \
                and last.end == start:
            last.last_seq = seq
            last.records += 1
            last.end = payload_end
        else:
            items.append(Item(OPAQUE, epoch, seq, seq, 1, start, payload_end))
        self._noted(seq, start, payload_end)

    def adds(self, seq: int, epoch: int, segment_id: int, payload_at: int,
             payload_end: int, added: list[Added],
             producers: list[tuple[str, str, int, int, int]],
             dups: list[tuple[str, str]]) -> None:
        """A record of new messages (and their producers' sequences and dup-ids) and
        nothing else."""
        start = payload_at - RECORD_HEADER.size
        if not self._enter(segment_id, start):
            return
        destination, queue_keys = added[0][0], added[0][1]
        stream = destination.startswith(STREAM_PREFIX)
        if any(d != destination for d, _ in dups):
            self.opaque(seq, epoch, segment_id, payload_at, payload_end)
            return
        top = self._top_order
        offsets: list[int] = []
        for entry in added:
            if entry[0] != destination or entry[1] != queue_keys or entry[4] <= top:
                self._top_order = max(top, max(e[4] for e in added))
                self.opaque(seq, epoch, segment_id, payload_at, payload_end)
                return
            top = entry[4]
            if stream:
                try:
                    offsets.append(int(entry[5][OFFSET_HEADER]))
                except (KeyError, ValueError):
                    self.opaque(seq, epoch, segment_id, payload_at, payload_end)
                    return
        self._top_order = top
        if stream and offsets != list(range(offsets[0], offsets[0] + len(offsets))):
            self.opaque(seq, epoch, segment_id, payload_at, payload_end)
            return
        keys = tuple(queue_keys)
        items = self._items
        item = items[-1] if items else None
        if item is None or item.kind != ADDS or item.epoch != epoch or item.end != start \
                or item.destination != destination or item.queue_keys != keys \
                or (stream and item.stream_first + len(item.orders) != offsets[0]):
            item = Item(ADDS, epoch, seq, seq, 0, start, payload_end, destination, keys,
                        stream_first=offsets[0] if stream else -1)
            items.append(item)
        item.last_seq = seq
        item.records += 1
        item.end = payload_end
        for _d, _k, at, length, order, headers in added:
            item.offsets.append(payload_at + at)
            item.lengths.append(length)
            item.orders.append(order)
            item.sizes.append(length + ADD_SIZE_OVER_ENTRY)
            if stream:
                item.stamps.append(int(headers.get("timestamp", "0")))
        for p_destination, producer, p_epoch, p_seq, seen in producers:
            item.producers[(p_destination, producer)] = (p_epoch, p_seq, seen)
        item.dups.extend(dup_id for _d, dup_id in dups)
        self._noted(seq, start, payload_end)


def summarise_entries(builder: SummaryBuilder, entries: list[DecodedEntry], seq: int,
                      epoch: int, segment_id: int, payload_at: int, payload_end: int) -> None:
    """Tell `builder` what a record read back holds (a backup's mirrored records, `pairmq
    journal check`), as `Store.persist` tells it of the records it writes: new messages
    (never delivered), their producers and dup-ids only, or anything else."""
    added: list[Added] = []
    producers: list[tuple[str, str, int, int, int]] = []
    dups: list[tuple[str, str]] = []
    for entry in entries:
        if entry[0] == ADD and not entry[1].deliveries:
            e = entry[1]
            start, length = add_span(e.body_offset, e.body_length, e.meta_length)
            added.append((e.destination, e.queues, start, length, e.order, e.headers))
        elif entry[0] == PRODUCER:
            producers.append(entry[1:])
        elif entry[0] == DUP:
            dups.append((entry[1], entry[2]))
        else:
            builder.opaque(seq, epoch, segment_id, payload_at, payload_end)
            return
    if added:
        builder.adds(seq, epoch, segment_id, payload_at, payload_end, added, producers, dups)
    else:
        builder.opaque(seq, epoch, segment_id, payload_at, payload_end)


# ------------------------------------------------------------------ the file


def _string(value: str) -> bytes:
    raw = value.encode()
    return _U32.pack(len(raw)) + raw


def _raw(values: array[int]) -> bytes:
    if _SWAP:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def encode_summary(summary: SegmentSummary) -> bytes:
    parts = [_HEAD.pack(SUMMARY_MAGIC, SUMMARY_VERSION, 0, summary.segment_id,
                        summary.first_seq, summary.last_seq, summary.size,
                        summary.last_start, len(summary.items))]
    for item in summary.items:
        parts.append(_ITEM.pack(item.kind, item.epoch, item.first_seq, item.last_seq,
                                item.records, item.start, item.end))
        if item.kind != ADDS:
            continue
        parts.append(_string(item.destination))
        parts.append(_U32.pack(len(item.queue_keys)))
        parts.extend(_string(key) for key in item.queue_keys)
        parts.append(_RUN.pack(len(item.orders), len(item.producers), len(item.dups),
                               item.stream_first))
        parts.extend(_raw(a) for a in (item.offsets, item.lengths, item.orders, item.sizes))
        if item.stream_first >= 0:
            parts.append(_raw(item.stamps))
        for (destination, producer), numbers in item.producers.items():
            parts.append(_string(destination))
            parts.append(_string(producer))
            parts.append(_PRODUCER.pack(*numbers))
        parts.extend(_string(dup_id) for dup_id in item.dups)
    body = b"".join(parts)
    return body + _U32.pack(zlib.crc32(body))


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, shape: struct.Struct) -> tuple[Any, ...]:
        values = shape.unpack_from(self.data, self.pos)
        self.pos += shape.size
        return values

    def string(self) -> str:
        (length,) = self.unpack(_U32)
        value = str(self.data[self.pos:self.pos + length], "utf-8")
        self.pos += length
        return value

    def array(self, typecode: str, count: int) -> array[int]:
        values = array(typecode)
        end = self.pos + count * values.itemsize
        if end > len(self.data):
            raise ValueError("an array runs past the end of the summary")
        values.frombytes(self.data[self.pos:end])
        if _SWAP:
            values.byteswap()
        self.pos = end
        return values


def decode_summary(data: bytes) -> SegmentSummary:
    """Raises ValueError (or struct.error) on anything but a whole, checked summary."""
    if len(data) < _HEAD.size + _U32.size:
        raise ValueError("too short")
    (crc,) = _U32.unpack_from(data, len(data) - _U32.size)
    body = memoryview(data)[:len(data) - _U32.size]
    if zlib.crc32(body) != crc:
        raise ValueError("checksum mismatch")
    reader = _Reader(body)
    magic, version, _, segment_id, first_seq, last_seq, size, last_start, count = \
        reader.unpack(_HEAD)
    if magic != SUMMARY_MAGIC or version != SUMMARY_VERSION:
        raise ValueError(f"not a summary of this version ({magic!r}, {version})")
    items = []
    for _ in range(count):
        item = Item(*reader.unpack(_ITEM))
        if item.kind == ADDS:
            item.destination = reader.string()
            (keys,) = reader.unpack(_U32)
            item.queue_keys = tuple(reader.string() for _ in range(keys))
            entries, producers, dups, item.stream_first = reader.unpack(_RUN)
            item.offsets = reader.array("I", entries)
            item.lengths = reader.array("I", entries)
            item.orders = reader.array("Q", entries)
            item.sizes = reader.array("I", entries)
            if item.stream_first >= 0:
                item.stamps = reader.array("Q", entries)
            for _ in range(producers):
                destination, producer = reader.string(), reader.string()
                item.producers[(destination, producer)] = reader.unpack(_PRODUCER)
            item.dups = [reader.string() for _ in range(dups)]
        elif item.kind != OPAQUE:
            raise ValueError(f"unknown item kind {item.kind}")
        items.append(item)
    if reader.pos != len(body):
        raise ValueError("bytes after the last item")
    return SegmentSummary(segment_id, first_seq, last_seq, size, last_start, items)


Header = tuple[int, int, int, int, int]  # a record's header: length, crc, seq, epoch, kind


@dataclass(frozen=True, slots=True)
class SummaryRead:
    """What `read_summary` found: the summary to use, or why the one beside the segment is
    not used (both None: the segment has no summary, as one the server did not write from
    its first record)."""

    summary: SegmentSummary | None = None
    problem: str | None = None  # completes "The summary of journal segment N ..."


def read_summary(directory: Path, segment_id: int, segment: Path) -> SummaryRead:
    """The segment's summary when there is one and it matches the segment file (module
    docstring), else why not: then read the segment record by record."""
    try:
        data = summary_path(directory, segment_id).read_bytes()
    except FileNotFoundError:
        return SummaryRead()
    try:
        summary = decode_summary(data)
    except (ValueError, struct.error, UnicodeDecodeError) as e:
        return SummaryRead(problem=f"does not decode ({e})")
    try:
        with open(segment, "rb") as f:
            fd = f.fileno()

            def header_at(offset: int) -> Header | None:
                raw = os.pread(fd, RECORD_HEADER.size, offset)
                return RECORD_HEADER.unpack(raw) if len(raw) == RECORD_HEADER.size else None

            problem = summary_mismatch(summary, segment_id, os.fstat(fd).st_size, header_at)
    except FileNotFoundError:
        return SummaryRead(problem="has no segment any more")
    return SummaryRead(problem=problem) if problem else SummaryRead(summary)


def summary_mismatch(summary: SegmentSummary, segment_id: int, size: int,
                     header_at: Callable[[int], Header | None]) -> str | None:
    """Why `summary` does not describe segment `segment_id` of `size` bytes, whose record
    headers `header_at(offset)` reads (None where there is none); None: it does. One
    header per item, and the last record's (module docstring)."""
    if summary.segment_id != segment_id:
        return f"is the summary of segment {summary.segment_id}"
    incoherent = summary_incoherence(summary)
    if incoherent:
        return f"does not hold together ({incoherent})"
    if size != summary.size:
        return f"does not match it (size {size} != {summary.size})"
    for index, item in enumerate(summary.items):
        header = header_at(item.start)
        if header is None or header[2:4] != (item.first_seq, item.epoch):
            return (f"does not match it (item {index}: {_named(header)} at offset "
                    f"{item.start}, not seq {item.first_seq} of epoch {item.epoch})")
    tail = summary.items[-1]
    header = header_at(summary.last_start)
    if header is None or header[2:4] != (summary.last_seq, tail.epoch) \
            or summary.last_start + RECORD_HEADER.size + header[0] != size:
        return (f"does not match it (the last record: {_named(header)} at offset "
                f"{summary.last_start}, not seq {summary.last_seq} of epoch {tail.epoch} "
                f"to the end)")
    return None


def _named(header: Header | None) -> str:
    if header is None:
        return "no record"
    return f"seq {header[2]} of epoch {header[3]} ({header[0]} bytes)"


def summary_incoherence(summary: SegmentSummary) -> str | None:
    """What in a decoded summary contradicts itself (None: nothing): its items must cover
    the segment from its first record to its end, each following the one before in bytes
    and sequence numbers (the writer numbers records consecutively), and an ADDS item's
    entries lie inside it. Pure: the file is not read."""
    items = summary.items
    if not items:
        return "no items"
    at, seq = SEGMENT_HEADER.size, summary.first_seq
    for index, item in enumerate(items):
        if item.start != at or item.first_seq != seq:
            return (f"item {index} starts at offset {item.start} with seq {item.first_seq}, "
                    f"not {at} with {seq}")
        if item.end <= item.start or item.last_seq < item.first_seq \
                or item.records != item.last_seq - item.first_seq + 1:
            return (f"item {index} spans bytes {item.start}-{item.end} and seqs "
                    f"{item.first_seq}-{item.last_seq} in {item.records} records")
        if item.kind == ADDS and (
                len(item.orders) < item.records
                or min(item.offsets) < item.start + RECORD_HEADER.size
                or max(item.offsets) >= item.end
                or max(item.lengths) > item.end - item.start):
            return f"the entries of item {index} do not lie inside it"
        at, seq = item.end, item.last_seq + 1
    if at != summary.size or seq != summary.last_seq + 1 \
            or not items[-1].start <= summary.last_start < summary.size:
        return (f"its items end at offset {at} with seq {seq - 1}, its head says "
                f"{summary.size} with {summary.last_seq} (last record at "
                f"{summary.last_start})")
    return None


STRAY_SUMMARY = re.compile(r"^journal-(\d{8})\.sum(\.tmp)?$")


def stray_summaries(directory: Path, segment_ids: Container[int]
                    ) -> list[tuple[int, Path, str]]:
    """Summary files no start can use: a `.tmp` a crash left while it was being written,
    and summaries of segments that are gone (their deletion was cut short): (segment id,
    file, why), for a start to remove once the journal is its own (the writer of another
    server may be writing a `.tmp` while a backup reads ahead)."""
    found: list[tuple[int, Path, str]] = []
    if not directory.is_dir():
        return found
    for path in sorted(directory.iterdir()):
        matched = STRAY_SUMMARY.match(path.name)
        if matched is None:
            continue
        segment_id = int(matched.group(1))
        if matched.group(2):
            found.append((segment_id, path, f"was being written when the server stopped "
                                            f"({path.name} left)"))
        elif segment_id not in segment_ids:
            found.append((segment_id, path, "has no segment any more"))
    return found
