"""A queue browser: the messages a queue holds, seen without taking them (ActiveMQ's
`browser:true` SUBSCRIBE, docs/stomp.md "Browsing a queue").

A browse is a snapshot of the first `limit` messages waiting in the queue, in the order
its consumers would get them: those in memory, then, for a paging queue, those that live
only in the journal (the caller reads them back). Messages delivered and not yet
acknowledged are not waiting, so they are not shown, as a JMS QueueBrowser does not show
them. Nothing changes: no delivery count, no acknowledgement, no journal record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from pairmq.core.message import Message
from pairmq.core.paged_log import PagedLog
from pairmq.core.queue import Queue

BROWSE_HEADER: Final = "browser"  # SUBSCRIBE browser:true; the last MESSAGE has browser:end


@dataclass(frozen=True)
class Browse:
    """What a browser is shown: `messages` in memory, then the journal's entries `numbers`
    of `log` (read back by the server's store), `limit` in all at most."""

    messages: list[Message] = field(default_factory=list)
    log: PagedLog | None = None
    numbers: list[int] = field(default_factory=list)


def browse(queue: Queue | None, limit: int) -> Browse:
    """The first `limit` messages waiting in `queue` (None: it does not exist)."""
    if queue is None or limit <= 0:
        return Browse()
    messages: list[Message] = []
    for entry in queue.entries():
        if len(messages) >= limit:
            return Browse(messages)
        messages.append(entry.message)
    log = queue.address.log
    if log is None or queue not in log.cursors:
        return Browse(messages)
    return Browse(messages, log, log.next_numbers(queue, limit - len(messages)))


def is_browser(headers: dict[str, str]) -> bool:
    return headers.get(BROWSE_HEADER) == "true"
