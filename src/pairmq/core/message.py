"""Messages and their per-queue delivery state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pairmq.core.paged_log import PagedLog

DEFAULT_PRIORITY = 4
PRIORITY_LEVELS = 10  # 0 to 9, as JMS


@dataclass(slots=True, eq=False)
class Message:
    """An accepted message. Immutable once routed: topic subscribers share one instance."""

    message_id: str
    destination: str
    # The sender's headers, transport headers removed, server ones added; read-only (a
    # recovered message's are decoded from the journal on first use).
    headers: Mapping[str, str]
    body: bytes | None  # None while paged out: the store reads it back from the journal
    persistent: bool = False
    priority: int = DEFAULT_PRIORITY
    expires: int = 0  # absolute ms since the epoch; 0 = never
    size: int = 0  # bytes counted against the destination's limit
    order: int = 0  # global enqueue order: recovery sorts each queue by it
    # The store's bookkeeping, not broker state: where its newest ADD record lives, which
    # durable queues the journal says hold it, and (when paged out) where its body is.
    journal_segment: int = 0
    journal_queues: list[str] | None = None
    body_offset: int = -1
    body_length: int = 0
    journal_delivered: dict[str, int] | None = None  # queue key -> deliveries journaled
    # The sequence number of its newest ADD record (0: recovered, or never journaled): a
    # consumer gets it only once that record is confirmed (server/role/role.py, delivery_gate).
    journal_seq: int = 0
    # The broker's word to the store: its destination was full (address_full_policy page),
    # so keep the body on disk only once the record is synced, whatever the paging budget.
    page_out: bool = False
    # Routed to its address's paged log (core/paged_log.py) and not located yet: the store
    # hands it to this log once its record is on disk, and the object is dropped.
    log: PagedLog | None = field(default=None, repr=False)
    # The serializer caches the encoded header block here; it is not broker state.
    wire: dict[str, bytes] | None = field(default=None, repr=False)


@dataclass(slots=True, eq=False)
class Entry:
    """One message in one queue: topic fan-out gives each subscription its own entry."""

    message: Message
    deliveries: int = 0  # how many times this entry was handed to a consumer
    # In its queue's levels and not handed out. A selective consumer takes an entry from
    # the middle of a queue by clearing it (the queue drops it when it reaches it: an
    # O(1) take, core/selective.py); indexes skip entries no longer waiting.
    waiting: bool = False
