"""What an operator does to a queue through the management API (docs/operations.md): purge
its waiting messages, or move them to another queue, as a dead-letter queue's messages are
retried. Part of the Broker (a mixin, as core/broker/paging.py is).

Both follow the rules a consumer's acknowledgement and a dead-lettering follow: every
message removed is a DEL record, every message moved an ADD record in its new queue, so the
journal, recovery and the backup see exactly what the operator did. Messages delivered and
not yet acknowledged stay where they are (RabbitMQ's purge, a JMS browser's view): they
belong to a consumer now. A paging queue's messages kept in the journal only are brought
back in windows; the caller calls again once the store read them (`Done.paged_left`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from pairmq.core import records as rec
from pairmq.core.broker.configured import ConfiguredQueues
from pairmq.core.errors import CoreError
from pairmq.core.message import Entry, Message
from pairmq.core.queue import Queue

RETRY_HEADERS: Final = ("original-destination", "dead-letter-reason")  # dropped on a retry


@dataclass(frozen=True)
class Done:
    """What one call did: messages purged or moved, and how many of the queue's messages
    still live in the journal only (brought back for the next call)."""

    count: int
    paged_left: int
    stopped: str | None = None  # why a move stopped before its limit (None: it did not)


class Operations(ConfiguredQueues):
    """The Broker's operator actions (a mixin)."""

    def purge(self, destination: str) -> Done:
        """Remove every message waiting in a queue."""
        q = self._operated(destination)
        purged = q.clear()
        for entry in purged:
            self._consumed(q, entry)
        return Done(len(purged), self._bring_back(q))

    def move(self, source: str, target: str | None, limit: int, now: int) -> Done:
        """Move up to `limit` waiting messages of `source`, from its head, to `target`'s
        queue; without a target, each to the queue it was dead-lettered from (its
        `original-destination`: a retry). A moved message starts with no deliveries."""
        q = self._operated(source)
        if target is not None:
            self._operated_target(target, source)
        moved = 0
        while moved < limit:
            entry = q.pop()
            if entry is None:
                break
            old = entry.message
            to = target or old.headers.get("original-destination")
            if not to or not to.startswith("/queue/") or to == source:
                q.push_front([entry])  # nowhere to go: it stays, first in line
                why = (f"{old.message_id} in {source} has no original-destination queue "
                       "to go back to: name a target")
                if moved == 0:
                    raise CoreError(why)
                return Done(moved, self.paged_waiting(q), why)
            self._consumed(q, entry)
            headers = {k: v for k, v in old.headers.items() if k not in RETRY_HEADERS}
            self._copy_to(self._plain_queue(to), old, headers, old.expires, now)
            moved += 1
        return Done(moved, self._bring_back(q))

    def feed(self, source: str, target: str, limit: int, now: int,
             accept: Callable[[Entry], bool], scan: int,
             mark: Mapping[str, str] | None = None) -> int:
        """Move up to `limit` waiting messages of queue `source` that `accept` takes, from
        its head, to queue `target` (made if new), journaled as a move is; the others keep
        their places. Looks at `scan` messages at most. A cluster's store-and-forward queue
        is fed so (server/cluster/feeder.py): what its bridge is given is, from then on,
        that bridge's alone, through any failover. Returns how many moved.
        `source` `durable:KEY` is a durable subscription's queue; `mark`: headers the
        copies get (a scale-down names the durable subscription a message came from)."""
        q = self.durables.get(source[8:]) if source.startswith("durable:") \
            else self.queues.get(source)
        if q is None or limit <= 0:
            return 0
        if not q.count:  # what waits in the journal only is asked for: fed next time
            self._bring_back(q)
            return 0
        to = self._plain_queue(target)
        kept: list[Entry] = []
        moved = looked = 0
        while moved < limit and looked < scan:
            entry = q.pop()
            if entry is None:
                break
            looked += 1
            if not accept(entry):
                kept.append(entry)
                continue
            self._consumed(q, entry)
            old = entry.message
            headers = dict(old.headers)
            if mark:
                headers.update(mark)
            self._copy_to(to, old, headers, old.expires, now)
            moved += 1
        if kept:
            q.push_front(kept)
        self._bring_back(q)
        return moved

    def _copy_to(self, q: Queue, old: Message, headers: dict[str, str], expires: int,
                 now: int) -> None:
        """A copy of `old` (taken from its queue) enters `q`, journaled: a move, a retry,
        a dead-lettering."""
        self._order_seq += 1
        moved = Message(old.message_id, q.name, headers, old.body, old.persistent,
                        old.priority, expires, old.size, self._order_seq)
        if moved.persistent and q.key is not None:
            if moved.body is None:  # paged out: the store copies it from where it lies
                moved.body_offset = old.body_offset
                moved.body_length = old.body_length
                moved.journal_segment = old.journal_segment
            self.records.append((rec.ADD, moved, [q.key]))
        if moved.persistent and self._pages_to_log(q.address):
            self._to_log(q.address, [q], moved)  # behind what that queue has paged
        else:
            self._enqueue(q, Entry(moved), now)

    def _operated(self, destination: str) -> Queue:
        q = self.queues.get(destination)
        if q is None or not destination.startswith("/queue/"):
            raise CoreError(f"no queue {destination}: purge and move take a /queue/ "
                            "destination the server holds")
        return q

    def _operated_target(self, target: str, source: str) -> None:
        if not target.startswith("/queue/") or target == source:
            raise CoreError(f"cannot move to {target}: the target must be another /queue/ "
                            "destination")

    def _bring_back(self, q: Queue) -> int:
        """The messages of `q` still in the journal only; their next window is asked for,
        consumers or not (core/broker/paging.py asks only for queues with consumers)."""
        left = self.paged_waiting(q)
        log = q.address.log
        if left and log is not None and log.ready(q):
            self.page_wanted[q] = None
        return left
