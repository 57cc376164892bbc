"""A client connection as the core sees it: its subscriptions, transactions and temp queues."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pairmq.core.errors import CoreError
from pairmq.core.message import Entry
from pairmq.protocol.stamps import Stamp

if TYPE_CHECKING:  # objects that point at each other: a Session holds its subscriptions
    # and stream cursors, each of those its session (subscription.py, stream_log.py); and
    # its temporary queues, and the (queue, entry) pairs a transaction settles at COMMIT
    from pairmq.core.queue import Queue
    from pairmq.core.stream_log import StreamCursor
    from pairmq.core.subscription import Subscription


@dataclass(slots=True)
class PendingSend:
    destination: str
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class BatchRest:
    """A batched SEND taken (admitted as a whole) and routed a slice per turn of the server
    (core/broker/intake.py `send_batch`): what is left of it."""

    destination: str
    kind: str
    name: str
    messages: list[tuple[dict[str, str], bytes]]
    journal_full: str | None
    stamp: Stamp | None  # its producer stamp: the number of messages[0] is stamp.seq
    done: int = 0  # messages routed (or found taken already)


@dataclass(slots=True)
class Transaction:
    """Work deferred to COMMIT: sends to route, and deliveries acked or nacked meanwhile."""

    sends: list[PendingSend] = field(default_factory=list)
    acked: list[tuple[Queue, Entry]] = field(default_factory=list)
    nacked: list[tuple[Queue, Entry]] = field(default_factory=list)
    rejected: list[tuple[Queue, Entry]] = field(default_factory=list)  # NACK requeue:false
    bytes: int = 0  # of its sends, counted in the server's memory until COMMIT or ABORT

    def held(self) -> int:
        """Messages it holds, sent or settled (max_transaction_messages bounds them)."""
        return len(self.sends) + len(self.acked) + len(self.nacked) + len(self.rejected)


class Session:
    __slots__ = ("ack_seq", "acks", "auto_replies", "batch", "client_id", "cursors", "id",
                 "legacy_index", "subs", "temp_queues", "token", "txs", "version", "writable")

    def __init__(self, conn_id: int, token: str, version: str, client_id: str | None) -> None:
        self.id = conn_id
        self.token = token  # unique in this server's life: names this session's temp queues
        self.version = version
        self.client_id = client_id
        self.writable = True
        self.subs: dict[str, Subscription] = {}
        self.cursors: dict[str, StreamCursor] = {}  # stream subscriptions, by id
        self.acks: dict[str, Subscription] = {}  # ack id -> subscription holding it
        # STOMP 1.0/1.1 acknowledge by message-id: (subscription id or "", message id) -> ack id
        self.legacy_index: dict[tuple[str, str], str] | None = None if version == "1.2" else {}
        self.txs: dict[str, Transaction] = {}
        self.temp_queues: dict[str, Queue] = {}
        # subscriptions a SEND's reply-to:/temp-queue/NAME made (id /temp-queue/NAME)
        self.auto_replies: dict[str, Subscription] = {}
        self.ack_seq = 0
        self.batch: BatchRest | None = None  # a batched SEND still being routed

    def check_free(self, sub_id: str, most: int = 0) -> None:
        """A SUBSCRIBE's id must not name a live subscription, to a queue or a stream, and
        the connection may hold at most `most` of them (0: no limit). Ending a session ends
        its subscriptions in one turn of the server: 240,000 took 425 ms."""
        if sub_id in self.subs or sub_id in self.cursors:
            raise CoreError(f"subscription id {sub_id!r} is already in use on this connection")
        if most and len(self.subs) + len(self.cursors) >= most:
            raise CoreError(f"too many subscriptions on this connection: "
                            f"max_subscriptions_per_connection ({most})")
