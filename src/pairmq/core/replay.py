"""Rebuild broker state from journal entries, in journal order, without I/O.

Entries are idempotent where compaction can repeat them: a message re-added to a
queue that already holds it keeps the higher delivery count; a removal of
something unknown (its ADD was compacted away) is ignored.

Paging (core/paged_log.py): a destination under address_full_policy page keeps in memory
what fits in its limit (`paged_beyond`); what came after goes to its paged log, by where
its entry lies and nothing else, as it would have while serving. A removal names the
message's enqueue order, which finds it in a log; one from a journal written before the
order was recorded (`legacy_miss`) cannot, and the caller replays without logs.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pairmq.core.accounts import Accounts
from pairmq.core.commit_ledger import CommitLedger
from pairmq.core.message import Entry, Message
from pairmq.core.paged_log import PagedLog

DURABLE: Final = "durable:"
STREAM: Final = "/stream/"
_NEWEST: Final = 1 << 64  # above every enqueue order


@dataclass
class Replay:
    # dup-ids kept per destination: one size for all, or CoreSettings.dup_cache_size_for
    dup_cache_size: int | Callable[[str], int] = 20000
    # queue key -> message id -> its entry (message, deliveries), in journal order
    queues: dict[str, dict[str, Entry]] = field(default_factory=dict)
    durables: dict[str, str] = field(default_factory=dict)  # key -> topic destination
    accounts: Accounts = field(default_factory=Accounts)  # users changed at run time
    destinations: dict[str, None] = field(default_factory=dict)
    # queue -> the x- arguments it was made with (core/broker/configured.py), as journaled
    queue_args: dict[str, str] = field(default_factory=dict)
    dups: dict[str, OrderedDict[str, None]] = field(default_factory=dict)
    groups: dict[str, dict[str, int]] = field(default_factory=dict)  # stream -> group -> offset
    # destination -> producer -> (epoch, highest seq taken, ms): core/producers.py
    producers: dict[str, dict[str, tuple[int, int, int]]] = field(default_factory=dict)
    # destination -> bytes it keeps in memory before what follows goes to its paged log
    # (0: no log); None: no paging (a tool, or a journal with removals by id only)
    paged_beyond: Callable[[str], int] | None = None
    logs: dict[str, PagedLog] = field(default_factory=dict)  # destination -> its log
    in_memory: dict[str, int] = field(default_factory=dict)  # destination -> bytes not paged
    _caps: dict[str, int] = field(default_factory=dict)  # paged_beyond, asked once each
    top_order: int = 0  # the newest enqueue order an ADD brought: a newer one is no copy
    legacy_miss: bool = False  # a removal by id only missed: it may have been in a log
    commits: CommitLedger = field(default_factory=CommitLedger)  # COMMITs in slices
    # stream -> [its log by offset, first offset held, bytes held, newest append time]
    streams: dict[str, list[Any]] = field(default_factory=dict)
    # stream -> offset -> (segment, offset, length, order, size, stamp): records that came
    # before the log's start (compaction copies in a journal of an earlier version)
    _early: dict[str, dict[int, tuple[int, int, int, int, int, int]]] = \
        field(default_factory=dict)
    # queue key -> the oldest enqueue order it was ever given in memory (a lower bound of
    # what it holds there now): `held_below`
    _floors: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------ streams

    def add_stream_record(self, stream: str, offset: int, stamp: int, segment: int,
                          at: int, length: int, order: int, size: int) -> None:
        """A stream's record (or a copy of one): into its log at its offset."""
        held = self.streams.get(stream)
        if held is None:
            log = PagedLog(stamped=True)
            log.start_at(offset)
            held = self.streams[stream] = [log, offset, 0, 0]
        log = held[0]
        if offset < log.located_end:
            if offset >= held[1]:
                log.move(offset, segment, at)  # a copy: the newest place wins
            elif offset >= log.start or not held[2]:
                pass  # removed by retention already
            else:
                self._early.setdefault(stream, {})[offset] = (segment, at, length, order,
                                                               size, stamp)
            return
        if offset > log.located_end:
            if held[1] < log.located_end:  # a gap in a stream that holds records
                self._early.setdefault(stream, {})[offset] = (segment, at, length, order,
                                                               size, stamp)
                return
            log.start_at(offset)  # everything before was removed
            held[1] = offset
        log.add(segment, at, length, order, size, 0, stamp)
        held[2] += size
        held[3] = max(held[3], stamp)

    def stream_run(self, stream: str, first_offset: int, stamps: array[int], segment: int,
                   offsets: array[int], lengths: array[int], orders: array[int],
                   sizes: array[int]) -> None:
        """A stream's records at consecutive offsets from `first_offset`, as a segment's
        summary lists them: appended at once in the common case (they follow what the log
        holds), else one by one as `add_stream_record` places each."""
        held = self.streams.get(stream)
        if held is not None and first_offset == held[0].located_end and len(orders):
            held[2] += held[0].extend(segment, offsets, lengths, orders, sizes, stamps)
            held[3] = max(held[3], max(stamps))
            return
        for i in range(len(orders)):
            self.add_stream_record(stream, first_offset + i, stamps[i], segment, offsets[i],
                                   lengths[i], orders[i], sizes[i])

    def _remove_stream_head(self, stream: str, order: int) -> None:
        held = self.streams.get(stream)
        if held is None:
            return
        log, first = held[0], held[1]
        if first >= log.located_end or (order >= 0 and log.order_of(first) != order):
            return
        held[2] -= log.size_of(first)
        held[1] = first + 1

    def settle_streams(self) -> None:
        """Records that came out of order (an earlier version's compaction copies) put in
        place: each stream's log rebuilt in offset order, from the newest run with no gap
        (what is older than a gap was removed by retention)."""
        for stream, early in self._early.items():
            log, first = self.streams[stream][0], self.streams[stream][1]
            found = dict(early)
            for offset in range(first, log.located_end):
                found[offset] = (*log.where(offset)[:5], log.stamp_of(offset))
            offsets = sorted(found)
            start = 0
            for i in range(1, len(offsets)):
                if offsets[i] != offsets[i - 1] + 1:
                    start = i
            rebuilt = PagedLog(stamped=True)
            kept = offsets[start:]
            if kept:
                rebuilt.start_at(kept[0])
            total = newest = 0
            for offset in kept:
                segment, at, length, order, size, stamp = found[offset]
                rebuilt.add(segment, at, length, order, size, 0, stamp)
                total += size
                newest = max(newest, stamp)
            self.streams[stream] = [rebuilt, kept[0] if kept else log.located_end, total,
                                    newest]
        self._early.clear()

    # ------------------------------------------------------------ paged logs

    def to_log(self, destination: str, queue_keys: list[str], message_id: str, size: int,
               order: int) -> bool:
        """Does this ADD go to (or move within) the destination's paged log?"""
        beyond = self.paged_beyond
        if beyond is None or queue_keys[0].startswith(STREAM):
            return False
        log = self.logs.get(destination)
        if order <= self.top_order:
            if log is not None and order <= log.last_order:
                # A compaction copy: of a paged entry (it moves), or of a message that was
                # in memory (older than every paged one, whose original record is gone).
                return log.find(order) is not None
            queues = self.queues
            if any(message_id in queues.get(key, ()) for key in queue_keys):
                return False  # a compaction copy of a message in memory
        else:
            self.top_order = order
        cap = self._cap(destination)
        if not cap:
            return False
        if self.in_memory.get(destination, 0) + size * len(queue_keys) > cap:
            return True
        return log is not None and log.busy

    def pages(self, destination: str) -> bool:
        """Does the destination keep only a head in memory, the rest in its paged log?"""
        return self.paged_beyond is not None and self._cap(destination) > 0

    def _cap(self, destination: str) -> int:
        cap = self._caps.get(destination)
        if cap is None:
            assert self.paged_beyond is not None
            cap = self._caps[destination] = self.paged_beyond(destination)
        return cap

    def paged_run(self, destination: str, queue_keys: tuple[str, ...], segment: int,
                  offsets: array[int], lengths: array[int], orders: array[int],
                  sizes: array[int]) -> bool:
        """New messages for one address, in order, as a segment's summary lists them: into
        its paged log at once when `to_log` would send each of them there (the address
        pages already: its log is busy or its memory full). False, with nothing done,
        when it would not: the caller replays their records one by one."""
        if self.paged_beyond is None or not orders or orders[0] <= self.top_order \
                or queue_keys[0].startswith(STREAM):
            return False
        cap = self._cap(destination)
        if not cap:
            return False
        log = self.logs.get(destination)
        if not (log is not None and log.busy) and \
                self.in_memory.get(destination, 0) + sizes[0] * len(queue_keys) <= cap:
            return False  # the first one stays in memory: its record is needed
        self.top_order = orders[-1]
        if log is None:
            log = self.logs[destination] = PagedLog()
        for key in queue_keys:
            if key not in log.cursors:
                log.attach(key)
        if len(log.cursors) != len(queue_keys):  # readers it was not routed to: one by one
            for i in range(len(orders)):
                self.add_to_log(destination, list(queue_keys), segment, offsets[i],
                                lengths[i], orders[i], sizes[i])
            return True
        total = log.extend(segment, offsets, lengths, orders, sizes)
        held = log.held
        for key in queue_keys:
            held[key] += total
        return True

    def add_to_log(self, destination: str, queue_keys: list[str], segment: int, offset: int,
                   length: int, order: int, size: int) -> None:
        """The ADD entry at (segment, offset, length) goes to the destination's log, for
        these queues (a copy made by compaction moves the entry instead)."""
        log = self.logs.get(destination)
        if log is None:
            log = self.logs[destination] = PagedLog()
        if order <= log.last_order:
            number = log.find(order)
            if number is not None:
                log.move(number, segment, offset)
                return
        cursors, held = log.cursors, log.held
        for key in queue_keys:
            if key not in cursors:
                log.attach(key)
        # On disk and recovered: confirmed (a consumer waits for no record, seq 0).
        number = log.add(segment, offset, length, order, size, 0)
        if len(cursors) == len(queue_keys):  # every reader got it (the common case)
            for key in queue_keys:
                held[key] += size
            return
        listed = set(queue_keys)
        for reader in cursors:
            if reader in listed:
                held[reader] += size
            else:  # a reader the message was not routed to: as if it had taken it
                log.skip.setdefault(reader, set()).add(number)

    def _log_of(self, queue_key: str) -> PagedLog | None:
        destination = self.durables.get(queue_key[len(DURABLE):]) \
            if queue_key.startswith(DURABLE) else queue_key
        return self.logs.get(destination) if destination is not None else None

    def _in_log(self, queue_key: str, order: int) -> tuple[PagedLog, int] | None:
        log = self._log_of(queue_key)
        if log is None or order < 0:
            return None
        number = log.find(order)
        cursor = log.cursors.get(queue_key)
        if number is None or cursor is None or number < cursor \
                or number in log.skip.get(queue_key, ()):
            return None
        return log, number

    def _counted(self, message: Message, sign: int) -> None:
        if self.paged_beyond is not None:
            self.in_memory[message.destination] = \
                self.in_memory.get(message.destination, 0) + sign * message.size

    def dup_limit(self, destination: str) -> int:
        size = self.dup_cache_size
        return size if isinstance(size, int) else size(destination)

    def add(self, message: Message, queue_keys: list[str], deliveries: int) -> Message:
        """Returns the message object the queues now share: an earlier copy if a queue still
        holds one (a compaction copy), else this one. A dead-lettered copy keeps its id but
        not its destination, so it never stands for the original."""
        queues = self.queues
        message_id = message.message_id
        order, floors = message.order, self._floors
        if len(queue_keys) == 1:  # the common case, kept short: a start replays millions
            key = queue_keys[0]
            held = queues.get(key)
            if held is None:
                held = queues[key] = {}
            if order < floors.get(key, _NEWEST):
                floors[key] = order
            entry = held.get(message_id)
            if entry is None:
                held[message_id] = Entry(message, deliveries)
                self._counted(message, 1)
                return message
        for queue_key in queue_keys:
            if order < floors.get(queue_key, _NEWEST):
                floors[queue_key] = order
        shared = message
        for queue_key in queue_keys:
            held = queues.get(queue_key)
            if held is not None:
                entry = held.get(message_id)
                if entry is not None and entry.message.destination == message.destination:
                    shared = entry.message
                    break
        for queue_key in queue_keys:
            held = queues.get(queue_key)
            if held is None:
                held = queues[queue_key] = {}
            entry = held.get(message_id)
            if entry is None or entry.message is not shared:
                held[message_id] = Entry(shared, deliveries)
                if entry is None:
                    self._counted(shared, 1)
            elif deliveries > entry.deliveries:
                entry.deliveries = deliveries
        return shared

    def held_below(self, queue_key: str) -> int:
        """An enqueue order below which `queue_key` holds no message, in memory or in its
        paged log: an acknowledgement or delivery of an older message changes nothing (its
        segment was let go). A start after consumers took a million messages replays two
        million such entries; `store/reading.py` passes over them without a lookup each.
        -1 for a stream (its entries name offsets, not messages held)."""
        if queue_key.startswith(STREAM):
            return -1
        below = self._floors.get(queue_key, _NEWEST)
        log = self._log_of(queue_key)
        if log is not None:
            first = log.first_order()
            if first is not None and first < below:
                below = first
        return below

    def remove(self, queue_key: str, message_id: str, order: int = -1) -> Message | None:
        if queue_key.startswith(STREAM):
            self._remove_stream_head(queue_key, order)
            return None
        held = self.queues.get(queue_key)
        found = held.pop(message_id, None) if held is not None else None
        if found is not None:
            self._counted(found.message, -1)
            return found.message
        paged = self._in_log(queue_key, order)
        if paged is not None:
            paged[0].delete(queue_key, paged[1])
        elif order < 0 and self.logs:
            self.legacy_miss = True
        return None

    def delivered(self, queue_key: str, message_id: str, count: int, order: int = -1) -> None:
        held = self.queues.get(queue_key)
        entry = held.get(message_id) if held is not None else None
        if entry is not None:
            if count > entry.deliveries:
                entry.deliveries = count
            return
        paged = self._in_log(queue_key, order)
        if paged is not None:
            log, number = paged
            log.deliveries[number] = max(count, log.deliveries.get(number, 0))

    def durable(self, key: str, topic: str) -> None:
        self.durables[key] = topic

    def undurable(self, key: str) -> None:
        log = self._log_of(f"{DURABLE}{key}")
        if log is not None:
            log.detach(f"{DURABLE}{key}")
        self.durables.pop(key, None)
        held = self.queues.pop(f"durable:{key}", None)
        for entry in (held or {}).values():
            self._counted(entry.message, -1)

    def destination(self, name: str, settings: str = "") -> None:
        self.destinations[name] = None
        if settings:
            self.queue_args[name] = settings

    def undestination(self, name: str) -> None:
        """An empty, unused destination was deleted (core/broker/idle.py)."""
        self.destinations.pop(name, None)
        self.queue_args.pop(name, None)

    def dup(self, destination: str, dup_id: str) -> None:
        cache = self.dups.get(destination)
        if cache is None:
            cache = self.dups[destination] = OrderedDict()
        cache[dup_id] = None
        if len(cache) > self.dup_limit(destination):
            cache.popitem(last=False)

    def dup_snapshot(self, destination: str, dup_ids: list[str]) -> None:
        """Compaction rewrote the whole cache: it replaces what came before, order kept."""
        self.dups[destination] = OrderedDict.fromkeys(
            dup_ids[-self.dup_limit(destination):])

    def producer(self, destination: str, producer: str, epoch: int, seq: int,
                 seen: int) -> None:
        """A producer's state: the newest record is the truth (a compaction copy is the
        state when it was copied, never older than what the journal held before it)."""
        held = self.producers.get(destination)
        if held is None:
            held = self.producers[destination] = {}
        held[producer] = (epoch, seq, seen)

    def group(self, stream: str, group: str, offset: int) -> None:
        """A consumer group's committed offset (only ever moves forward)."""
        groups = self.groups.setdefault(stream, {})
        if offset > groups.get(group, -1):
            groups[group] = offset
