"""The replication stream's framing: records as the active ships them to its backup.

The replication stream carries journal records exactly as they are on disk (header,
CRC, body), so the backup's journal holds the very bytes the active wrote. This module
is the only place outside the journal writer that knows that framing.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

from pairmq.store.records import CRC_PART, RECORD_HEADER
from pairmq.store.segments import read_records


class MirrorError(Exception):
    """A replicated chunk is damaged or does not follow the backup's journal."""


def new_records(chunk: bytes, after: int) -> Iterator[tuple[int, int, bytes]]:
    """The records of `chunk` that follow sequence `after`, as (seq, epoch, bytes): each
    one's CRC checked, with no gap; records at or below `after` (sent twice around a
    synchronisation) are skipped."""
    view = memoryview(chunk)
    pos = 0
    size = RECORD_HEADER.size
    expected = after + 1
    while pos < len(view):
        if len(view) - pos < size:
            raise MirrorError(f"replicated chunk ends inside a record header at byte {pos}")
        length, crc, seq, epoch, kind = RECORD_HEADER.unpack_from(view, pos)
        end = pos + size + length
        body = view[pos + size:end]
        if len(body) != length or zlib.crc32(body, zlib.crc32(
                CRC_PART.pack(seq, epoch, kind))) != crc:
            raise MirrorError(f"replicated record {seq} is damaged")
        if seq >= expected:
            if seq != expected:
                raise MirrorError(f"replication gap: got {seq} after {expected - 1}")
            yield seq, epoch, bytes(view[pos:end])
            expected += 1
        pos = end


def segment_chunks(path: Path, segment_id: int, first: int, upto: int,
                   chunk_bytes: int) -> list[bytes]:
    """The records `first`..`upto` of one segment file, as the replication stream sends
    them: whole records joined into chunks of about `chunk_bytes` (blocking: run it in an
    executor)."""
    chunks: list[bytes] = []
    pending: list[bytes] = []
    size = 0
    for record in read_records(path, segment_id, first, upto):
        pending.append(record)
        size += len(record)
        if size >= chunk_bytes:
            chunks.append(b"".join(pending))
            pending, size = [], 0
    if pending:
        chunks.append(b"".join(pending))
    return chunks
