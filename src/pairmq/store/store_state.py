"""What the parts of the store share: its state, its segment files' read descriptors, and
the steps each part asks of another.

`Store` (store/store.py) is written in four parts, one file each: appends, liveness and
reading bodies back (store.py), recovery (recovery.py), compaction (compaction.py) and a
backup's mirror (mirror.py). The parts are stacked in one line over this class (Store,
Recovering, Compacting, Mirroring, StoreState: single inheritance, which mypyc compiles
to a native class, as core/broker/__init__.py says of the Broker's), so every member a
part reads is declared here, with its type; a step one part asks of another is declared
below with its signature, and defined by the part that owns it
(tests/store/test_store_parts.py checks that the Store defines each).

Liveness: every object whose newest record is in a segment (a message held by a durable
queue, or the key of a destination, a durable subscription, a remembered dup-id, ...:
`LiveKey`) is in that segment's `live` set, and counts in its `live_bytes`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pairmq.core import Broker, Message
from pairmq.core.records import Record
from pairmq.store.pages import PagedEntries
from pairmq.store.paging import PagedBytes
from pairmq.store.reading import JournalReading
from pairmq.store.settings import StoreSettings
from pairmq.store.summary_builder import SummaryBuilder
from pairmq.store.writer import JournalWriter, LiveKey, SegmentInfo

# bytes a destination/durable/dup/epoch record takes, for live-byte estimates
KEY_OVERHEAD: Final = 64


class StoreState:
    def __init__(self, directory: Path, settings: StoreSettings | None = None) -> None:
        self.directory = directory
        self.settings = settings or StoreSettings()
        self.writer: JournalWriter | None = None
        self._segments: list[SegmentInfo] = []
        self._last_seq = 0
        self._where: dict[LiveKey, int] = {}  # destination/durable/dup key -> segment id
        self._read_fds: dict[int, int] = {}
        self.memory_bytes = 0  # bodies of live persistent messages held in memory
        self.paged = PagedBytes()  # ... and those kept on disk only (read back when delivered)
        self._to_page: list[tuple[int, Message]] = []  # (seq, message) to page once synced
        self._compacting: int | None = None
        self._compact_queue: list[Message | LiveKey] = []
        self._full_listeners: list[Callable[[bool], None]] = []
        self.broker: Broker | None = None
        self.epoch = 0  # the epoch of the newest record
        self.epochs: list[tuple[int, int]] = []  # (epoch, first seq written in it)
        self._was_full = False
        self._refused_by: str | None = None  # what outside the disk refuses new messages
        self.hold_compaction = 0  # a backup is reading the segment files: delete nothing
        self.mirror = False  # a backup's journal: records arrive framed from the active
        self._reading: JournalReading | None = None  # a shared-store backup's, read ahead
        self.pages = PagedEntries(self._writer_segments, self._read_fd)  # store/pages.py
        # what each sealed segment holds, for a quick start (store/summary.py)
        self.summaries = SummaryBuilder(lambda segment_id, data: None)
        self._accounted: Broker | None = None  # the broker `account` was done for
        # segment of a sliced COMMIT's first record -> seq of its last (final TX_DONE or
        # TX_DROP): the segment stays until that is on disk (core/broker/committing.py)
        self._commit_tails: dict[int, int] = {}

    # ------------------------------------------------------------ queries

    @property
    def synced_seq(self) -> int:
        return self.writer.synced_seq if self.writer else self._last_seq

    @property
    def appended_seq(self) -> int:
        return self.writer.appended_seq if self.writer else self._last_seq

    # ------------------------------------------------------------ the segment files

    def _writer_segments(self) -> dict[int, SegmentInfo]:
        assert self.writer is not None
        return self.writer.segments

    def _read_fd(self, segment_id: int) -> int:
        fd = self._read_fds.get(segment_id)
        if fd is None:
            path = self.directory / f"journal-{segment_id:08d}.seg"
            fd = self._read_fds[segment_id] = os.open(path, os.O_RDONLY)
        return fd

    def _close_read_fds(self) -> None:
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    # ------------------------------------------------------------ steps of other parts

    def persist(self, records: list[Record]) -> int:
        """Journal one command's records as one atomic group (store.py)."""
        raise NotImplementedError

    def _open(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        """Open the journal for appends (store.py)."""
        raise NotImplementedError

    def _listen(self) -> None:
        """Follow the writer's syncs and failures (store.py)."""
        raise NotImplementedError

    def _notify_full(self) -> None:
        """Tell the listeners when the store becomes full, or stops being full (store.py)."""
        raise NotImplementedError

    def _locate(self, message: Message, info: SegmentInfo, queue_keys: list[str],
                body_offset: int, seq: int, counted: bool = False) -> None:
        """The message's newest record is in `info` now, held by `queue_keys` (store.py)."""
        raise NotImplementedError

    def _release(self, message: Message, queue_key: str) -> None:
        """One durable queue let go of the message (store.py)."""
        raise NotImplementedError

    def _release_all(self, message: Message, keep_body: bool = False) -> None:
        """No durable queue holds the message any more (store.py)."""
        raise NotImplementedError

    def _forget(self, key: LiveKey) -> None:
        """The object `key` names keeps no segment any more (store.py)."""
        raise NotImplementedError

    def account(self, broker: Broker) -> None:
        """Which segment holds the newest record of what the recovered broker holds
        (recovery.py)."""
        raise NotImplementedError

    def _maybe_compact(self) -> None:
        """Drop or compact the oldest segments, if they may be (compaction.py)."""
        raise NotImplementedError

    def _drop_segment(self, segment_id: int) -> None:
        """Delete a segment that holds nothing live (compaction.py)."""
        raise NotImplementedError
