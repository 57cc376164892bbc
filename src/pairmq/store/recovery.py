"""Recovery: the store's part that reads the journal back into a `Replay` (store/reading.py)
before serving, reads ahead for a shared-store backup, and accounts what the recovered
broker holds to the segments that keep it (one part of the Store, store/store_state.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pairmq.core import Broker
from pairmq.core.queue import Queue
from pairmq.core.replay import Replay
from pairmq.store.compaction import Compacting
from pairmq.store.paging import load_bodies
from pairmq.store.reading import JournalReading
from pairmq.store.store_state import KEY_OVERHEAD
from pairmq.store.writer import LiveKey

log = logging.getLogger("pairmq.store")


@dataclass
class RecoveryReport:
    segments: int = 0
    records: int = 0
    messages: int = 0
    queues: int = 0  # holding messages
    destinations: int = 0  # every one recovered, empty ones included
    durables: int = 0
    torn_bytes: int = 0
    read_ahead: int = 0  # records read before the final pass (a shared-store backup's)
    seconds: float = 0.0
    paged: bool = False  # the paging budget was spent: some bodies stay on disk
    in_memory: int = 0  # messages whose bodies were loaded
    in_logs: int = 0  # messages kept only in the journal (paged logs, store/pages.py)
    summarised: int = 0  # segments read through their summaries (store/summary.py)
    summarised_bytes: int = 0  # the bytes those covered (all of a sealed segment's)
    journal_bytes: int = 0  # every segment's, once read

    def describe(self) -> str:
        return (f"Recovered {self.messages} messages in {self.queues} queues"
                + (f" ({self.destinations} destinations in all, the others empty)"
                   if self.destinations > self.queues else "")
                + f" and {self.durables} durable subscriptions from {self.records} records in "
                f"{self.segments} segments in {self.seconds:.2f} s"
                + (f" ({self.summarised} of the segments through their summaries)"
                   if self.summarised else "")
                + (f" ({self.read_ahead} of the records read ahead, before)"
                   if self.read_ahead else "")
                + (f" (paging: {self.in_memory} bodies in memory, the others read from disk "
                   "when delivered"
                   + (f"; {self.in_logs} messages only in the journal, in paged logs"
                      if self.in_logs else "") + ")"
                   if self.paged or self.in_logs else "")
                + (f" ({self.summarised_bytes} of the {self.journal_bytes} journal bytes "
                   "read through summaries)" if self.summarised else ""))


class Recovering(Compacting):
    """Reading the journal back, and accounting what it holds."""

    def recover(self, dup_cache_size: int | Callable[[str], int] = 20000,
                rebuild: bool = True) -> tuple[Replay, RecoveryReport]:
        """Read every segment back, cut a torn tail, refuse corruption. Before serving.

        With rebuild=False the records are only checked, not decoded (a fifth of the
        time): for tools that need where the journal ends, not the broker state. After
        `read_ahead`, only what was appended since is read."""
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        reading, self._reading = self._reading, None
        beyond = self.settings.paged_beyond if rebuild else None
        if reading is None or not rebuild or not reading.advance(final=True):
            reading = JournalReading(self.directory, dup_cache_size, rebuild,
                                     paged_beyond=beyond)
            reading.advance(final=True)
        if reading.replay.legacy_miss:
            log.warning("The journal names some removed messages by id only (it was written "
                        "by an earlier version): recovering every message into memory, "
                        "without paged logs")
            reading = JournalReading(self.directory, dup_cache_size, rebuild)
            reading.advance(final=True)
        reading.replay.settle_streams()
        self.epoch, self.epochs, self._where = reading.epoch, reading.epochs, reading.where
        self._segments = reading.segment_infos()
        self._last_seq = reading.last_seq
        replay = reading.replay
        report = RecoveryReport(segments=len(self._segments), records=reading.records,
                                read_ahead=reading.read_ahead,
                                torn_bytes=reading.torn_bytes,
                                summarised=reading.summarised,
                                summarised_bytes=reading.summarised_bytes,
                                journal_bytes=sum(s.valid_end
                                                  for s in reading.segments.values()))
        report.durables = len(replay.durables)
        report.destinations = len(replay.destinations)
        report.queues = len(set(replay.queues).union(
            *(log.cursors for log in replay.logs.values())))
        report.in_logs = sum(log.waiting(key) for log in replay.logs.values()
                             for key in log.cursors)
        report.in_logs += sum(log.located_end - first  # a stream's records: all on disk
                              for log, first, *_ in replay.streams.values())
        report.messages = sum(len(held) for held in replay.queues.values()) + report.in_logs
        if rebuild:
            self.memory_bytes = load_bodies(self.directory, replay, report,
                                            self.settings.paging_bytes, self.memory_bytes,
                                            self.settings.paged_beyond)
        report.seconds = time.monotonic() - started
        return replay, report

    @property
    def read_ahead_seq(self) -> int:
        """The last record read ahead (0: none)."""
        return self._reading.last_seq if self._reading is not None else 0

    def read_ahead(self, dup_cache_size: int | Callable[[str], int] = 20000,
                   limit_bytes: int = 0) -> int:
        """Shared store, before holding the lock: read what the active server appended
        since the last call, about `limit_bytes` of it (0 = all; store/reading.py says why
        nothing is missed), so that `recover` reads only the rest. Never changes a file.
        Returns the bytes read by this call. One thread at a time, never during
        `recover`."""
        reading = self._reading
        if reading is None or not reading.advance(final=False, limit_bytes=limit_bytes):
            reading = self._reading = JournalReading(
                self.directory, dup_cache_size, ahead=True,
                paged_beyond=self.settings.paged_beyond)
            reading.advance(final=False, limit_bytes=limit_bytes)
        return reading.bytes_read

    def account(self, broker: Broker) -> None:
        """Which segment holds the newest record of what the recovered broker holds, and
        which bodies recovery left on disk. Before the journal opens, it may run in a
        thread with the recovery (ten million paged messages take a second here)."""
        self.broker = broker
        segments = self.writer.segments if self.writer is not None \
            else {info.segment_id: info for info in self._segments}
        for q in _durable_queues(broker):
            for entry in q.entries():
                message = entry.message
                if message.journal_queues is None:
                    message.journal_queues = []
                    info = segments.get(message.journal_segment)
                    if info is not None:
                        info.live.add(message)
                        info.live_bytes += message.size
                    if message.body is None:
                        self.paged.count(message, 1)
                assert q.key is not None
                message.journal_queues.append(q.key)
        broker.set_paged_bytes(self.paged.total)
        for address in broker.addresses.values():
            if address.log is not None:
                self.pages.hold_recovered(address.log, segments)
        for stream in broker.streams.values():  # every record a stream holds
            self.pages.hold_recovered(stream.log, segments)
        for key, segment_id in self._where.items():
            info = segments.get(segment_id)
            if info is not None and self._still_live(key):
                info.live.add(key)
                info.live_bytes += KEY_OVERHEAD
        self._where.clear()
        self._accounted = broker

    def _still_live(self, key: LiveKey) -> bool:
        broker = self.broker
        assert broker is not None
        if key[0] == "dest":
            return key[1] in broker.queues or key[1] in broker.streams
        if key[0] == "group":
            return broker.group_offset(key[1], key[2]) is not None
        if key[0] == "durable":
            return key[1] in broker.durables
        if key[0] == "epoch":
            return True
        address = broker.addresses.get(key[1])
        if key[0] == "producer":
            return address is not None and address.producers is not None \
                and key[2] in address.producers
        return address is not None and key[2] in address.dups


def _durable_queues(broker: Broker) -> Iterator[Queue]:
    for q in broker.queues.values():
        yield q
    for q in broker.durables.values():
        yield q
