"""Segment files: naming, headers, and scanning them back with damage detection.

A crash can only tear the end of the newest segment (writes are appends, and a
segment is complete before the next one starts). Anything wrong elsewhere is
corruption, which is never skipped silently.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pairmq.store.records import (
    CRC_FROM,
    FORMAT_VERSION,
    RECORD_HEADER,
    SEGMENT_HEADER,
    SEGMENT_MAGIC,
)

SEGMENT_RE = re.compile(r"^journal-(\d{8})\.seg$")


def segment_name(segment_id: int) -> str:
    return f"journal-{segment_id:08d}.seg"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    found = []
    if directory.is_dir():
        for path in directory.iterdir():
            m = SEGMENT_RE.match(path.name)
            if m:
                found.append((int(m.group(1)), path))
    return sorted(found)


def segment_header(segment_id: int) -> bytes:
    return SEGMENT_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, segment_id)


@dataclass
class SegmentScan:
    segment_id: int
    path: Path
    size: int
    valid_end: int  # bytes up to here hold whole, checked records
    records: int = 0
    first_seq: int = 0
    last_seq: int = 0
    last_epoch: int = 0
    problem: str | None = None  # what is wrong at valid_end, if anything
    at_tail: bool = False  # the problem runs to the end of the file (a torn write)
    gap: bool = False  # the first record read is not the one expected (`next_seq`)


# visit(seq, epoch, kind, payload, payload_offset_in_file)
Visitor = Callable[[int, int, int, memoryview, int], None]


def scan_segment(segment_id: int, path: Path, visit: Visitor | None = None,
                 after_seq: int = 0, start: int = 0, next_seq: int = 0,
                 limit_bytes: int = 0) -> SegmentScan:
    """Check every record of one segment, handing the good ones to `visit` in order.

    `start`: the offset to read from (a record boundary found by an earlier scan; 0 = the
    first record). `next_seq`: the sequence number the first record read must have (0 = any
    above `after_seq`): a reader following a journal that another process appends to and
    compacts knows that way that it missed nothing. `limit_bytes`: stop at the first record
    boundary after reading that many bytes (0 = no limit), without a problem."""
    size = path.stat().st_size
    scan = SegmentScan(segment_id, path, size, 0)
    if size == 0:
        scan.problem, scan.at_tail = "empty segment (no header)", True
        return scan
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(data)
    try:
        _scan(view, scan, visit, after_seq, start, next_seq, limit_bytes)
    finally:
        # A view of a record the visitor raised on lives on in the traceback: the map is
        # then freed with it, and the visitor's error, not this, is what the caller sees.
        with contextlib.suppress(BufferError):
            view.release()
            data.close()
    return scan


def _scan(view: memoryview, scan: SegmentScan, visit: Visitor | None, after_seq: int,
          start: int = 0, next_seq: int = 0, limit_bytes: int = 0) -> None:
    import zlib

    size = scan.size
    if size < SEGMENT_HEADER.size:
        scan.problem, scan.at_tail = "segment header is incomplete", True
        return
    magic, version, _, header_id = SEGMENT_HEADER.unpack_from(view, 0)
    if magic != SEGMENT_MAGIC:
        scan.problem = "not a pairmq journal segment (bad magic)"
        return
    if version != FORMAT_VERSION:
        scan.problem = f"journal format version {version}; this pairmq reads {FORMAT_VERSION}"
        return
    if header_id != scan.segment_id:
        scan.problem = f"segment header says id {header_id}, file name says {scan.segment_id}"
        return
    pos = max(SEGMENT_HEADER.size, start)
    scan.valid_end = pos
    stop_at = pos + limit_bytes if limit_bytes else size
    last_seq = after_seq
    hsize = RECORD_HEADER.size
    unpack = RECORD_HEADER.unpack_from
    crc32 = zlib.crc32
    # Kept in locals and written back once: this loop runs for every record of a start.
    records = first_seq = last_epoch = 0
    try:
        while pos < size:
            if pos >= stop_at:
                return
            if size - pos < hsize:
                scan.problem = f"incomplete record header ({size - pos} bytes)"
                scan.at_tail = True
                return
            length, crc, seq, epoch, kind = unpack(view, pos)
            end = pos + hsize + length
            if end > size:
                scan.problem = f"record of {length} bytes runs past the end of the file"
                scan.at_tail = True
                return
            if crc32(view[pos + CRC_FROM:end]) != crc:  # one call over the bytes as they lie
                scan.problem = f"checksum mismatch in record at offset {pos}"
                scan.at_tail = end == size or _zeros_to_end(view, pos)
                return
            if seq <= last_seq:
                scan.problem = f"sequence {seq} at offset {pos} does not follow {last_seq}"
                scan.at_tail = _zeros_to_end(view, pos)
                return
            if next_seq and not records and seq != next_seq:
                scan.problem = f"sequence {seq} at offset {pos}, expected {next_seq}"
                scan.gap = True
                return
            if visit is not None:
                visit(seq, epoch, kind, view[pos + hsize:end], pos + hsize)
            if not records:
                first_seq = seq
            records += 1
            last_seq = seq
            last_epoch = epoch
            pos = end
    finally:
        if records:
            scan.records, scan.first_seq = records, first_seq
            scan.last_seq, scan.last_epoch = last_seq, last_epoch
        scan.valid_end = pos


def _zeros_to_end(view: memoryview, pos: int) -> bool:
    """Blocks allocated but never written before a power loss read back as zeros: that is a
    torn tail too, not corruption."""
    return not any(view[pos:])


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: Path, segment_id: int, from_seq: int, to_seq: int) -> list[bytes]:
    """Framed records with from_seq <= seq <= to_seq, as they are on disk (for a backup)."""
    hsize = RECORD_HEADER.size
    out: list[bytes] = []

    def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int) -> None:
        if from_seq <= seq <= to_seq:
            out.append(bytes(whole[offset - hsize:offset + len(payload)]))

    with open(path, "rb") as f:
        whole = f.read()
    scan = SegmentScan(segment_id, path, len(whole), 0)
    view = memoryview(whole)
    try:
        _scan(view, scan, visit, 0)
    finally:
        view.release()
    if scan.problem is not None and not scan.at_tail:
        raise OSError(f"{path} is damaged at offset {scan.valid_end}: {scan.problem}")
    return out
