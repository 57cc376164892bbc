"""Messages and their per-queue delivery state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pairmq.core.paged_log import PagedLog

DEFAULT_PRIORITY: Final = 4
PRIORITY_LEVELS: Final = 10  # 0 to 9, as JMS


@dataclass(slots=True, eq=False, init=False)
class Message:
    """An accepted message. Immutable once routed: topic subscribers share one instance.

    Its `__init__` (and Entry's) is written out: the compiled build compiles it, while the
    one dataclass would generate runs interpreted, four times slower, once per message.
    """

    message_id: str
    destination: str
    # The sender's headers, transport headers removed, server ones added; read-only (a
    # recovered message's are decoded from the journal on first use).
    headers: Mapping[str, str]
    body: bytes | None  # None while paged out: the store reads it back from the journal
    persistent: bool
    priority: int
    expires: int  # absolute ms since the epoch; 0 = never
    size: int  # bytes counted against the destination's limit
    order: int  # global enqueue order: recovery sorts each queue by it
    # The store's bookkeeping, not broker state: where its newest ADD record lives, which
    # durable queues the journal says hold it, and (when paged out) where its body is.
    journal_segment: int
    journal_queues: list[str] | None
    body_offset: int
    body_length: int
    journal_delivered: dict[str, int] | None  # queue key -> deliveries journaled
    # The sequence number of its newest ADD record (0: recovered, or never journaled): a
    # consumer gets it only once that record is confirmed (server/role/role.py, delivery_gate).
    journal_seq: int
    # The broker's word to the store: its destination was full (address_full_policy page),
    # so keep the body on disk only once the record is synced, whatever the paging budget.
    page_out: bool
    # Routed to its address's paged log (core/paged_log.py) and not located yet: the store
    # hands it to this log once its record is on disk, and the object is dropped.
    log: PagedLog | None = field(repr=False)
    # The serializer caches the encoded header block here, for one STOMP version (two
    # slots, not a dict per message: subscribers of one message seldom mix versions); it
    # is not broker state.
    wire: bytes | None = field(repr=False)
    wire_version: str = field(repr=False)

    def __init__(self, message_id: str, destination: str, headers: Mapping[str, str],
                 body: bytes | None, persistent: bool = False,
                 priority: int = DEFAULT_PRIORITY, expires: int = 0, size: int = 0,
                 order: int = 0, journal_segment: int = 0,
                 journal_queues: list[str] | None = None, body_offset: int = -1,
                 body_length: int = 0, journal_delivered: dict[str, int] | None = None,
                 journal_seq: int = 0, page_out: bool = False, log: PagedLog | None = None,
                 wire: bytes | None = None, wire_version: str = "") -> None:
        self.message_id = message_id
        self.destination = destination
        self.headers = headers
        self.body = body
        self.persistent = persistent
        self.priority = priority
        self.expires = expires
        self.size = size
        self.order = order
        self.journal_segment = journal_segment
        self.journal_queues = journal_queues
        self.body_offset = body_offset
        self.body_length = body_length
        self.journal_delivered = journal_delivered
        self.journal_seq = journal_seq
        self.page_out = page_out
        self.log = log
        self.wire = wire
        self.wire_version = wire_version


@dataclass(slots=True, eq=False, init=False)
class Entry:
    """One message in one queue: topic fan-out gives each subscription its own entry."""

    message: Message
    deliveries: int  # how many times this entry was handed to a consumer
    # In its queue's levels and not handed out. A selective consumer takes an entry from
    # the middle of a queue by clearing it (the queue drops it when it reaches it: an
    # O(1) take, core/selective.py); indexes skip entries no longer waiting.
    waiting: bool

    def __init__(self, message: Message, deliveries: int = 0, waiting: bool = False) -> None:
        self.message = message
        self.deliveries = deliveries
        self.waiting = waiting
