"""Keeping a local copy of the database's journal across restarts: which of its records are
the database's, cutting the rest.

Every record a server appends to its local journal goes to the database in the same order,
and a row is never rewritten (only deleted once dead). So the local journal is the
database's up to the last record this server saw committed there, `committed` (written
down in DATA_DIR/journal/database-committed, lagging behind: an older number is only
safer), and may differ after it: records appended but never committed (a crash, a lost
lease), which another server then numbered again. Those are compared with the database's
rows one by one, and the local journal is cut at the first that differs, or past the
database's last row. Whatever follows comes from the database.

These are file operations, run in a thread by store/database/restore.py's `LocalCopy`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from pairmq.store.records import RECORD_HEADER
from pairmq.store.segments import list_segments, read_records, scan_segment
from pairmq.store.summary import cut_segment, remove_summary

COMMITTED_NAME = "database-committed"


def read_committed(directory: Path) -> int:
    """The last seq known to be committed in the database as it is here (0: none known)."""
    try:
        return int((directory / COMMITTED_NAME).read_text().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def write_committed(directory: Path, seq: int) -> None:
    """Atomically (rename), without fsync: after a crash an older number, which only
    makes the next start compare more records."""
    temporary = directory / f"{COMMITTED_NAME}.tmp"
    with contextlib.suppress(FileNotFoundError):  # the directory was just cleared
        temporary.write_text(str(seq))
        os.replace(temporary, directory / COMMITTED_NAME)


@dataclass(frozen=True)
class LocalJournal:
    last_seq: int  # 0: no record
    last_segment: int  # the highest segment id present
    bytes: int


def survey(directory: Path) -> LocalJournal | None:
    """The local journal's end, its torn tail (a crash mid-write) cut; None: there is
    none, or it is damaged before its end (then it is made anew from the database)."""
    found = list_segments(directory)
    if not found:
        return None
    size = sum(path.stat().st_size for _, path in found)
    for segment_id, path in reversed(found):
        scan = scan_segment(segment_id, path)
        if scan.problem is not None:
            if not scan.at_tail:
                return None
            # (its summary, if it covers more, removed first: store/summary.py)
            cut_segment(directory, segment_id, path, scan.valid_end)
        if scan.records:
            return LocalJournal(scan.last_seq, found[-1][0], size)
    return LocalJournal(0, found[-1][0], size)


def records_between(directory: Path, first: int, last: int) -> dict[int, bytes]:
    """The local journal's records numbered first..last, as they are on disk."""
    out: dict[int, bytes] = {}
    for segment_id, path in reversed(list_segments(directory)):
        scan = scan_segment(segment_id, path)
        if not scan.records or scan.last_seq < first:
            if scan.records:
                break
            continue
        for record in read_records(path, segment_id, first, last):
            out[RECORD_HEADER.unpack_from(record)[2]] = record
        if scan.first_seq <= first:
            break
    return out


def cut_from(directory: Path, seq: int) -> None:
    """Remove every record numbered seq or more (segments after it, and its segment's end
    from that record on); their summaries go with them."""
    for segment_id, path in reversed(list_segments(directory)):
        scan = scan_segment(segment_id, path)
        if scan.records and scan.first_seq < seq:
            at = _offset_of(segment_id, path, seq)
            if at is not None:
                cut_segment(directory, segment_id, path, at)  # (its summary first)
            return
        remove_summary(directory, segment_id)
        path.unlink()


def _offset_of(segment_id: int, path: Path, seq: int) -> int | None:
    """Where the record numbered seq (or the first after it) starts in the file."""
    found: list[int] = []

    def visit(number: int, epoch: int, kind: int, payload: memoryview, offset: int) -> None:
        if number >= seq and not found:
            found.append(offset - RECORD_HEADER.size)

    scan_segment(segment_id, path, visit)
    return found[0] if found else None
