"""Rebuild broker state from journal entries, in journal order, without I/O.

Entries are idempotent where compaction can repeat them: a message re-added to a
queue that already holds it keeps the higher delivery count; a removal of
something unknown (its ADD was compacted away) is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pairmq.core.message import Message


@dataclass
class Replay:
    dup_cache_size: int = 20000
    # (message id, destination) -> message; a dead-lettered copy keeps its id, not its destination
    messages: dict[tuple[str, str], Message] = field(default_factory=dict)
    # queue key -> message id -> (message, deliveries)
    queues: dict[str, dict[str, tuple[Message, int]]] = field(default_factory=dict)
    durables: dict[str, str] = field(default_factory=dict)  # key -> topic destination
    destinations: dict[str, None] = field(default_factory=dict)
    dups: dict[str, dict[str, None]] = field(default_factory=dict)

    def add(self, message: Message, queue_keys: list[str], deliveries: int) -> Message:
        """Returns the message object the queues now share (an earlier copy if any)."""
        key = (message.message_id, message.destination)
        shared = self.messages.setdefault(key, message)
        for queue_key in queue_keys:
            held = self.queues.setdefault(queue_key, {})
            previous = held.get(message.message_id)
            count = max(previous[1], deliveries) if previous else deliveries
            held[message.message_id] = (shared, count)
        return shared

    def remove(self, queue_key: str, message_id: str) -> Message | None:
        held = self.queues.get(queue_key)
        if held is None:
            return None
        found = held.pop(message_id, None)
        return found[0] if found else None

    def delivered(self, queue_key: str, message_id: str, count: int) -> None:
        held = self.queues.get(queue_key)
        if held is not None and message_id in held:
            message, previous = held[message_id]
            held[message_id] = (message, max(previous, count))

    def durable(self, key: str, topic: str) -> None:
        self.durables[key] = topic

    def undurable(self, key: str) -> None:
        self.durables.pop(key, None)
        self.queues.pop(f"durable:{key}", None)

    def destination(self, name: str) -> None:
        self.destinations[name] = None

    def dup(self, destination: str, dup_id: str) -> None:
        cache = self.dups.setdefault(destination, {})
        cache[dup_id] = None
        if len(cache) > self.dup_cache_size:
            del cache[next(iter(cache))]

    def dup_snapshot(self, destination: str, dup_ids: list[str]) -> None:
        """Compaction rewrote the whole cache: it replaces what came before, order kept."""
        self.dups[destination] = dict.fromkeys(dup_ids[-self.dup_cache_size:])
