"""A local copy of the database's journal: its rows written out as segment files, which the
server then recovers from as from its own journal (store/recovery.py).

With `[store] url` the database holds the journal; DATA_DIR/journal is a copy of it, kept
across restarts as far as it is the database's (store/database/resume.py) and otherwise
made anew whenever the server takes the lease, and kept by the server's own writer while it
serves (every record is appended there and copied into the database). Reading bodies back,
paging, streams, compaction and summaries therefore work on the copy exactly as on a file
journal.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pairmq.store.database import resume
from pairmq.store.records import SEGMENT_HEADER
from pairmq.store.segments import fsync_directory, segment_header, segment_name

# Rows are whole records (a group of messages, often tens of KiB): fetched a few at a time,
# else a fetch holds hundreds of MiB that the process keeps after the restore
FETCH_ROWS = 64
BATCH_BYTES = 4 << 20  # rows written to the files per call of the thread
PULL_BYTES = 16 << 20
MAX_COMPARED = 100_000  # records past `committed` compared one by one; more: made anew


@dataclass(frozen=True)
class Restored:
    records: int  # written into the copy from the database
    bytes: int
    first_seq: int
    last_seq: int
    kept: int = 0  # resumed: the local journal kept up to this seq
    compared: int = 0  # ... after comparing this many of its records with the database's


class _SegmentFiles:
    """Writes framed records into numbered segment files, rolling at `segment_bytes`
    (called in a thread: writes and fdatasync never hold the event loop)."""

    def __init__(self, directory: Path, segment_bytes: int, after_segment: int = 0) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.segment_id = after_segment
        self.size = 0
        self.file: Any = None

    def add_all(self, records: list[bytes]) -> None:
        for record in records:
            if self.file is None or (self.size + len(record) > self.segment_bytes
                                     and self.size > SEGMENT_HEADER.size):
                self._roll()
            self.file.write(record)
            self.size += len(record)
        if self.file is not None:  # readers (a backup reading ahead) see whole records
            self.file.flush()

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
    """A local copy of the database's journal: filled from one snapshot, or the journal
    already there kept as far as it is the database's (store/database/resume.py), then
    pulled forward as rows are committed (a shared-store backup), so that a takeover or a
    restart reads only the tail (docs/database.md). File work runs in a thread."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.files = _SegmentFiles(directory, segment_bytes)
        self.first_seq = self.last_seq = 0
        self.records = self.bytes = 0
        self.filled_bytes = 0  # what the snapshot held, or the journal kept
        self.kept = self.compared = 0  # resumed: records kept, of which compared

    async def _in_thread(self, job: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, job, *args)

    async def fill(self, conn: Any, schema: str) -> Restored:
        """Empty the directory and write the database's journal into it, from one snapshot."""
        await self._in_thread(clear, self.directory)
        self.files = _SegmentFiles(self.directory, self.segment_bytes)
        self.first_seq = self.last_seq = self.records = self.bytes = 0
        self.kept = self.compared = 0
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            batch: list[bytes] = []
            size = 0
            async for seq, data in conn.cursor(
                    f"SELECT seq, data FROM {schema}.journal ORDER BY seq", prefetch=FETCH_ROWS):
                batch.append(data)
                size += len(data)
                self._count(seq, data)
                if size >= BATCH_BYTES:
                    await self._in_thread(self.files.add_all, batch)
                    batch, size = [], 0
            await self._in_thread(self.files.add_all, batch)
        self.filled_bytes = self.bytes
        return self.restored

    async def resume(self, conn: Any, schema: str) -> Restored | None:
        """Keep the journal already in the directory as far as it is the database's, then
        pull the rest; None: nothing can be kept (the caller fills the copy anew)."""
        local = await self._in_thread(resume.survey, self.directory)
        if local is None or not local.last_seq:
            return None
        low, high = await conn.fetchrow(f"SELECT min(seq), max(seq) FROM {schema}.journal")
        if high is None:
            return None
        committed = min(resume.read_committed(self.directory), local.last_seq)
        upto = min(local.last_seq, high)
        if committed + 1 < low or upto - committed > MAX_COMPARED:
            return None  # the rows to compare with are gone, or too many to compare
        cut = local.last_seq + 1 if local.last_seq <= high else high + 1
        if committed < upto:
            mine = await self._in_thread(resume.records_between, self.directory,
                                         committed + 1, upto)
            theirs = await conn.fetch(f"SELECT seq, data FROM {schema}.journal WHERE seq "
                                      "BETWEEN $1 AND $2 ORDER BY seq", committed + 1, upto)
            self.compared = len(theirs)
            for seq, data in theirs:
                if mine.get(seq) != data:
                    cut = seq
                    break
        if cut <= local.last_seq:
            await self._in_thread(resume.cut_from, self.directory, cut)
        kept = min(local.last_seq, cut - 1)
        if kept + 1 < low:
            return None  # the rows after what is kept were deleted: it would miss them
        self.files = _SegmentFiles(self.directory, self.segment_bytes, local.last_segment)
        self.first_seq, self.last_seq, self.kept = low, kept, kept
        self.records = self.bytes = 0
        self.filled_bytes = local.bytes
        while await self.pull(conn, schema, PULL_BYTES):
            pass
        return self.restored

    async def pull(self, conn: Any, schema: str, limit_bytes: int) -> int:
        """Append the rows committed since the last pull (about `limit_bytes` at most);
        returns the bytes appended."""
        got = await conn.fetch(f"SELECT seq, data FROM {schema}.journal WHERE seq > $1 "
                               "ORDER BY seq LIMIT $2", self.last_seq,
                               max(1, limit_bytes // 512))
        if got and self.last_seq and got[0][0] != self.last_seq + 1:
            raise Behind(f"rows {self.last_seq + 1} to {got[0][0] - 1} were deleted first")
        batch: list[bytes] = []
        size = 0
        for seq, data in got:
            batch.append(data)
            self._count(seq, data)
            size += len(data)
            if size >= limit_bytes:
                break
        await self._in_thread(self.files.add_all, batch)
        return size

    def _count(self, seq: int, data: bytes) -> None:
        self.records += 1
        self.bytes += len(data)
        self.first_seq = self.first_seq or seq
        self.last_seq = seq

    @property
    def restored(self) -> Restored:
        return Restored(self.records, self.bytes, self.first_seq, self.last_seq, self.kept,
                        self.compared)

    async def seal(self) -> None:
        """On disk (before serving from it), and what is the database's written down."""
        await self._in_thread(self.files.close)
        await self._in_thread(resume.write_committed, self.directory, self.last_seq)


async def restore(conn: Any, schema: str, directory: Path, segment_bytes: int) -> Restored:
    """The local copy in `directory`: the journal there kept as far as it is the
    database's and the rest pulled, or (nothing to keep) made anew from one snapshot."""
    copy = LocalCopy(directory, segment_bytes)
    restored = await copy.resume(conn, schema)
    if restored is None:
        restored = await copy.fill(conn, schema)
    await copy.seal()
    return restored
