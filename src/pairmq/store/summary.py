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
  temporary name then renamed. A start uses it only if its checksum holds and it
  matches the file: the same size, and the first and last records' headers (sequence
  number, epoch, length) where it says they are. Otherwise the segment is read as
  before, and a mismatched summary deleted.
- An ADDS item is applied only where replaying its records one by one would have put
  every message into the paged log (`Replay.paged_run` checks it, or replays them).
- Sealed segments never change; a segment deleted (compaction, a backup's horizon, a
  wipe) loses its summary with it, and `pairmq journal repair` drops those of the
  segments it cuts or moves aside.

What a summarised segment gives up: its records' checksums are not verified at start
(a paged message's entry is checked when it is read back, and `pairmq journal check`
reads every record), as Artemis does not read its page files at start either.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.stream_log import OFFSET_HEADER
from pairmq.store.records import ADD_SIZE_OVER_ENTRY, RECORD_HEADER, SEGMENT_HEADER

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


def read_summary(directory: Path, segment_id: int, segment: Path) -> SegmentSummary | None:
    """The segment's summary when there is one and it matches the segment file (module
    docstring); None otherwise (read the segment record by record)."""
    try:
        data = summary_path(directory, segment_id).read_bytes()
    except FileNotFoundError:
        return None
    try:
        summary = decode_summary(data)
    except (ValueError, struct.error, UnicodeDecodeError):
        return None
    if summary.segment_id != segment_id or not summary.items:
        return None
    try:
        with open(segment, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != summary.size:
                return None
            first = os.pread(f.fileno(), RECORD_HEADER.size, SEGMENT_HEADER.size)
            last = os.pread(f.fileno(), RECORD_HEADER.size, summary.last_start)
    except FileNotFoundError:
        return None
    if len(first) != RECORD_HEADER.size or len(last) != RECORD_HEADER.size:
        return None
    head, tail = summary.items[0], summary.items[-1]
    _l, _c, first_seq, first_epoch, _k = RECORD_HEADER.unpack(first)
    length, _c, last_seq, last_epoch, _k = RECORD_HEADER.unpack(last)
    if (first_seq, first_epoch) != (summary.first_seq, head.epoch) \
            or (last_seq, last_epoch) != (summary.last_seq, tail.epoch) \
            or summary.last_start + RECORD_HEADER.size + length != size \
            or head.start != SEGMENT_HEADER.size:
        return None
    return summary
