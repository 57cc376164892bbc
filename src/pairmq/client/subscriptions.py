"""A subscription as the client keeps it: what re-creates it on another server, the messages
received and not handed to the application yet, and those handed out and not acknowledged.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from enum import StrEnum

from pairmq.client.errors import ClientError
from pairmq.client.results import Message, Op
from pairmq.protocol import Frame

AckKey = tuple[str, str]  # (subscription id, message-id): one message, across failovers


class SubState(StrEnum):
    ACTIVE = "active"
    CLOSED = "closed"  # unsubscribed, or the client closed
    FAILED = "failed"  # the server refused it (`error`): it is not re-created


class SubscriptionState:
    __slots__ = ("ack", "buffer", "destination", "error", "headers", "id", "op", "state",
                 "unacked")

    def __init__(self, sub_id: str, destination: str, ack: str,
                 headers: dict[str, str]) -> None:
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        self.headers = headers  # the application's own (durable names, prefetch-count...)
        self.state = SubState.ACTIVE
        self.error: ClientError | None = None
        self.op: Op | None = None  # the application's SUBSCRIBE, until it is receipted
        self.buffer: deque[Message] = deque()  # received, not handed out yet
        # client-ack modes: handed out, not acknowledged; ack id -> message-id, in order
        self.unacked: OrderedDict[str, str] = OrderedDict()

    @property
    def client_ack(self) -> bool:
        return self.ack != "auto"

    def frame(self, receipt: str) -> Frame:
        """The SUBSCRIBE that creates it (again, after a failover)."""
        return Frame("SUBSCRIBE", {**self.headers, "destination": self.destination,
                                   "id": self.id, "ack": self.ack, "receipt": receipt})

    def take(self) -> Message | None:
        if not self.buffer:
            return None
        message = self.buffer.popleft()
        ack_id = message.headers.get("ack")
        if ack_id is not None and self.client_ack:
            self.unacked[ack_id] = message.headers.get("message-id", "")
        return message

    def acked(self, message: Message) -> list[AckKey]:
        """The messages an ACK of `message` acknowledges (cumulative in mode `client`)."""
        ack_id = message.headers.get("ack", "")
        if ack_id not in self.unacked:
            if self.client_ack:
                raise ClientError(f"message {message.message_id} was acknowledged already")
            return []
        if self.ack == "client":
            keys = []
            while self.unacked:
                key, message_id = self.unacked.popitem(last=False)
                keys.append((self.id, message_id))
                if key == ack_id:
                    break
            return keys
        return [(self.id, self.unacked.pop(ack_id))]

    def forget_delivered(self) -> int:
        """A new session after a failover: what was delivered on the old one is back in the
        server's queue (client-ack modes). Returns how many buffered messages were dropped."""
        self.unacked.clear()
        if not self.client_ack:
            return 0
        dropped = len(self.buffer)
        self.buffer.clear()
        return dropped


class SubOp(Op):
    """A SUBSCRIBE or UNSUBSCRIBE waiting for its receipt (or a re-created subscription's)."""

    __slots__ = ("sub_id",)

    def __init__(self, kind: str, receipt: str | None, sub_id: str) -> None:
        super().__init__(kind, receipt)
        self.sub_id = sub_id


class AckOp(Op):
    """An ACK or NACK: the messages it acknowledges, in doubt if its session fails before
    the server confirmed it (an ACK is confirmed by any later receipt of its session)."""

    __slots__ = ("keys",)

    def __init__(self, kind: str, keys: list[AckKey]) -> None:
        super().__init__(kind)
        self.keys = keys
