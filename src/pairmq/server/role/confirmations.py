"""What a RECEIPT (or a persistent MESSAGE, or anything else held for the journal) waits
for, and who waits: a `Ticket` holds the sequence number of the journal record that must
be confirmed (on disk and, in a pair, on the backup) before it may go out; `Waiting` holds
the callbacks of tickets not confirmed yet, in the order they were handed out, so that
one confirmed sequence releases them front to back."""

from __future__ import annotations

import collections
from collections.abc import Callable


class Ticket:
    """The journal sequence number a RECEIPT waits for (None until the record is appended)."""

    __slots__ = ("seq",)

    def __init__(self, seq: int | None = None) -> None:
        self.seq = seq


class Waiting:
    """Callbacks waiting for their tickets to be confirmed, oldest first. Tickets are
    handed out in journal order, so the first one not yet confirmed holds the rest back."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[Ticket, Callable[[], None]]] = collections.deque()

    def add(self, ticket: Ticket, callback: Callable[[], None]) -> None:
        self._queue.append((ticket, callback))

    def release(self, confirmed: int) -> None:
        """Call back, in order, every ticket up to `confirmed`."""
        queue = self._queue
        while queue:
            ticket, callback = queue[0]
            if ticket.seq is None or ticket.seq > confirmed:
                break
            queue.popleft()
            callback()

    def clear(self) -> None:
        self._queue.clear()
