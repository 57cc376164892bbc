"""The broker's side of paging as a mode (core/paged.py, docs/durability.md "Paging"): which
messages go to an address's paged log, when a queue asks for its next window, and what a
window brought back. Part of the Broker (a mixin, as core/intake.py is).

A persistent message whose every queue is durable goes to the log when its address is
full under address_full_policy page, and, for as long as any queue still has messages in
the log, so does every later one (each queue gets its messages in the order they came).
A queue keeps at most about PAGE_WINDOW paged-in messages in memory: when it holds fewer
than PAGE_LOW and has consumers, it asks for the next window (`take_page_wanted`); the
server has the store read it and hands it back (`paged_in`). Deterministic: what the
store reads comes in as an input, like `now`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pairmq.core.capacity import INDEX_BYTES, Capacity
from pairmq.core.message import Entry, Message
from pairmq.core.paged import PagedLog
from pairmq.core.queue import Address, Queue

PAGE_LOW = 256  # paged-in messages under which a queue with consumers asks for more
PAGE_WINDOW = 1024  # messages one window brings back, at most


class Paging:
    """The Broker's paging (a mixin: the Broker provides the state and helpers)."""

    capacity: Capacity
    stats: dict[str, int]
    page_wanted: dict[Queue, None]  # queues asking for their next window, in order
    moved_logs: dict[PagedLog, None]  # logs whose readers moved: the store may release

    if TYPE_CHECKING:  # provided by the Broker
        def _dispatch(self, q: Queue, now: int) -> None: ...
        def _check_full(self, address: Address) -> None: ...

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
        them ask for their window."""
        for q in log.cursors:
            assert isinstance(q, Queue)
            self._want_pages(q)

    def take_page_wanted(self) -> list[tuple[Queue, PagedLog, int, int]]:
        """(queue, its log, its cursor, how many entries to read) for every queue that asked
        for a window since the last call."""
        wanted, self.page_wanted = self.page_wanted, {}
        out = []
        for q in wanted:
            log = q.address.log
            if log is None or q.deleted:
                continue
            count = min(PAGE_WINDOW - q.count, log.ready(q))
            if count > 0:
                out.append((q, log, log.cursors[q], count))
        return out

    def paged_in(self, q: Queue, messages: list[Message], now: int) -> None:
        """The store read `q`'s next entries back: they are waiting messages in memory now
        (their bytes were counted in the address when routed)."""
        log = q.address.log
        if q.deleted or log is None:
            return
        log.advance(q, len(messages), sum(m.size for m in messages))
        self.moved_logs[log] = None
        capacity = self.capacity
        for message in messages:
            q.push(Entry(message))
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

    def _leave_log(self, q: Queue) -> None:
        """A durable queue goes (deleted, unsubscribed): it reads the log no more."""
        log = q.address.log
        if log is not None and q in log.cursors:
            q.address.size -= log.detach(q)
            self.moved_logs[log] = None
