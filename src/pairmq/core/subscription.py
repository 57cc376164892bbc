"""Subscriptions and their windows of unacknowledged deliveries."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from pairmq.core.errors import CoreError
from pairmq.core.message import Entry
from pairmq.core.selective import SelectorIndex

if TYPE_CHECKING:  # objects that point at each other: a Subscription holds its queue and
    # its session, a Queue its consumers (queue.py), a Session its subscriptions (session.py)
    from pairmq.core.queue import Queue
    from pairmq.core.session import Session

ACK_AUTO = 0
ACK_CLIENT = 1
ACK_INDIVIDUAL = 2
ACK_MODES = {"auto": ACK_AUTO, "client": ACK_CLIENT, "client-individual": ACK_INDIVIDUAL}


def ack_mode_of(ack: str) -> int:
    """The SUBSCRIBE's ack header as a mode, or an error naming it (queues and streams)."""
    mode = ACK_MODES.get(ack)
    if mode is None:
        raise CoreError(f"unknown ack mode {ack!r}: use auto, client or client-individual")
    return mode


# Messages one session is handed per turn of the server, at most (core/broker/broker.py
# `_turn_full`).
TURN_DELIVERIES = 512


class Subscription:
    __slots__ = ("ack_mode", "destination", "durable", "id", "index", "prefetch", "queue",
                 "session", "turn_cap", "unacked")

    def __init__(self, session: Session, sub_id: str, destination: str, queue: Queue,
                 ack_mode: int, prefetch: int, durable: bool,
                 index: SelectorIndex | None = None) -> None:
        self.session = session
        self.id = sub_id
        self.destination = destination
        self.queue = queue
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.turn_cap = min(prefetch, TURN_DELIVERIES)  # deliveries it takes per turn
        self.durable = durable
        # a consumer of a shared queue with a selector: what it may take (core/selective.py)
        self.index = index
        # ack id -> entry, in delivery order (client mode acks cumulatively along it)
        self.unacked: dict[str, Entry] = {}

    def can_take(self) -> bool:
        """Room for one more delivery (Broker._dispatch tests the same, written out)."""
        if not self.session.writable:
            return False
        return self.ack_mode == ACK_AUTO or len(self.unacked) < self.prefetch


class Recipient(Protocol):
    """Who a Delivery goes to: a Subscription, or a stream's StreamCursor
    (core/stream_log.py); the delivery needs only its id, which names it on the wire."""

    @property
    def id(self) -> str: ...


class Delivery(NamedTuple):
    subscription: Recipient  # who gets it: a Subscription or a StreamCursor
    entry: Entry
    ack_id: str | None  # None for ack:auto
    delivery_count: int
