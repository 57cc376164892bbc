"""Queues with ten priority levels, and the addresses whose size limits drive flow control."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from pairmq.core.message import PRIORITY_LEVELS, Entry, Message
from pairmq.core.paged_log import PagedLog
from pairmq.core.producers import Producers
from pairmq.core.selective import SelectorIndex
from pairmq.core.selector import Selector
from pairmq.core.settings import AddressFullPolicy

if TYPE_CHECKING:  # objects that point at each other: a Queue holds its consumers, each
    # Subscription its queue (subscription.py)
    from pairmq.core.subscription import Subscription


# In place of the message of an entry a selective consumer took (`Queue.take`): the level
# and the selectors' indexes keep the entry until they reach it, not its body.
TAKEN: Final = Message("", "", {}, b"", False, 0, 0, 0, 0)


class AddressState(StrEnum):
    OPEN = "open"  # below its limit: messages are taken as they come
    FULL = "full"  # past its limit, until back under resume_ratio of it: its policy applies


class Address:
    """A destination name and the bytes held for it by all its queues (until acknowledged)."""

    __slots__ = ("dequeued", "dropped", "dup_limit", "dups", "enqueued", "kind", "limit", "log",
                 "name", "period_dropped", "policy", "producers", "queues", "size", "state")

    def __init__(self, name: str, kind: str, limit: int,
                 policy: AddressFullPolicy = AddressFullPolicy.PAGE,
                 dup_limit: int = 20000) -> None:
        self.name = name  # e.g. "/queue/orders"
        self.kind = kind  # "queue" | "topic" | "temp"
        self.limit = limit  # 0 = unlimited
        self.policy = policy  # what a SEND meets while the address is FULL
        self.size = 0
        self.state = AddressState.OPEN
        self.dropped = 0  # messages discarded by the drop policy, ever
        # since this server started (the operator's rates and /metrics' _total counters):
        self.enqueued = 0  # messages taken
        self.dequeued = 0  # entries that left its queues: acknowledged, expired, purged...
        self.period_dropped = 0  # ... since it last became FULL (for the resume log line)
        self.queues: list[Queue] = []  # a queue's address has one; a topic's, one per subscription
        # accepted dup-ids, oldest first: an OrderedDict, whose oldest key is found at once
        # (a dict's is found by scanning past every key deleted before it: about 9 µs a
        # message with the default cache of 20,000, docs/benchmarks.md)
        self.dups: OrderedDict[str, None] = OrderedDict()
        self.dup_limit = dup_limit  # dup-ids remembered (dup_cache_size)
        # producer sequences (core/producers.py); None until a producer stamps a message
        self.producers: Producers | None = None
        # messages kept only in the journal while the address pages (core/paged_log.py)
        self.log: PagedLog | None = None

    @property
    def full(self) -> bool:
        return self.state is AddressState.FULL


class Queue:
    """Messages waiting for a consumer, highest priority first, FIFO within a priority."""

    __slots__ = (
        "_levels",
        "_top",
        "accepts",
        "address",
        "consumers",
        "count",
        "dead_letter_name",
        "deleted",
        "durable_key",
        "expiring",
        "is_dead_letter",
        "key",
        "name",
        "owner",
        "rr",
        "selective",
        "taken",
    )

    def __init__(self, name: str, address: Address, dead_letter_name: str) -> None:
        self.name = name
        self.address = address
        self.dead_letter_name = dead_letter_name  # base NAME of /queue/DLQ.NAME
        self.is_dead_letter = False
        self.deleted = False  # set when a subscription queue or temp queue goes away
        # a deque per priority level, made when a message of that priority first comes: an
        # empty deque takes about 700 bytes, and most queues see one priority (issue 20:
        # 9 KB per empty queue, 7 of them these)
        self._levels: list[deque[Entry] | None] = [None] * PRIORITY_LEVELS
        self._top = -1  # highest level that may be non-empty
        self.count = 0
        self.expiring = 0  # entries with an expiry, so sweeps skip queues without any
        self.consumers: list[Subscription] = []
        self.rr = 0  # round-robin cursor over consumers
        self.durable_key: str | None = None
        self.owner: int | None = None  # connection id owning a temp queue
        self.key: str | None = None  # journal name when durable ("/queue/x", "durable:k")
        # a topic subscription's queue: the selector of what it keeps (None: everything)
        self.accepts: Selector | None = None
        # the indexes of its consumers with a selector, fed with every entry that comes
        # (core/selective.py); and how many entries they took out of the middle, still in
        # the levels until `pop` or a compaction reaches them
        self.selective: list[SelectorIndex] = []
        self.taken = 0

    def _level(self, p: int) -> deque[Entry]:
        level = self._levels[p]
        if level is None:
            level = self._levels[p] = deque()
        return level

    def push(self, entry: Entry) -> None:
        p = entry.message.priority
        level = self._levels[p]
        if level is None:
            level = self._levels[p] = deque()
        level.append(entry)
        entry.waiting = True
        if p > self._top:
            self._top = p
        self.count += 1
        if entry.message.expires:
            self.expiring += 1
        if self.selective:
            for index in self.selective:
                index.offer(entry)
                index.compact(self.count)

    def extend(self, entries: list[Entry]) -> int:
        """push() for many entries at once (recovery); returns the bytes they hold."""
        levels = self._levels
        top = self._top
        expiring = size = 0
        for entry in entries:
            message = entry.message
            p = message.priority
            level = levels[p]
            if level is None:
                level = levels[p] = deque()
            level.append(entry)
            entry.waiting = True
            if p > top:
                top = p
            if message.expires:
                expiring += 1
            size += message.size
        self._top = top
        self.count += len(entries)
        self.expiring += expiring
        assert not self.selective, "extend is recovery's: no consumer has an index yet"
        return size

    def push_in_order(self, entry: Entry) -> bool:
        """push(); False when an entry of the same priority enqueued later is already there
        (a backup applying compaction copies): `sort` puts the queue back in order."""
        level = self._levels[entry.message.priority]
        in_order = not level or level[-1].message.order <= entry.message.order
        self.push(entry)
        return in_order

    def sort(self) -> None:
        """Each priority level in enqueue order (as recovery builds a queue)."""
        for i, level in enumerate(self._levels):
            if level is not None and len(level) > 1:
                self._levels[i] = deque(sorted(level, key=lambda e: e.message.order))

    def remove(self, entry: Entry) -> bool:
        """Take out one waiting entry (found by identity, from the head: what is acked is
        usually near it); False when it is not waiting here."""
        level = self._levels[entry.message.priority]
        if level is None or not entry.waiting:
            return False
        try:
            level.remove(entry)
        except ValueError:
            return False
        entry.waiting = False
        self.count -= 1
        if entry.message.expires:
            self.expiring -= 1
        return True

    def push_front(self, entries: list[Entry]) -> None:
        """Return entries to the head, keeping their relative order."""
        for entry in reversed(entries):
            p = entry.message.priority
            self._level(p).appendleft(entry)
            entry.waiting = True
            if p > self._top:
                self._top = p
            self.count += 1
            if entry.message.expires:
                self.expiring += 1
        for index in self.selective:
            index.offer_front(entries)

    def pop(self) -> Entry | None:
        """The first waiting entry, highest priority first (what selective consumers took
        from the middle is dropped on the way)."""
        levels = self._levels
        top = self._top
        while top >= 0:
            level = levels[top]
            while level:
                entry = level.popleft()
                if not entry.waiting:
                    self.taken -= 1
                    continue
                entry.waiting = False
                self._top = top
                self.count -= 1
                if entry.message.expires:
                    self.expiring -= 1
                return entry
            top -= 1
        self._top = -1
        return None

    def take(self, entry: Entry) -> Entry:
        """A selective consumer takes a waiting entry wherever it is: it stays in its level,
        cleared, until `pop` or a compaction drops it; the consumer gets a new entry for the
        message (so that, returned, it is never in a level twice)."""
        message = entry.message
        entry.waiting = False
        entry.message = TAKEN  # what is left in the level holds no body (nor do indexes)
        self.count -= 1
        if message.expires:
            self.expiring -= 1
        self.taken += 1
        if self.taken > 1024 and self.taken > self.count:
            self._drop_taken()
        return Entry(message, entry.deliveries)

    def _drop_taken(self) -> None:
        """Drop the entries selective consumers took from the levels: amortised O(1)."""
        for i, level in enumerate(self._levels):
            if level:
                self._levels[i] = deque(e for e in level if e.waiting)
        self.taken = 0

    def entries(self) -> Iterator[Entry]:
        for level in reversed(self._levels):
            if level:
                for entry in level:
                    if entry.waiting:
                        yield entry

    def remove_where(self, predicate: Callable[[Entry], bool]) -> list[Entry]:
        """Take out every waiting entry for which predicate(entry) holds (and drop what
        selective consumers took)."""
        removed: list[Entry] = []
        for i, level in enumerate(self._levels):
            if not level:
                continue
            keep: deque[Entry] = deque()
            for entry in level:
                if entry.waiting:
                    (removed if predicate(entry) else keep).append(entry)
            self._levels[i] = keep
        for entry in removed:
            entry.waiting = False
        self.taken = 0
        self.count -= len(removed)
        self.expiring -= sum(1 for e in removed if e.message.expires)
        return removed

    def clear(self) -> list[Entry]:
        return self.remove_where(lambda _e: True)
