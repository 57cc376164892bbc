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

    def flush(self) -> None:
        """Readers of the files (a backup reading ahead) see every whole record added."""
        if self.file is not None:
            self.file.flush()

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fdatasync(self.file.fileno())
            self.file.close()
            self.file = None

    def close(self) -> None:
        self._close_file()
        if self.directory.exists():
            fsync_directory(self.directory)


def clear(directory: Path) -> None:
    """Remove the local copy (segments, summaries, the reserve): the database holds it all."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)


class Behind(Exception):
    """Rows the copy had not read yet were deleted (the journal's horizon passed it): the
    copy would hold a record without the later ones that ended it, so it is made anew."""


class LocalCopy:
    """A local copy of the database's journal, only ever appended from the database's rows:
    filled from one snapshot, then (a shared-store backup) pulled forward as the active
    server commits, so that a takeover reads only the tail (docs/database.md)."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.files = _SegmentFiles(directory, segment_bytes)
        self.first_seq = self.last_seq = 0
        self.records = self.bytes = 0
        self.filled_bytes = 0  # what the snapshot held

    async def fill(self, conn: Any, schema: str) -> Restored:
        """Empty the directory and write the database's journal into it, from one snapshot."""
        clear(self.directory)
        self.files = _SegmentFiles(self.directory, self.segment_bytes)
        self.first_seq = self.last_seq = self.records = self.bytes = 0
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            cursor = conn.cursor(f"SELECT seq, data FROM {schema}.journal ORDER BY seq",
                                 prefetch=FETCH_ROWS)
            async for seq, data in cursor:
                self._add(seq, data)
        self.files.flush()
        self.filled_bytes = self.bytes
        return self.restored

    async def pull(self, conn: Any, schema: str, limit_bytes: int) -> int:
        """Append the rows committed since the last pull (about `limit_bytes` at most);
        returns the bytes appended."""
        got = await conn.fetch(f"SELECT seq, data FROM {schema}.journal WHERE seq > $1 "
                               "ORDER BY seq LIMIT $2", self.last_seq,
                               max(1, limit_bytes // 512))
        if got and self.last_seq and got[0][0] != self.last_seq + 1:
            raise Behind(f"rows {self.last_seq + 1} to {got[0][0] - 1} were deleted first")
        size = 0
        for seq, data in got:
            self._add(seq, data)
            size += len(data)
            if size >= limit_bytes:
                break
        self.files.flush()
        return size

    def _add(self, seq: int, data: bytes) -> None:
        self.files.add(data)
        self.records += 1
        self.bytes += len(data)
        self.first_seq = self.first_seq or seq
        self.last_seq = seq

    @property
    def restored(self) -> Restored:
        return Restored(self.records, self.bytes, self.first_seq, self.last_seq)

    def seal(self) -> None:
        """On disk (before serving from it)."""
        self.files.close()


async def restore(conn: Any, schema: str, directory: Path, segment_bytes: int) -> Restored:
    """Write the database's journal into `directory` (emptied first), in one snapshot."""
    copy = LocalCopy(directory, segment_bytes)
    restored = await copy.fill(conn, schema)
    copy.seal()
    return restored
