"""`pairmq journal check` on segment summaries (store/summary.py): each one compared with
every record of its segment, which a start does not read.

A start checks a summary against a few record headers only (`summary_mismatch`); the
check reads the records themselves: each item must hold exactly the records it names (its
sequence numbers, in its epoch, between its offsets), and an ADDS item exactly the
entries its records give when a `SummaryBuilder` is fed them again as a backup feeds it
(`summarise_entries`): where each entry lies, its order and size, a stream's offsets and
times, the producers' sequences and the dup-ids. A mismatch is a problem of the summary,
not of the journal: a start would read that segment record by record. A prefix summary
(of a segment being written when the server stopped) is compared with the records it
covers; those after it are the start's to read.
"""

from __future__ import annotations

from array import array

from pairmq.store.record_decoding import DecodedEntry
from pairmq.store.records import RECORD_HEADER
from pairmq.store.summary import ADDS, Item, SegmentSummary, summary_incoherence
from pairmq.store.summary_builder import SummaryBuilder, summarise_entries

# an ADDS item's fields, compared in this order, as the check names them
_COMPARED = (("destination", "destination"), ("queue_keys", "queues"),
             ("offsets", "entries' offsets"), ("lengths", "entries' lengths"),
             ("orders", "entries' orders"), ("sizes", "entries' sizes"),
             ("stream_first", "stream offset"), ("stamps", "stream times"),
             ("producers", "producers' sequences"), ("dups", "dup-ids"))


class SummaryVerifier:
    """Fed every record of one segment in order (`record`), then `mismatch` says how the
    summary differs from those it covers (None: it describes them)."""

    def __init__(self, summary: SegmentSummary, segment_id: int) -> None:
        self.summary = summary
        self.segment_id = segment_id
        self.problem: str | None = None
        if summary.segment_id != segment_id:
            self.problem = f"is the summary of segment {summary.segment_id}"
        else:
            incoherent = summary_incoherence(summary, every_entry=True)
            if incoherent:
                self.problem = f"does not hold together ({incoherent})"
        self._index = 0  # the item the next record belongs to
        self._seen = 0  # records of it seen so far
        self._builder: SummaryBuilder | None = None  # an ADDS item's, rebuilt
        self._last_start = 0

    def record(self, seq: int, epoch: int, start: int, payload_end: int,
               entries: list[DecodedEntry]) -> None:
        """One record of the segment: its header at `start`, its payload's end, its
        entries decoded."""
        if self.problem is not None:
            return
        items = self.summary.items
        while self._index < len(items) and start >= items[self._index].end:
            self._close()
            if self.problem is not None:
                return
        if self._index == len(items):
            if start < self.summary.size:
                self._mismatch(f"record {seq} at offset {start} lies past its last item")
            return  # (after what a prefix summary covers)
        item = items[self._index]
        expected = item.first_seq + self._seen
        if (start == item.start) != (self._seen == 0) or seq != expected \
                or epoch != item.epoch or payload_end > item.end:
            self._mismatch(f"item {self._index} names seq {expected} of epoch {item.epoch} "
                           f"in bytes {item.start}-{item.end}; the record at offset {start} "
                           f"is seq {seq} of epoch {epoch} to {payload_end}")
            return
        self._seen += 1
        self._last_start = start
        if item.kind == ADDS:
            if self._builder is None:
                self._builder = SummaryBuilder(lambda segment_id, data: None)
                self._builder.resume(self.segment_id)
            summarise_entries(self._builder, entries, seq, epoch, self.segment_id,
                              start + RECORD_HEADER.size, payload_end)

    def mismatch(self, size: int) -> str | None:
        """After the last record of a segment of `size` bytes: how the summary differs."""
        while self.problem is None and self._index < len(self.summary.items):
            self._close()
        if self.problem is None and size < self.summary.size:
            self._mismatch(f"size {size} < the {self.summary.size} it covers")
        if self.problem is None and self._last_start != self.summary.last_start:
            self._mismatch(f"the last record is at offset {self._last_start}, not "
                           f"{self.summary.last_start}")
        return self.problem

    def _close(self) -> None:
        """The records of the current item were all fed: do they make it?"""
        index = self._index
        item = self.summary.items[index]
        if self._seen != item.records:
            self._mismatch(f"item {index} names {item.records} records from seq "
                           f"{item.first_seq}; the segment holds {self._seen} of them")
        elif item.kind == ADDS:
            assert self._builder is not None
            difference = _difference(item, self._builder.items)
            if difference:
                seqs = f"seq {item.first_seq}" if item.records == 1 \
                    else f"seqs {item.first_seq}-{item.last_seq}"
                self._mismatch(f"item {index}, the new messages of {seqs} for "
                               f"{item.destination}: {difference}")
        self._index, self._seen, self._builder = index + 1, 0, None

    def _mismatch(self, what: str) -> None:
        self.problem = f"does not match it ({what})"


def _difference(item: Item, rebuilt: list[Item]) -> str | None:
    """How an ADDS item differs from the one its records make again (None: it does not)."""
    if len(rebuilt) != 1 or rebuilt[0].kind != ADDS:
        return "its records are not one run of new messages for one destination"
    again = rebuilt[0]
    for name, named in _COMPARED:
        listed, found = getattr(item, name), getattr(again, name)
        if listed == found:
            continue
        if isinstance(listed, array) and len(listed) == len(found):
            at = next(i for i, (a, b) in enumerate(zip(listed, found, strict=True)) if a != b)
            return f"its {named} differ from its records' at entry {at} ({listed[at]} != " \
                   f"{found[at]})"
        return f"its {named} differ from its records'"
    return None
