"""Rebuild broker state from journal entries, in journal order, without I/O.

Entries are idempotent where compaction can repeat them: a message re-added to a
queue that already holds it keeps the higher delivery count; a removal of
something unknown (its ADD was compacted away) is ignored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from pairmq.core.message import Entry, Message


@dataclass
class Replay:
    # dup-ids kept per destination: one size for all, or CoreSettings.dup_cache_size_for
    dup_cache_size: int | Callable[[str], int] = 20000
    # queue key -> message id -> its entry (message, deliveries), in journal order
    queues: dict[str, dict[str, Entry]] = field(default_factory=dict)
    durables: dict[str, str] = field(default_factory=dict)  # key -> topic destination
    destinations: dict[str, None] = field(default_factory=dict)
    dups: dict[str, OrderedDict[str, None]] = field(default_factory=dict)
    groups: dict[str, dict[str, int]] = field(default_factory=dict)  # stream -> group -> offset
    # destination -> producer -> (epoch, highest seq taken, ms): core/producers.py
    producers: dict[str, dict[str, tuple[int, int, int]]] = field(default_factory=dict)

    def dup_limit(self, destination: str) -> int:
        size = self.dup_cache_size
        return size if isinstance(size, int) else size(destination)

    def add(self, message: Message, queue_keys: list[str], deliveries: int) -> Message:
        """Returns the message object the queues now share: an earlier copy if a queue still
        holds one (a compaction copy), else this one. A dead-lettered copy keeps its id but
        not its destination, so it never stands for the original."""
        queues = self.queues
        message_id = message.message_id
        if len(queue_keys) == 1:  # the common case, kept short: a start replays millions
            held = queues.get(queue_keys[0])
            if held is None:
                held = queues[queue_keys[0]] = {}
            entry = held.get(message_id)
            if entry is None:
                held[message_id] = Entry(message, deliveries)
                return message
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
            elif deliveries > entry.deliveries:
                entry.deliveries = deliveries
        return shared

    def remove(self, queue_key: str, message_id: str) -> Message | None:
        held = self.queues.get(queue_key)
        if held is None:
            return None
        found = held.pop(message_id, None)
        return found.message if found else None

    def delivered(self, queue_key: str, message_id: str, count: int) -> None:
        held = self.queues.get(queue_key)
        entry = held.get(message_id) if held is not None else None
        if entry is not None and count > entry.deliveries:
            entry.deliveries = count

    def durable(self, key: str, topic: str) -> None:
        self.durables[key] = topic

    def undurable(self, key: str) -> None:
        self.durables.pop(key, None)
        self.queues.pop(f"durable:{key}", None)

    def destination(self, name: str) -> None:
        self.destinations[name] = None

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
