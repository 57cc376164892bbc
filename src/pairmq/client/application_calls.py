"""What the application asks of the engine: send, subscribe, unsubscribe, take a message,
acknowledge, close (one part of the Engine, client/engine_state.py; a transaction's
BEGIN/COMMIT/ABORT are client/transacting.py's).

Every persistent SEND outside a transaction carries a producer stamp (client/sequences.py)
and a receipt, and stays in `unconfirmed` until its RECEIPT, whatever happens to the
connection; inside a transaction it carries a `dup-id`.
"""

from __future__ import annotations

from collections.abc import Callable

from pairmq.client.engine_state import EngineState
from pairmq.client.errors import AckFailed, ClientClosed, ClientError
from pairmq.client.link import Link
from pairmq.client.outcomes import Outcome
from pairmq.client.results import Message, Op, SendResult
from pairmq.client.sequences import message_count
from pairmq.client.subscriptions import AckKey, AckOp, SubOp, SubscriptionState, SubState
from pairmq.client.transactions import Transaction, TxState
from pairmq.protocol import Frame
from pairmq.protocol.batch import SEND_BATCH_HEADER


class ApplicationCalls(EngineState):
    """The application's calls (the drivers make them under their lock)."""

    def new_dup_id(self) -> str:
        self._seq += 1
        return f"{self.name}-{self._seq}"

    def auto_dup_ids(self) -> Callable[[], str] | None:
        """Where a batch's messages get dup-ids the application did not give: inside a
        transaction only (outside one, the frame's producer stamp names them)."""
        return self.new_dup_id if self.tx is not None else None

    def stamp(self, destination: str, headers: dict[str, str]) -> None:
        """Give a persistent message sent outside a transaction (or a batch: as many
        numbers as it has messages) this client's next producer numbers, unless it has a
        stamp already."""
        self.sequences.stamp(headers, destination, message_count(headers))

    def send(self, destination: str, body: bytes, headers: dict[str, str] | None,
             persistent: bool, now: float, outbox_id: int | None = None,
             app_dup_ids: int | None = None) -> SendResult:
        """A SEND: persistent ones get, outside a transaction, a producer stamp and a
        receipt, and stay in `unconfirmed` until it comes; inside one, a dup-id (unless the
        application gave one, or it is a batch, client/batching.py). `app_dup_ids`: how
        many of the application's own dup-ids a batch carries."""
        hdrs = {**headers, "destination": destination} if headers else \
            {"destination": destination}
        dup_id = hdrs.get("dup-id")  # the application's, if any
        tx = self.tx
        app_ids = 0
        if persistent:
            hdrs["persistent"] = "true"
            if tx is not None:
                if SEND_BATCH_HEADER not in hdrs and dup_id is None:
                    dup_id = hdrs["dup-id"] = self.new_dup_id()  # doing it again is harmless
            else:
                app_ids = app_dup_ids if app_dup_ids is not None else int(dup_id is not None)
                if app_ids:  # before the stamp: a refused send takes no number
                    self.sequences.count_app_ids(destination, app_ids)
                self.stamp(destination, hdrs)
        result = SendResult(destination, body, hdrs, persistent, dup_id,
                            tx.id if tx is not None else None)
        result.outbox_id = outbox_id
        result.app_ids = app_ids
        if tx is not None:
            hdrs["transaction"] = tx.id
            tx.sends.append(result)
            if tx.state is TxState.OPEN:
                self._emit(Frame("SEND", hdrs, body), result, True, now)
            else:
                result.finish(Outcome.ROLLED_BACK)  # COMMIT will say so
        elif persistent:
            receipt = self._next_id("r")
            result.receipt = receipt
            self.unconfirmed[receipt] = result
            self._emit(Frame("SEND", {**hdrs, "receipt": receipt}, body), result, True, now)
        else:
            self._emit(Frame("SEND", hdrs, body), result, False, now)
        return result

    def subscribe(self, destination: str, ack: str, headers: dict[str, str] | None,
                  sub_id: str | None, now: float) -> tuple[SubscriptionState, Op]:
        if ack not in ("auto", "client", "client-individual"):
            raise ClientError(f"ack must be auto, client or client-individual, got {ack!r}")
        sub_id = sub_id or self._next_id("sub-")
        if sub_id in self.subscriptions:
            raise ClientError(f"subscription id {sub_id!r} is in use")
        sub = SubscriptionState(sub_id, destination, ack, dict(headers or {}))
        receipt = self._next_id("s")
        op = SubOp("subscribe", receipt, sub_id)
        sub.op = op
        self.subscriptions[sub_id] = sub
        self._emit(sub.frame(receipt), op, True, now)
        return sub, op

    def unsubscribe(self, sub_id: str, headers: dict[str, str] | None, now: float) -> Op:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            raise ClientError(f"no subscription {sub_id!r}")
        sub.state = SubState.CLOSED
        sub.buffer.clear()
        receipt = self._next_id("s")
        op = SubOp("unsubscribe", receipt, sub_id)
        self._emit(Frame("UNSUBSCRIBE", {**(headers or {}), "id": sub_id, "receipt": receipt}),
                   op, True, now)
        return op

    def take_message(self, sub: SubscriptionState) -> Message | None:
        """The next buffered message of a subscription, if the application may have it now:
        a client-ack message waits while the link is down, since a failover may void it."""
        if sub.client_ack and self.link is not Link.UP:
            return None
        return sub.take()

    def subscription_error(self, sub: SubscriptionState) -> ClientError | None:
        """Why `sub` will deliver nothing more (None: it may)."""
        if sub.state is SubState.FAILED:
            return sub.error
        if self.link in (Link.CLOSED, Link.FAILED, Link.CLOSING):
            return self.closed_error()
        if sub.state is SubState.CLOSED:
            return ClientClosed(f"subscription {sub.id} was closed")
        return None

    def ack(self, message: Message, now: float, nack: bool = False) -> Op:
        tx = self.tx
        if tx is not None and tx.state is TxState.ROLLED_BACK:
            done = Op("nack" if nack else "ack")
            done.finish(Outcome.ROLLED_BACK)  # COMMIT will say so; the message comes again
            return done
        if message.generation != self.generation:
            if nack:
                done = Op("nack")
                done.finish(Outcome.CONFIRMED)  # back in its queue already
                return done
            raise AckFailed(
                f"message {message.message_id} was received before a failover; the server "
                "has put it back in its queue and will deliver it again (redelivered): this "
                "acknowledgement was not applied", Outcome.ROLLED_BACK)
        ack_id = message.headers.get("ack")
        if ack_id is None:
            raise ClientError("this message needs no acknowledgement (ack mode auto)")
        sub = self.subscriptions.get(message.subscription)
        if sub is None:
            raise ClientError(f"subscription {message.subscription} is closed: its "
                              "unacknowledged messages went back to the server")
        keys = sub.acked(message)
        return self._ack_frame(keys, ack_id, tx, "NACK" if nack else "ACK", now)

    def _ack_frame(self, keys: list[AckKey], ack_id: str, tx: Transaction | None,
                   command: str, now: float) -> Op:
        """An ACK or NACK. Outside a transaction an ACK asks for a receipt only when no
        other ACK's is awaited: any receipt confirms every earlier frame, so one per round
        trip tells which acknowledgements a failure may have lost."""
        op = AckOp(command.lower(), keys)
        headers = {"id": ack_id}
        if tx is not None:
            headers["transaction"] = tx.id
        elif command == "NACK" or self._ack_receipt is None:
            op.receipt = headers["receipt"] = self._next_id("a")
            if command == "ACK":
                self._ack_receipt = op.receipt
        self._emit(Frame(command, headers), op, True, now)
        return op

    def close(self, now: float) -> Op:
        """DISCONNECT when connected (CLOSED once it is receipted), else close at once."""
        op = Op("disconnect", self._next_id("d"))
        if self.link is Link.UP and self.session is not None:
            self._move("close")
            self._out.append(self.session.disconnect(op.receipt or "", now))
            self._awaiting[op.receipt or ""] = (self.session.frames_sent, op)
            return op
        if self.link not in (Link.CLOSED, Link.CLOSING):
            self._move("close")
            self.session = None
            self._finish_all(ClientClosed("the client was closed"))
        op.finish(Outcome.CONFIRMED)
        return op
