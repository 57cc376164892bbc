"""The client's value types: an operation (what it became is an `Outcome`,
client/outcomes.py), a received message, a failover event.

They hold no I/O. The blocking and asyncio clients give an operation's `wait()` its meaning
(`waiter`), and the engine completes operations by setting their outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from pairmq.client.errors import ClientError
from pairmq.client.outcomes import FINAL, Outcome
from pairmq.client.sequences import stamp_in
from pairmq.protocol.stamps import Stamp


class Op:
    """One operation waiting for the server's answer (a RECEIPT, mostly)."""

    __slots__ = ("error", "kind", "outcome", "receipt", "receipt_headers", "waiter", "written")

    def __init__(self, kind: str, receipt: str | None = None) -> None:
        self.kind = kind  # "send", "subscribe", "unsubscribe", "ack", "begin", "commit", ...
        self.receipt = receipt
        self.outcome = Outcome.PENDING
        self.written = 0  # the index of its frame on the session it was last written on
        self.error: ClientError | None = None
        # the headers of the RECEIPT that confirmed it (a stream SUBSCRIBE's carry the
        # stream's offsets); empty until then
        self.receipt_headers: dict[str, str] = {}
        # set by the client that made it: (op, timeout in s or None) -> Outcome
        self.waiter: Callable[[Op, float | None], Outcome] | None = None

    @property
    def done(self) -> bool:
        return self.outcome in FINAL

    def finish(self, outcome: Outcome, error: ClientError | None = None) -> None:
        if self.outcome not in FINAL:
            self.outcome = outcome
            self.error = error

    def wait(self, timeout: float | None = None) -> Outcome:
        """Block until the outcome is final (or `timeout` s pass); returns the outcome."""
        if self.done or self.waiter is None:
            return self.outcome
        return self.waiter(self, timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.outcome}>"


class SendResult(Op):
    """A message sent. Outside a transaction its producer `stamp` names it to the server,
    whatever happens to the connection; `dup_id` is the application's own dup-id, if it gave
    one (inside a transaction, the client gives one).

    `outcome` is CONFIRMED once the server has it for good. A batch (`send_batch`) is one
    SEND of many messages: `dup_id` is None and `dup_ids` are the dup-ids its messages
    carry, in order (the application's; inside a transaction, every message has one); its
    outcome is theirs, all together."""

    __slots__ = ("app_ids", "body", "destination", "dup_id", "dup_ids", "headers",
                 "outbox_id", "persistent", "transaction")

    def __init__(self, destination: str, body: bytes, headers: dict[str, str],
                 persistent: bool, dup_id: str | None, transaction: str | None) -> None:
        super().__init__("send")
        self.destination = destination
        self.body = body
        self.headers = headers
        self.persistent = persistent
        self.dup_id = dup_id
        self.dup_ids: tuple[str, ...] = (dup_id,) if dup_id is not None else ()
        self.transaction = transaction
        self.outbox_id: int | None = None
        self.app_ids = 0  # the application's own dup-ids in it (client/engine.py counts them)

    @property
    def stamp(self) -> Stamp | None:
        """Its producer stamp (producer, epoch, number of its first message), which names
        it to the server outside a transaction (docs/clients.md, "Exactly once")."""
        return stamp_in(self.headers)


@dataclass(slots=True)
class Message:
    """A MESSAGE received; acknowledge it with `client.ack(message)` (client-ack modes)."""

    body: bytes
    headers: dict[str, str]
    subscription: str  # the id of the subscription it came on
    generation: int = 0  # the connection it came on: a failover starts a new one

    @property
    def destination(self) -> str:
        return self.headers.get("destination", "")

    @property
    def message_id(self) -> str:
        return self.headers.get("message-id", "")

    @property
    def redelivered(self) -> bool:
        """Delivered before (to this consumer or another) and not acknowledged then."""
        return self.headers.get("redelivered") == "true"

    @property
    def dup_id(self) -> str | None:
        """The producer's dup-id: a message a cluster's bridge carried from another member
        keeps it as `pairmq_dup_id`, its `dup-id` being the bridge's (docs/cluster.md)."""
        headers = self.headers
        return headers.get("pairmq_dup_id") or headers.get("dup-id")

    @property
    def ack_id(self) -> str | None:
        return self.headers.get("ack")

    @property
    def text(self) -> str:
        return self.body.decode()


class EventKind(StrEnum):
    FAILOVER = "FAILOVER"  # the connection failed and the client is connected again
    DISCONNECT = "DISCONNECT"  # the connection failed and the client gave up


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """Told to failover listeners once per failover (and once when the client gives up)."""

    kind: EventKind
    old_server: str | None  # HOST:PORT the failed connection was to
    new_server: str | None  # HOST:PORT connected to now (None for DISCONNECT)
    reason: str  # why the old connection ended
    resumed: bool = False  # the same server still held the session: nothing was lost
    seconds: float = 0.0  # from the failure to the new connection (or to giving up)
    resent: int = 0  # persistent messages sent again (with their dup-ids)
    rolled_back: tuple[str, ...] = field(default_factory=tuple)  # transactions lost
