"""Segment summaries: what a start needs of a segment, as arrays, so that it does not
decode every record of a backlog it keeps on disk anyway (docs/durability.md, "Segment
summaries"). This module is the file and its checks; store/summary_builder.py builds them
as records are appended.

A start reads every record back, about 6 µs each in Python: 60 s for ten million waiting
messages, of which all but the first few hundred thousand only become entries of a paged
log (segment, offset, length, order, size: core/paged_log.py). A summary lists, for one
segment, its records in order as *items*:

- ADDS: consecutive records that only add new messages to one destination (the same
  queues for each; their producers' sequences and dup-ids too), as arrays of where each
  entry lies, its order and size (a stream's: its offsets and append times too). A start
  appends them to the paged log in one call (`Replay.paged_run`) when the destination
  pages already, which is the case for all but its first few segments; otherwise it reads
  those records as it always did.
- OPAQUE: any other records (acknowledgements, subscriptions, compaction copies...): a
  byte range the start reads record by record.

A summary covers a *prefix* of its segment: every record from the first up to the one
ending at `size`. A sealed segment's covers all of it; the segment still being written
gets one every PARTIAL_SUMMARY_BYTES it grows (store/summary_builder.py), covering every
record appended so far, replaced by the next and by the sealed one. A start reads the
covered bytes through the summary and the rest of the segment (records appended since,
a torn end) record by record from `size` on, as it reads a segment without one.

Why this is safe:
- A summary is a cache, never the truth: the segment is. It is written only for a
  segment the server wrote from its first record, after every record it covers is on
  disk (the writer thread writes it after the `fdatasync` of the group holding its last
  record), under a temporary name then renamed: a crash leaves a whole summary (the
  previous one, or the new one) or a `.tmp` (which a start removes), never a part of one
  under the real name (after a power loss an unsynced summary may read back empty or as
  garbage: its checksum says so).
- A start uses it only if its checksum holds, it holds together (its items follow one
  another from the segment's first record to `size`, bytes and sequence numbers without
  a gap) and it matches the file (`summary_mismatch`): the file is at least `size` long;
  at every item's start a record header with the item's first sequence number and
  epoch; at the offset of the last record one with the last sequence number and epoch,
  whose length ends exactly at `size` (a record boundary of the file). One `pread` per
  item and one more: a run of n new messages is one item. Otherwise the segment is read
  record by record as before, and the start logs why and deletes the summary.
- Why those headers suffice against a summary of an earlier content of the same segment
  id (the journal cut, the segment written again, the old summary left beside it): a
  record is named by its (sequence number, epoch). The writer numbers records
  consecutively and every server that becomes active in a pair starts a new epoch, so
  records written again after a cut carry a later epoch (at least the last record's
  header no longer matches) or lie elsewhere (an item's start no longer holds its
  record). What is left is the same (sequence number, epoch) written twice with other
  bytes at exactly the same item boundaries: only a server alone, which keeps its epoch,
  writing again over a journal cut by hand, and only if the old summary outlived the
  cut. So the journal's own cuts and deletions remove a summary *before* they change the
  bytes it covers (the writer's deletions, a backup's full resync, `pairmq journal
  repair`, the database copy's cut, a start cutting a torn end, the writer cutting a
  failed write back: `keep_summary_within`): a crash between the two leaves a segment
  without a summary, never the reverse. A start removes a summary whose segment is gone
  (so that a later segment of the same id never meets it). Records appended after
  `size` change nothing it covers: a segment a later start goes on writing into (the
  newest; or the one before, when the newest was lost) keeps its summary, which covers
  what was there, and the next start reads the rest record by record. These checks
  need nothing a summary did not hold already: SUMMARY_VERSION stays 2 (a pairmq that
  knows only sealed summaries requires `size` to be the file's, so it reads a segment
  with a prefix summary record by record, and removes it).
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
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pairmq.store.records import RECORD_HEADER, SEGMENT_HEADER

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


def summary_covers(directory: Path, segment_id: int) -> int | None:
    """How many bytes of its segment the summary beside it covers, as its head says
    (unchecked); None: there is none, or no head to read."""
    try:
        with open(summary_path(directory, segment_id), "rb") as f:
            head = f.read(_HEAD.size)
    except FileNotFoundError:
        return None
    if len(head) < _HEAD.size:
        return None
    magic, version, _, _, _, _, size, _, _ = _HEAD.unpack(head)
    return size if magic == SUMMARY_MAGIC and version == SUMMARY_VERSION else None


def keep_summary_within(directory: Path, segment_id: int, at: int) -> None:
    """The segment is about to be cut to `at` bytes: remove its summary unless it covers
    no more than those (it still describes them then: module docstring)."""
    covers = summary_covers(directory, segment_id)
    if covers is None or covers > at:
        remove_summary(directory, segment_id)


def cut_segment(directory: Path, segment_id: int, path: Path, at: int) -> None:
    """Truncate a segment to `at` bytes, its summary removed first unless it covers no
    more than those."""
    keep_summary_within(directory, segment_id, at)
    os.truncate(path, at)


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
    size: int  # where the last record it covers ends (a sealed segment's: the file's size)
    last_start: int  # where that record's header lies
    items: list[Item]


# ------------------------------------------------------------------ the file


def _string(value: str) -> bytes:
    raw = value.encode()
    return _U32.pack(len(raw)) + raw


def encode_strings(values: Iterable[str]) -> bytes:
    """Strings one after the other, each after its length (dup-ids)."""
    return b"".join([_string(value) for value in values])


def array_bytes(values: array[int]) -> bytes:
    """An array as a summary stores it (little-endian)."""
    if not _SWAP:
        return values.tobytes()
    values = array(values.typecode, values)
    values.byteswap()
    return values.tobytes()


def encode_head(segment_id: int, first_seq: int, last_seq: int, size: int,
                last_start: int, items: int) -> bytes:
    return _HEAD.pack(SUMMARY_MAGIC, SUMMARY_VERSION, 0, segment_id, first_seq, last_seq,
                      size, last_start, items)


@lru_cache(maxsize=256)
def _destination_bytes(destination: str, queue_keys: tuple[str, ...]) -> bytes:
    return b"".join([_string(destination), _U32.pack(len(queue_keys)),
                     *[_string(key) for key in queue_keys]])


def item_head(item: Item, entries: int = -1, producers: int = -1, dups: int = -1) -> bytes:
    """An item's encoding up to its arrays (all of an OPAQUE item's), with those counts
    (-1: the item's own)."""
    fixed = _ITEM.pack(item.kind, item.epoch, item.first_seq, item.last_seq, item.records,
                       item.start, item.end)
    if item.kind != ADDS:
        return fixed
    return fixed + _destination_bytes(item.destination, item.queue_keys) + _RUN.pack(
        len(item.orders) if entries < 0 else entries,
        len(item.producers) if producers < 0 else producers,
        len(item.dups) if dups < 0 else dups, item.stream_first)


def item_arrays(item: Item) -> tuple[array[int], ...]:
    """An ADDS item's arrays, in the order they are stored."""
    if item.stream_first >= 0:
        return item.offsets, item.lengths, item.orders, item.sizes, item.stamps
    return item.offsets, item.lengths, item.orders, item.sizes


def encode_producers(producers: Mapping[tuple[str, str], tuple[int, int, int]]) -> bytes:
    return b"".join([_string(destination) + _string(producer) + _PRODUCER.pack(*numbers)
                     for (destination, producer), numbers in producers.items()])


def encode_item(item: Item) -> bytes:
    """(Once per item, tens of thousands of them in a segment of small runs.)"""
    if item.kind != ADDS:
        return item_head(item)
    parts = [item_head(item), *map(array_bytes, item_arrays(item))]
    if item.producers:
        parts.append(encode_producers(item.producers))
    if item.dups:
        parts.append(encode_strings(item.dups))
    return b"".join(parts)


def encode_items(items: Iterable[Item]) -> bytes:
    return b"".join(map(encode_item, items))


def sealed_bytes(body: bytes) -> bytes:
    """A summary's bytes: its body, then the body's checksum."""
    return body + _U32.pack(zlib.crc32(body))


def encode_summary(summary: SegmentSummary) -> bytes:
    """All at once (store/summary_builder.py encodes as the segment grows, to the same
    bytes)."""
    return sealed_bytes(encode_head(summary.segment_id, summary.first_seq, summary.last_seq,
                                    summary.size, summary.last_start, len(summary.items))
                        + encode_items(summary.items))


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
    """Why `summary` does not describe the first `summary.size` bytes of segment
    `segment_id` of `size` bytes, whose record headers `header_at(offset)` reads (None
    where there is none); None: it does. One header per item, and the last record's, which
    must end exactly at `summary.size` (module docstring)."""
    if summary.segment_id != segment_id:
        return f"is the summary of segment {summary.segment_id}"
    incoherent = summary_incoherence(summary)
    if incoherent:
        return f"does not hold together ({incoherent})"
    if size < summary.size:
        return f"does not match it (size {size} < the {summary.size} it covers)"
    for index, item in enumerate(summary.items):
        header = header_at(item.start)
        if header is None or header[2:4] != (item.first_seq, item.epoch):
            return (f"does not match it (item {index}: {_named(header)} at offset "
                    f"{item.start}, not seq {item.first_seq} of epoch {item.epoch})")
    tail = summary.items[-1]
    header = header_at(summary.last_start)
    if header is None or header[2:4] != (summary.last_seq, tail.epoch) \
            or summary.last_start + RECORD_HEADER.size + header[0] != summary.size:
        return (f"does not match it (the last record: {_named(header)} at offset "
                f"{summary.last_start}, not seq {summary.last_seq} of epoch {tail.epoch} "
                f"ending at {summary.size})")
    return None


def _named(header: Header | None) -> str:
    if header is None:
        return "no record"
    return f"seq {header[2]} of epoch {header[3]} ({header[0]} bytes)"


def summary_incoherence(summary: SegmentSummary, every_entry: bool = False) -> str | None:
    """What in a decoded summary contradicts itself (None: nothing): its items must cover
    the segment from its first record to `size`, each following the one before in bytes
    and sequence numbers (the writer numbers records consecutively), and an ADDS item's
    first and last entries lie inside it; with `every_entry` (`pairmq journal check`), all
    of them. A start checks only those two: the checksum already vouches for the bytes,
    and a pass over ten million entries took 1.6 s of a start. Pure: the file is not
    read."""
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
        if item.kind == ADDS and (len(item.orders) < item.records or not _entries_inside(
                item, every_entry)):
            return f"the entries of item {index} do not lie inside it"
        at, seq = item.end, item.last_seq + 1
    if at != summary.size or seq != summary.last_seq + 1 \
            or not items[-1].start <= summary.last_start < summary.size:
        return (f"its items end at offset {at} with seq {seq - 1}, its head says "
                f"{summary.size} with {summary.last_seq} (last record at "
                f"{summary.last_start})")
    return None


def _entries_inside(item: Item, every_entry: bool) -> bool:
    offsets, lengths = item.offsets, item.lengths
    if len(offsets) != len(lengths) or not offsets:
        return False
    if every_entry:
        low, high, longest = min(offsets), max(offsets), max(lengths)
    else:
        low, high, longest = offsets[0], offsets[-1], max(lengths[0], lengths[-1])
    return low >= item.start + RECORD_HEADER.size and high < item.end \
        and longest <= item.end - item.start


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
