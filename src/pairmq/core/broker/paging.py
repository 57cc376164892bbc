"""The broker's side of paging as a mode (core/paged_log.py, docs/durability.md "Paging"): which
messages go to an address's paged log, when a queue asks for its next window, and what a
window brought back. Part of the Broker (a mixin, as core/broker/intake.py is).

A persistent message whose every queue is durable goes to the log when its address is
full under address_full_policy page, and, for as long as any queue still has messages in
the log, so does every later one (each queue gets its messages in the order they came).
A queue keeps at most about PAGE_WINDOW paged-in messages in memory: when it holds fewer
than PAGE_LOW and has consumers, it asks for the next window (`take_page_wanted`); the
server has the store read it and hands it back (`paged_in`). A window also stops once its
messages reach PAGE_WINDOW_BYTES (as Artemis' max-read-page-bytes does): the store reads a
window whole, bodies included, so a window of large messages counted only in messages
would bring tens of MiB into memory at once, whatever the paging budget. Deterministic:
what the store reads comes in as an input, like `now`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

from pairmq.core.broker.idle import IdleDestinations
from pairmq.core.capacity import INDEX_BYTES
from pairmq.core.message import Entry, Message
from pairmq.core.paged_log import PagedLog
from pairmq.core.queue import Address, Queue

DURABLE: Final = "durable:"
PAGE_LOW: Final = 256  # paged-in messages under which a queue with consumers asks for more
PAGE_WINDOW: Final = 1024  # messages one window brings back, at most
PAGE_WINDOW_BYTES: Final = 4 * 1024 * 1024  # ... and their sizes, at most (past the first message)


class Paging(IdleDestinations):
    """The Broker's paging (a mixin)."""

    def _to_log(self, address: Address, targets: list[Queue], message: Message) -> None:
        """The message lives in the journal only; each durable queue reads it in turn."""
        log = address.log
        if log is None:
            log = address.log = PagedLog()
        for q in targets:
            log.attach(q)
        log.append(message)
        message.log = log
        address.size += message.size * len(targets)  # as many copies as queues, in memory
        self.stats["paged"] += 1
        for q in targets:
            if q.consumers:
                self._want_pages(q)

    @staticmethod
    def _pages_to_log(address: Address) -> bool:
        """New messages of the address go to its log: a queue still has messages there."""
        log = address.log
        return log is not None and log.busy

    def _want_pages(self, q: Queue) -> None:
        log = q.address.log
        if log is not None and q.count < PAGE_LOW and q.consumers and log.ready(q):
            self.page_wanted[q] = None

    def pages_located(self, log: PagedLog) -> None:
        """Input from the store: entries of `log` are on disk now; readers that wait for
        them ask for their window (a stream's: core/broker/streams.py)."""
        if log.stamped:
            self._stream_located(log)
            return
        for q in log.cursors:
            assert isinstance(q, Queue)
            self._want_pages(q)

    def take_page_wanted(self) -> list[tuple[Queue, PagedLog, list[int]]]:
        """(queue, its log, the numbers of the entries to read) for every queue that asked
        for a window since the last call."""
        wanted, self.page_wanted = self.page_wanted, {}
        out = []
        for q in wanted:
            log = q.address.log
            if log is None or q.deleted or q not in log.cursors:
                continue
            numbers = log.next_numbers(q, PAGE_WINDOW - q.count, PAGE_WINDOW_BYTES)
            if numbers:
                out.append((q, log, numbers))
        return out

    def paged_in(self, q: Queue, numbers: list[int], messages: list[Message],
                 now: int) -> None:
        """The store read `q`'s entries `numbers` back: they are waiting messages in memory
        now (their bytes were counted in the address when routed)."""
        log = q.address.log
        if q.deleted or log is None or q not in log.cursors:
            return
        log.advance(q, numbers[-1] + 1, sum(m.size for m in messages))
        self.moved_logs[log] = None
        capacity = self.capacity
        deliveries = log.deliveries
        for number, message in zip(numbers, messages, strict=True):
            q.push(Entry(message, deliveries.pop(number, 0)))
            capacity.memory += message.size + INDEX_BYTES
        self.stats["paged_in"] += len(messages)
        self._dispatch(q, now)

    def take_moved_logs(self) -> list[PagedLog]:
        moved, self.moved_logs = self.moved_logs, {}
        return list(moved)

    @staticmethod
    def paged_waiting(q: Queue) -> int:
        """`q`'s messages in its address's log, not paged in yet."""
        log = q.address.log
        return log.waiting(q) if log is not None else 0

    @staticmethod
    def paged_bytes(address: Address) -> int:
        """Bytes the address counts for its messages in its log (not paged in yet)."""
        log = address.log
        return sum(log.held.values()) if log is not None else 0

    def _restore_logs(self, logs: dict[str, PagedLog]) -> int:
        """A recovery's logs, their readers named by queue key: each to its address, read by
        the broker's queues. Returns the newest enqueue order in them."""
        top = 0
        for destination, log in logs.items():
            readers: dict[Hashable, Queue] = {}
            for key in log.cursors:
                assert isinstance(key, str)
                q = self.durables.get(key[len(DURABLE):]) if key.startswith(DURABLE) \
                    else self._plain_queue(key)
                if q is not None:
                    readers[key] = q
            log.rekey(readers)
            if not readers:
                continue
            address = next(iter(readers.values())).address
            assert address.name == destination
            address.log = log
            address.size += sum(log.held.values())
            top = max(top, log.last_order)
        return top

    def _leave_log(self, q: Queue) -> None:
        """A durable queue goes (deleted, unsubscribed): it reads the log no more."""
        log = q.address.log
        if log is not None and q in log.cursors:
            q.address.size -= log.detach(q)
            self.moved_logs[log] = None
