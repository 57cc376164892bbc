"""A local copy of the database's journal: its rows written out as segment files, which the
server then recovers from as from its own journal (store/recovery.py).

With `[store] url` the database holds the journal; DATA_DIR/journal is a copy of it, made
anew by `restore` whenever the server takes the lease, and kept by the server's own writer
while it serves (every record is appended there and copied into the database). Reading
bodies back, paging, streams, compaction and summaries therefore work on the copy exactly as
on a file journal.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pairmq.store.records import SEGMENT_HEADER
from pairmq.store.segments import fsync_directory, segment_header, segment_name

FETCH_ROWS = 2000


@dataclass(frozen=True)
class Restored:
    records: int
    bytes: int
    first_seq: int
    last_seq: int


class _SegmentFiles:
    """Writes framed records into numbered segment files, rolling at `segment_bytes`."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.segment_id = 0
        self.size = 0
        self.file: Any = None

    def add(self, record: bytes) -> None:
        if self.file is None or (self.size + len(record) > self.segment_bytes
                                 and self.size > SEGMENT_HEADER.size):
            self._roll()
        self.file.write(record)
        self.size += len(record)

    def _roll(self) -> None:
        self._close_file()
        self.segment_id += 1
        self.file = open(self.directory / segment_name(self.segment_id), "wb",  # noqa: SIM115
                         buffering=1 << 20)
        header = segment_header(self.segment_id)
        self.file.write(header)
        self.size = len(header)

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fdatasync(self.file.fileno())
            self.file.close()
            self.file = None

    def close(self) -> None:
        self._close_file()
        fsync_directory(self.directory)


def clear(directory: Path) -> None:
    """Remove the local copy (segments, summaries, the reserve): the database holds it all."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)


async def restore(conn: Any, schema: str, directory: Path, segment_bytes: int) -> Restored:
    """Write the database's journal into `directory` (emptied first), in one snapshot."""
    clear(directory)
    files = _SegmentFiles(directory, segment_bytes)
    records = size = first = last = 0
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            cursor = conn.cursor(f"SELECT seq, data FROM {schema}.journal ORDER BY seq",
                                 prefetch=FETCH_ROWS)
            async for seq, data in cursor:
                files.add(data)
                records += 1
                size += len(data)
                first = first or seq
                last = seq
    finally:
        files.close()
    return Restored(records, size, first, last)
