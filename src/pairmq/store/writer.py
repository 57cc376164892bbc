"""Group commit: the event loop appends, one thread writes and fdatasyncs whole groups.

Every record appended while a sync runs is covered by the next one, so a thousand
clients share one `fdatasync`. The event loop never touches the disk: it only
decides where each record lands (segment, offset), which is known at append time.

A group whose records for a segment fit in one writev is written and synced by one
system call, `pwritev2` with RWF_DSYNC (Linux 4.7+), rather than a writev and an
fdatasync. The writer thread lets go of the GIL around each system call and must take
it back from a busy event loop after each: one call a group instead of two shortens
every group commit (docs/benchmarks.md, "synchronous writes"). RWF_DSYNC makes durable
the bytes of that write only, so a segment written by more than one writev in a group
(more than IOV_MAX records) is synced by fdatasync, as before.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from pairmq.core.message import Message
from pairmq.core.paged_log import PagedLog
from pairmq.store.records import RECORD_HEADER, SEGMENT_HEADER, frame_record
from pairmq.store.segments import fsync_directory, segment_header, segment_name
from pairmq.store.stall import StallView, StallWatch, check_interval
from pairmq.store.summary import keep_summary_within, remove_summary
from pairmq.store.summary_builder import PendingSummary, write_summary_file
from pairmq.store.synctimes import SYNC_TIMES
from pairmq.store.writer_thread import WriterThread

log = logging.getLogger("pairmq.journal")

RETRY_AFTER_FAILURE_S: Final = 1.0
# space set aside so that, on a full disk, acks can still be written
RESERVE_NAME: Final = "reserve"
RESERVE_MAX: Final = 4 * 1024 * 1024
IOV_MAX: Final = 1024  # buffers per writev (Linux's limit)
RWF_DSYNC: Final = getattr(os, "RWF_DSYNC", 0)  # 0: this platform writes, then fdatasyncs
FENCE_RECHECK_S: Final = 0.05  # a fenced writer looks again this often


class Fenced(Exception):
    """The guard refused a write: this server may not write the journal now (shared store)."""


# What keeps a segment, besides its messages: the key of an object whose newest record is
# there, ("dest", name), ("durable", key), ("dup", destination, dup id), ("group", stream,
# group), ("producer", destination, producer), ("user", name), ("rule", pattern) or
# ("epoch", epoch) (store/store_state.py)
LiveKey = tuple[Any, ...]


@dataclass
class SegmentInfo:
    segment_id: int
    path: Path
    size: int = 0  # bytes assigned (written or waiting to be)
    durable_size: int = 0  # bytes known to be on disk
    # objects whose newest record lives here
    live: set[Message | LiveKey] = field(default_factory=set)
    live_bytes: int = 0  # theirs, and the paged entries'
    paged: int = 0  # entries of paged logs here (store/pages.py): they keep it too
    # paged log -> [count, lowest, highest entry]
    tail: dict[PagedLog, list[int]] = field(default_factory=dict)
    last_seq: int = 0
    first_seq: int = 0


class JournalWriter:
    def __init__(self, directory: Path, segment_bytes: int, last_seq: int,
                 segments: list[SegmentInfo], loop: asyncio.AbstractEventLoop,
                 stall_timeout_s: float = 0.0) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.loop = loop
        self.appended_seq = last_seq
        self.synced_seq = last_seq
        self.segments: dict[int, SegmentInfo] = {s.segment_id: s for s in segments}
        self.current: SegmentInfo | None = segments[-1] if segments else None
        self.pending: list[tuple[int, bytes]] = []  # (segment id, bytes) not yet handed over
        self.pending_unlinks: list[int] = []
        self.pending_summaries: list[tuple[int, PendingSummary]] = []  # summary_builder.py
        self.writing = False
        self.failure: OSError | None = None  # the last write error, until a retry succeeds
        self._waiters: deque[tuple[int, Callable[[], None]]] = deque()
        self._on_synced: list[Callable[[int], None]] = []
        self._on_append: list[Callable[[int, bytes], None]] = []
        self._on_failure: list[Callable[[OSError | None], None]] = []
        self._stalls = _StallChecks(StallWatch(stall_timeout_s), loop)  # disk completes writes?
        self._fds: dict[int, int] = {}
        self._worker = WriterThread(loop, "pairmq-journal")
        self._kick_scheduled = False
        self._retry: asyncio.TimerHandle | None = None
        self._waiting_retry = False
        self.closed = False
        self.reserve_path = directory / RESERVE_NAME
        self.reserve_bytes = min(RESERVE_MAX, segment_bytes)
        # Set on ENOSPC, cleared once the reserve could be made again: until then new
        # persistent messages are refused or held, so the reserve serves acknowledgements.
        self.short_of_space = False  # the reserve itself is made by the writer thread
        self._reserve_made = False  # known to exist: the writer thread stops looking
        self._sync_flag = RWF_DSYNC  # 0 once the kernel refused it: write, then fdatasync
        # Asked before every group is written (on the loop and again in the thread): a
        # shared-store server writes only while it can prove it holds the lock.
        self.guard: Callable[[], bool] | None = None
        if self.current is None:
            self._roll()
        self._stalls.start()

    # ------------------------------------------------------------ event-loop side

    def append(self, payload: bytes, epoch: int) -> tuple[int, int, int]:
        """Queue one record; returns (seq, segment id, offset of the payload in the file)."""
        seq = self.appended_seq + 1
        return self.append_record(seq, frame_record(seq, epoch, payload))

    def append_record(self, seq: int, record: bytes) -> tuple[int, int, int]:
        """Queue an already framed record (a backup appends the active's bytes as they are)."""
        assert seq == self.appended_seq + 1, f"record {seq} does not follow {self.appended_seq}"
        current = self.current
        assert current is not None
        if current.size + len(record) > self.segment_bytes and current.size > SEGMENT_HEADER.size:
            current = self._roll()
        offset = current.size + RECORD_HEADER.size
        self.pending.append((current.segment_id, record))
        current.size += len(record)
        current.last_seq = seq
        if not current.first_seq:
            current.first_seq = seq
        self.appended_seq = seq
        for listener in self._on_append:
            listener(seq, record)
        if not self._kick_scheduled and not self.writing:
            self._kick_scheduled = True
            self.loop.call_soon(self._kick)
        return seq, current.segment_id, offset

    def write_now(self) -> None:
        """Hand what is queued to the writer thread now rather than on the loop's next
        turn, so that its fdatasync runs while the caller goes on with other work (a
        backup applies a chunk of records while the chunk is written)."""
        if not self.writing:
            self._kick()

    def when_synced(self, seq: int, callback: Callable[[], None]) -> None:
        """Call back once every record up to seq is on disk (at once if it already is)."""
        if seq <= self.synced_seq:
            callback()
        else:
            self._waiters.append((seq, callback))

    def on_append(self, listener: Callable[[int, bytes], None]) -> None:
        """Told of every record appended (the replication stream taps it here)."""
        self._on_append.append(listener)

    def on_synced(self, listener: Callable[[int], None]) -> None:
        self._on_synced.append(listener)

    def on_failure(self, listener: Callable[[OSError | None], None]) -> None:
        """Told of a write failure (with the error) and of the recovery (with None)."""
        self._on_failure.append(listener)

    def on_stall(self, listener: Callable[[float | None], None]) -> None:
        """Told when the disk stops completing writes (the seconds the group in flight has
        waited) and when it completes them again (None)."""
        self._stalls.listeners.append(listener)

    def stall_view(self) -> StallView:
        return self._stalls.watch.view(self.loop.time())

    def unlink_segment(self, segment_id: int) -> None:
        """Delete a segment, in order with the writes (after everything appended so far)."""
        info = self.segments.pop(segment_id)
        assert info is not self.current
        self.pending_unlinks.append(segment_id)
        if not self._kick_scheduled and not self.writing:
            self._kick_scheduled = True
            self.loop.call_soon(self._kick)

    def write_summary(self, segment_id: int, summary: PendingSummary) -> None:
        """Write a segment's summary (store/summary_builder.py: a sealed segment's, or a
        prefix of the one being written), after every record appended so far is on disk:
        in the thread, after the fdatasync of the group that holds them. A cache: failing
        to write it fails nothing."""
        self.pending_summaries.append((segment_id, summary))

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.segments.values())

    def _roll(self) -> SegmentInfo:
        new_id = (self.current.segment_id + 1) if self.current else 1
        info = SegmentInfo(new_id, self.directory / segment_name(new_id))
        header = segment_header(new_id)
        self.pending.append((new_id, header))
        info.size = len(header)
        self.segments[new_id] = info
        self.current = info
        return info

    def _kick(self) -> None:
        self._kick_scheduled = False
        if self.writing or self._waiting_retry or self.closed:
            return
        if not self.pending and not self.pending_unlinks:
            return
        if self.guard is not None and not self.guard():
            self._hold()
            return
        job, self.pending = self.pending, []
        unlinks, self.pending_unlinks = self.pending_unlinks, []
        summaries, self.pending_summaries = self.pending_summaries, []
        target = self.appended_seq
        sizes = {sid: self.segments[sid].size for sid, _ in job if sid in self.segments}
        self.writing = True
        self._stalls.watch.began(self.loop.time())
        self._worker.submit(lambda: self._write(job, unlinks, summaries),
                            lambda error: self._written(error, job, unlinks, summaries,
                                                        target, sizes))

    def _written(self, error: BaseException | None, job: list[tuple[int, bytes]],
                 unlinks: list[int], summaries: list[tuple[int, PendingSummary]], target: int,
                 sizes: dict[int, int]) -> None:
        self.writing = False
        stalled_for = self._stalls.watch.ended(self.loop.time())
        if stalled_for is not None:  # said even when closed: a step-down waited for it
            self._stalls.over(stalled_for)
        if self.closed:
            return
        if isinstance(error, Fenced):
            # Nothing was written: keep the group, touch nothing on disk, look again later.
            self.pending = job + self.pending
            self.pending_unlinks = unlinks + self.pending_unlinks
            self.pending_summaries = summaries + self.pending_summaries
            self._hold()
            return
        if error is not None:
            if not isinstance(error, OSError):
                raise error  # a bug in the writer thread: not a disk's failure
            # Put the group back in front: it is retried after truncating any partial write.
            self.pending = job + self.pending
            self.pending_unlinks = unlinks + self.pending_unlinks
            self.pending_summaries = summaries + self.pending_summaries
            self._close_fds()  # the retry reopens and truncates to what is known durable
            self._waiting_retry = True
            released = error.errno == errno.ENOSPC and self._release_reserve()
            first = self.failure is None
            self.failure = error
            if first:
                log.error("Journal write failed: %s. Nothing new is confirmed until it "
                          "succeeds; retrying every %.0f s", _describe(error),
                          RETRY_AFTER_FAILURE_S)
                for listener in self._on_failure:
                    listener(error)
            delay = 0.0 if released else RETRY_AFTER_FAILURE_S
            self._retry = self.loop.call_later(delay, self._retry_write)
            return
        if self.failure is not None:
            log.info("Journal writes succeed again")
            self.failure = None
            for listener in self._on_failure:
                listener(None)
        if self.short_of_space and self.reserve_path.exists():
            self.short_of_space = False
            log.info("Disk space is back: the reserve is in place again")
            for listener in self._on_failure:
                listener(None)
        for sid, size in sizes.items():
            info = self.segments.get(sid)
            if info is not None:
                info.durable_size = size
        self.synced_seq = target
        # Start the next group before confirming this one: the disk works on it while the
        # event loop sends receipts.
        self._kick()
        waiters = self._waiters
        while waiters and waiters[0][0] <= target:
            waiters.popleft()[1]()
        for synced in self._on_synced:
            synced(target)

    def _hold(self) -> None:
        self._waiting_retry = True
        self._retry = self.loop.call_later(FENCE_RECHECK_S, self._retry_write)

    def _retry_write(self) -> None:
        self._retry = None
        self._waiting_retry = False
        self._kick()

    # ------------------------------------------------------------ writer thread

    def _fd(self, segment_id: int) -> int:
        fd = self._fds.get(segment_id)
        if fd is None:
            path = self.directory / segment_name(segment_id)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            self._fds[segment_id] = fd
        return fd

    def _write(self, job: list[tuple[int, bytes]], unlinks: list[int],
               summaries: list[tuple[int, PendingSummary]]) -> None:
        if self.guard is not None and not self.guard():
            raise Fenced()
        touched: dict[int, int] = {}
        unsynced: list[int] = []  # fds whose writes of this group are not yet durable
        created = False
        started = time.perf_counter()
        # One writev per run of records bound for the same segment: every system call lets
        # go of the GIL, and taking it back from a busy event loop can take milliseconds.
        # A segment's only run is also synced by that call (the module's docstring).
        start = 0
        while start < len(job):
            segment_id = job[start][0]
            end = start + 1
            while end < len(job) and job[end][0] == segment_id and end - start < IOV_MAX:
                end += 1
            only_run = ((start == 0 or job[start - 1][0] != segment_id)
                        and (end == len(job) or job[end][0] != segment_id))
            fd = self._fds.get(segment_id)
            if fd is None:
                created = True
                # (The segment a start goes on with may have a summary: it covers what was
                # there, and records appended after it change nothing it says: summary.py.)
                fd = self._fd(segment_id)
                # After a failed attempt the file may hold a partial write: cut it back.
                durable = self._durable_size(segment_id)
                keep_summary_within(self.directory, segment_id, durable)
                os.ftruncate(fd, durable)
                os.lseek(fd, durable, os.SEEK_SET)
            buffers = [data for _, data in job[start:end]]
            if not (only_run and self._write_synced(fd, buffers)):
                write_all(fd, buffers)
                if fd not in unsynced:
                    unsynced.append(fd)
            touched[segment_id] = fd
            start = end
        for fd in unsynced:
            os.fdatasync(fd)
        if touched:
            SYNC_TIMES.observe(time.perf_counter() - started)
        if created:
            fsync_directory(self.directory)
        # The records they cover are on disk now. Of a segment's, the newest only (a prefix
        # summary and the sealed one, those held while writes failed).
        for segment_id, summary in dict(summaries).items():
            write_summary_file(self.directory, segment_id, summary)
        for segment_id in unlinks:
            fd = self._fds.pop(segment_id, None)
            if fd is not None:
                os.close(fd)
            remove_summary(self.directory, segment_id)  # first: none outlives its segment
            try:
                os.unlink(self.directory / segment_name(segment_id))
            except FileNotFoundError:
                pass
        if unlinks:
            fsync_directory(self.directory)
        if not self._reserve_made:
            self._make_reserve()

    def _write_synced(self, fd: int, buffers: list[bytes]) -> bool:
        """Write `buffers` and make them durable in one system call; False, having written
        nothing, where the kernel cannot (the caller writes them and calls fdatasync)."""
        if not self._sync_flag:
            return False
        total = sum(len(b) for b in buffers)
        try:
            written = os.pwritev(fd, buffers, -1, self._sync_flag)  # -1: at the file offset
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            self._sync_flag = 0
            log.info("The kernel refused a synchronous write (%s): the journal writes, "
                     "then calls fdatasync", _describe(e))
            return False
        if written < total:  # a short write: the rest is written, then synced, as usual
            rest = memoryview(b"".join(buffers))
            while written < total:
                written += os.write(fd, rest[written:])
            os.fdatasync(fd)
        return True

    def _make_reserve(self) -> None:
        """Set space aside while the disk has room (twice the reserve free), quietly."""
        try:
            if self.reserve_path.exists():
                self._reserve_made = True
                return
            stats = os.statvfs(self.directory)
            if stats.f_bavail * stats.f_frsize < 2 * self.reserve_bytes:
                return
            with open(self.reserve_path, "wb") as f:
                f.write(bytes(self.reserve_bytes))
                f.flush()
                os.fsync(f.fileno())
            self._reserve_made = True
        except OSError:
            try:
                self.reserve_path.unlink()
            except OSError:
                pass

    def _release_reserve(self) -> bool:
        self.short_of_space = True
        self._reserve_made = False
        try:
            self.reserve_path.unlink()
        except OSError:
            return False
        log.warning("Disk full: released the %d-byte reserve so that acknowledgements can be "
                    "written and compaction can free space", self.reserve_bytes)
        return True

    def _durable_size(self, segment_id: int) -> int:
        info = self.segments.get(segment_id)
        return info.durable_size if info is not None else 0

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def close(self) -> None:
        self.stop()
        self.release()

    def stop(self) -> None:
        """Start nothing more (the event loop's half of `close`)."""
        self.closed = True
        if self._retry is not None:
            self._retry.cancel()
        self._stalls.stop()

    def release(self) -> None:
        """Wait for the group in flight, then close the files (the other half of `close`:
        it may wait as long as the disk does, so a stalled disk's is run in a thread)."""
        self._worker.shutdown()
        self._close_fds()


class _StallChecks:
    """The writer's stall watch at work: looked at every `check_interval`, and whoever
    listens told when a stall begins and ends (logged here)."""

    def __init__(self, watch: StallWatch, loop: asyncio.AbstractEventLoop) -> None:
        self.watch = watch
        self._loop = loop
        self.listeners: list[Callable[[float | None], None]] = []
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.watch.timeout_s > 0:
            self._timer = self._loop.call_later(check_interval(self.watch.timeout_s),
                                                self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        watch, loop = self.watch, self._loop
        self._timer = loop.call_later(check_interval(watch.timeout_s), self._check)
        waited = watch.check(loop.time())
        if waited is not None:
            log.error("Journal write pending for %.1f s: the disk is not completing writes "
                      "(stall_timeout_ms = %d); nothing is confirmed until it does",
                      waited, round(watch.timeout_s * 1000))
            for listener in self.listeners:
                listener(waited)

    def over(self, stalled_for: float) -> None:
        log.warning("Journal writes complete again, after a stall of %.1f s", stalled_for)
        for listener in self.listeners:
            listener(None)


def write_all(fd: int, buffers: list[bytes]) -> None:
    """writev until every byte is written (a short write resumes where it stopped)."""
    total = sum(len(b) for b in buffers)
    written = os.writev(fd, buffers)
    if written == total:
        return
    data = memoryview(b"".join(buffers))
    while written < total:
        written += os.write(fd, data[written:])


def _describe(error: OSError) -> str:
    if error.errno == errno.ENOSPC:
        return "the disk is full (ENOSPC)"
    return f"{error.strerror or error} (errno {error.errno})"
