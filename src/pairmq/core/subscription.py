"""Subscriptions and their windows of unacknowledged deliveries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from pairmq.core.errors import CoreError
from pairmq.core.message import Entry
from pairmq.core.selective import SelectorIndex

if TYPE_CHECKING:  # objects that point at each other: a Subscription holds its queue and
    # its session, a Queue its consumers (queue.py), a Session its subscriptions (session.py)
    from pairmq.core.queue import Queue
    from pairmq.core.session import Session

ACK_AUTO: Final = 0
ACK_CLIENT: Final = 1
ACK_INDIVIDUAL: Final = 2
ACK_MODES: Final = {"auto": ACK_AUTO, "client": ACK_CLIENT, "client-individual": ACK_INDIVIDUAL}


def ack_mode_of(ack: str) -> int:
    """The SUBSCRIBE's ack header as a mode, or an error naming it (queues and streams)."""
    mode = ACK_MODES.get(ack)
    if mode is None:
        raise CoreError(f"unknown ack mode {ack!r}: use auto, client or client-individual")
    return mode


# Messages one session is handed per turn of the server, at most (core/broker/broker.py
# `_turn_full`).
TURN_DELIVERIES: Final = 512


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


@dataclass(slots=True, eq=False, init=False)
class Delivery:
    """One entry handed to a recipient, for the server to write as a MESSAGE. A class with
    its `__init__` written out, not a NamedTuple: the compiled build compiles this one,
    while a NamedTuple's `__new__` runs interpreted, once per message."""

    subscription: Recipient  # who gets it: a Subscription or a StreamCursor
    entry: Entry
    ack_id: str | None  # None for ack:auto
    delivery_count: int

    def __init__(self, subscription: Recipient, entry: Entry, ack_id: str | None,
                 delivery_count: int) -> None:
        self.subscription = subscription
        self.entry = entry
        self.ack_id = ack_id
        self.delivery_count = delivery_count
