"""Building segment summaries (store/summary.py) from the records appended to a journal:
the server's (`Store.persist`), a backup's (store/mirror.py), and `pairmq journal check`
rebuilding an item from its records (store/summary_check.py).

The builder hands each summary to the writer (`seal(segment id, PendingSummary)`), which
writes it in its thread after the `fdatasync` of the group that holds its last record,
under a temporary name then renamed (`write_summary_file`):
- a sealed segment's, once the writer moved on to the next segment;
- a *prefix summary* of the segment still being written, every `partial_bytes` it grows
  (the server's: PARTIAL_SUMMARY_BYTES, store/settings.py): every record from the
  segment's first to the one just appended. It replaces the one before, and the sealed
  one replaces it. A start then reads all but the last few MiB of the newest segment
  through a summary too (issue 40: a million waiting messages of 1 KiB leave ~44,000
  records in the newest 64 MiB segment, a third of the start when read one by one).

Why PARTIAL_SUMMARY_BYTES is 8 MiB: a start reads what the newest summary does not cover
record by record, about 10 ms a MiB of 1 KiB messages (8 MiB: 80 ms at most, 40 on
average). Every prefix summary rewrites the whole summary so far: n of them in a segment
write n / 2 times its sealed summary's size besides it. At 8 MiB, 7 in a 64 MiB segment:
4 MB for 1 KiB messages (6% of the journal's bytes, page cache writes without fsync;
more with smaller messages, whose summaries are larger), against 8.6 MB (13%) at 4 MiB.

A prefix summary is written only while the segment's records come in long runs (at least
`records_per_item` records per item on average: StoreSettings.summary_records_per_item,
16): where consumers keep up, sends alternate
with acknowledgements, nearly every record is an item of its own, the summary would save a
start little reading, and encoding it costs the writer thread 40-80 ms each time (measured
with 1 KiB messages), which the group it follows waits for. Such a journal holds little
anyway: compaction drops what was acknowledged. The sealed summary is written as before.

Encoding on the event loop stays cheap: an item is encoded once, in the writer thread
(`_Lazy`: an item that will not change any more, dup-ids), and the item still growing
(the newest: in the common case a single run of tens of thousands of new messages) in
chunks, the loop copying only the entries added since the summary before. A summary is
the list of those parts; the writer thread joins them and adds the checksum
(`PendingSummary.data`): the same bytes as `encode_summary` (tests/store/
test_summary_prefix.py checks it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path

from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.stream_log import OFFSET_HEADER
from pairmq.store.record_decoding import DecodedEntry
from pairmq.store.records import (
    ADD,
    ADD_SIZE_OVER_ENTRY,
    DUP,
    PRODUCER,
    RECORD_HEADER,
    SEGMENT_HEADER,
    add_span,
)
from pairmq.store.summary import (
    ADDS,
    OPAQUE,
    Item,
    array_bytes,
    encode_head,
    encode_items,
    encode_producers,
    encode_strings,
    item_arrays,
    item_head,
    sealed_bytes,
    summary_path,
)

log = logging.getLogger("pairmq.store")


class _Lazy:
    """A part of a summary encoded when first asked (in the writer thread), once: what it
    encodes never changes (items closed, dup-ids copied, a producers' table copied)."""

    __slots__ = ("_encode", "_encoded")

    def __init__(self, encode: Callable[[], bytes]) -> None:
        self._encode = encode
        self._encoded: bytes | None = None

    def encoded(self) -> bytes:
        if self._encoded is None:
            self._encoded = self._encode()
        return self._encoded


Part = bytes | _Lazy


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """A summary handed to the writer: its parts, joined (and checksummed) by `data` in
    the writer thread."""

    segment_id: int
    size: int  # the bytes of the segment it covers
    sealed: bool  # all of a sealed segment, else a prefix of the one being written
    parts: tuple[Part, ...]

    def data(self) -> bytes:
        return sealed_bytes(b"".join([part if isinstance(part, bytes) else part.encoded()
                                      for part in self.parts]))


def write_summary_file(directory: Path, segment_id: int, summary: PendingSummary) -> None:
    """Under a temporary name, then renamed (the writer thread, after the records it
    covers are on disk). No fsync: a summary lost in a crash is only not used."""
    path = summary_path(directory, segment_id)
    temporary = path.with_name(path.name + ".tmp")
    try:
        data = summary.data()
    except Exception:  # a cache: never fail the writer for it
        log.exception("Could not encode the summary of journal segment %d", segment_id)
        return
    try:
        temporary.write_bytes(data)
        os.replace(temporary, path)
    except OSError as e:
        log.warning("Could not write the summary of journal segment %d (%s): a start reads "
                    "that segment record by record", segment_id, e)
        temporary.unlink(missing_ok=True)


class _Growing:
    """The encoding of the item still growing, in chunks: each summary adds what was
    appended to it since the one before, and never encodes an entry twice."""

    __slots__ = ("_columns", "_dup_count", "_dups", "_entries", "item")

    def __init__(self, item: Item) -> None:
        self.item = item
        self._columns: tuple[list[bytes], ...] = ([], [], [], [], [])
        self._entries = 0
        self._dups: list[Part] = []
        self._dup_count = 0

    def parts(self) -> list[Part]:
        """The item as it is now."""
        item = self.item
        if item.kind != ADDS:
            return [item_head(item)]
        entries, dups = len(item.orders), len(item.dups)
        if entries > self._entries:
            done = self._entries
            for chunks, values in zip(self._columns, item_arrays(item), strict=False):
                chunks.append(array_bytes(values[done:entries]))
            self._entries = entries
        if dups > self._dup_count:
            self._dups.append(_Lazy(partial(encode_strings, item.dups[self._dup_count:dups])))
            self._dup_count = dups
        producers = dict(item.producers)
        return [item_head(item, entries, len(producers), dups), *chain(*self._columns),
                _Lazy(partial(encode_producers, producers)), *self._dups]


Added = tuple[str, list[str], int, int, int, Mapping[str, str]]
"""One message a record adds: destination, queue keys, its entry's offset in the
record's payload and length, its order, its headers (a stream's offset and time)."""


class SummaryBuilder:
    """Fed every record appended to the journal, in order; hands a sealed segment's
    summary, and every `partial_bytes` (0: never) one of the segment being written, to
    `seal(segment id, PendingSummary)`: the writer writes it once the records it covers
    are on disk (module docstring)."""

    def __init__(self, seal: Callable[[int, PendingSummary], None],
                 partial_bytes: int = 0, records_per_item: int = 1) -> None:
        self._seal = seal
        self._partial_bytes = partial_bytes
        self._records_per_item = records_per_item
        self._segment = 0
        self._whole = False  # saw the segment from its first record
        self._first_seq = 0
        self._last_seq = 0
        self._size = 0
        self._last_start = 0
        self._top_order = 0  # the newest order added: an older one is a compaction copy
        self._restart()

    def _restart(self) -> None:
        """Nothing of a segment seen yet."""
        self._items: list[Item] = []
        self._closed: list[Part] = []  # the encoding of items[:_handed], which are closed
        self._handed = 0
        self._growing: _Growing | None = None  # items[_handed]'s, as it grows
        self._partial_at = SEGMENT_HEADER.size  # where the last summary ended
        self._records = 0  # of the segment, so far

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
        self._top_order = 0
        self._restart()

    @property
    def items(self) -> list[Item]:
        """The items of the segment summarised now, so far."""
        return self._items

    def seal(self) -> None:
        """The current segment is complete (the writer moved on): summarise it."""
        if self._whole and self._items:
            self._seal(self._segment, self._summary(sealed=True))
        self._whole = False
        self._restart()

    def _summary(self, sealed: bool) -> PendingSummary:
        """The summary of the records seen so far: the items that will not change any
        more encoded once, the last (unless `sealed`) as it is now."""
        items = self._items
        closed = len(items) if sealed else len(items) - 1
        if self._handed < closed:
            handed = self._handed
            growing = self._growing
            if growing is not None:  # it grew until the one after it began
                self._closed.extend(growing.parts())
                handed += 1
            if handed < closed:
                self._closed.append(_Lazy(partial(encode_items, items[handed:closed])))
            self._handed, self._growing = closed, None
        parts: list[Part] = [encode_head(self._segment, self._first_seq, self._last_seq,
                                         self._size, self._last_start, len(items)),
                             *self._closed]
        if not sealed:
            if self._growing is None:
                self._growing = _Growing(items[-1])
            parts.extend(self._growing.parts())
        return PendingSummary(self._segment, self._size, sealed, tuple(parts))

    def _noted(self, seq: int, start: int, end: int) -> None:
        if not self._first_seq:
            self._first_seq = seq
        self._last_seq = seq
        self._last_start = start
        self._size = end
        self._records += 1
        if self._partial_bytes and end - self._partial_at >= self._partial_bytes:
            self._partial_at = end
            if len(self._items) * self._records_per_item <= self._records:
                self._seal(self._segment, self._summary(sealed=False))

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
