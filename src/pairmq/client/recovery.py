"""What a failover (or a refusal) does to what was in flight: one part of the `Engine`
(client/engine_state.py), kept apart because it is the client's one subtle part.

Two ways out of a failure:

- the same server still held the session (*resumed*): the server applied, and confirmed,
  the first `resume-frames` frames of it; the engine finishes their operations and writes
  the rest again, as if the socket had never broken;
- a *fresh* session (another server, or the old session expired): nothing of the old
  session survives on the server. Subscriptions are re-created (a receipt each) before
  anything else is written, then every unconfirmed persistent send goes again with its
  dup-id, then what the application did meanwhile. Messages delivered on the old session
  are back in the server's queues: buffered ones of client-ack subscriptions are dropped,
  and an ACK whose receipt the failure took is *in doubt* (if the message comes again, the
  engine acknowledges it itself). The open transaction is rolled back; a COMMIT in flight
  has an UNKNOWN outcome.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from pairmq.client.engine_state import EngineState
from pairmq.client.errors import (
    ClientClosed,
    ClientError,
    TransactionOutcomeUnknown,
)
from pairmq.client.link import Link
from pairmq.client.outcomes import Outcome
from pairmq.client.results import EventKind, FailoverEvent, Op, SendResult
from pairmq.client.sequences import message_count, stamp_in
from pairmq.client.subscriptions import AckKey, AckOp, SubOp
from pairmq.client.transactions import TxOp, TxState, rolled_back_error
from pairmq.protocol import Frame
from pairmq.protocol.stamps import STAMP_HEADERS

IN_DOUBT_LIMIT = 100_000  # acknowledgements in doubt remembered (oldest forgotten first)

# An operation in flight when a fresh session replaces a failed one, by kind: what it became.
_AFTER_FAILOVER = {
    "unsubscribe": Outcome.CONFIRMED,  # the new server never had it
    "begin": Outcome.CONFIRMED,  # its transaction is rolled back: COMMIT will say so
    "abort": Outcome.CONFIRMED,  # the transaction is gone either way
    "ack": Outcome.UNKNOWN,  # in doubt: a redelivery is acknowledged by the engine
    "nack": Outcome.CONFIRMED,  # the message is back in its queue either way
}


class Recovery(EngineState):
    """The Engine's failover bookkeeping."""

    def _resumed(self, applied: int, now: float) -> None:
        """The server still held the session and applied (and confirmed) its first
        `applied` frames: finish those, write the others again, then what waited."""
        assert self.session is not None
        again = []
        for index, frame, op in self._log:
            if index > applied:
                again.append((frame, op))
            elif op is not None and op.receipt is not None:
                self._done(op.receipt, op, now)
        self._log.clear()
        self._awaiting.clear()
        acks = self._acks  # those applied are confirmed; the others are written again
        while acks and acks[0].written <= applied:
            acks.popleft().finish(Outcome.CONFIRMED)
        acks.clear()
        self._ack_receipt = None
        self.session.frames_sent = applied
        self._handed = applied  # at the server already
        self._move("up")
        self._resume = self._granted
        for frame, op in again:
            self._write(frame, op, True, now)
        self._write_pending(now)
        self.stats["failovers"] += 1
        self.stats["resumed"] += 1
        self._event_failover(now, resumed=True, resent=len(again))

    def _fresh_after_failure(self, now: float) -> None:
        """A new session replaces a failed one (another server, or the old session gone)."""
        for _, op in list(self._awaiting.values()):
            self._settle_after_failover(op)
        for ack in self._acks:  # written, never confirmed: the server may not have them
            self._doubt(ack.keys)
            ack.finish(Outcome.UNKNOWN)
        self._acks.clear()
        self._ack_receipt = None
        self._log.clear()
        self._awaiting.clear()
        self._rolled_back = self._roll_back_transactions()
        # Frames written before the failure may be gone with it: every unconfirmed
        # persistent send goes again (those still pending go after, in their place).
        self._resend = [s for s in self.unconfirmed.values() if s.written]
        for sub in self.subscriptions.values():
            sub.forget_delivered()
        lost = set(self._rolled_back)
        self._pending = deque(item for item in self._pending if self._still_wanted(item, lost))
        self._move("recover")
        self._recovering = {}
        for sub in list(self.subscriptions.values()):
            receipt = self._next_id("s")
            self._recovering[receipt] = sub
            self._write(sub.frame(receipt), SubOp("resubscribe", receipt, sub.id), False, now)
        if not self._recovering:
            self._recovered(now)

    def _recovered(self, now: float) -> None:
        resend = self._resend
        self._resend = []
        self._move("up")
        self._resume = self._granted
        for result in resend:
            frame = Frame("SEND", {**result.headers, "receipt": result.receipt or ""},
                          result.body)
            self._write(frame, result, True, now)
        self._write_pending(now)
        self.stats["failovers"] += 1
        self.stats["resent"] += len(resend)
        self._event_failover(now, resumed=False, resent=len(resend))

    def _event_failover(self, now: float, resumed: bool, resent: int) -> None:
        started = self._failed_at if self._failed_at is not None else now
        self.events.append(FailoverEvent(
            EventKind.FAILOVER, self._failed_server, self.server, self._failure,
            resumed=resumed, seconds=round(now - started, 3), resent=resent,
            rolled_back=self._rolled_back))
        self._failed_at = None
        self._rolled_back = ()

    def _settle_after_failover(self, op: Op) -> None:
        """An operation whose answer the failed session took with it."""
        kind = op.kind
        if kind in ("send", "resubscribe"):
            return  # sent again (`unconfirmed`), rolled back with its transaction, or redone
        if kind == "subscribe":
            return  # finished when the subscription is re-created
        if kind == "commit":
            op.finish(Outcome.UNKNOWN, TransactionOutcomeUnknown(
                "the connection failed while COMMIT was on its way: it may or may not have "
                "been applied; doing the transaction again with the same dup-ids is harmless",
                Outcome.UNKNOWN))
            return
        op.finish(_AFTER_FAILOVER.get(kind, Outcome.UNKNOWN))

    def _doubt(self, keys: Iterable[AckKey]) -> None:
        in_doubt = self.in_doubt
        for key in keys:
            in_doubt[key] = None
        while len(in_doubt) > IN_DOUBT_LIMIT:
            in_doubt.popitem(last=False)

    def _roll_back_transactions(self) -> tuple[str, ...]:
        """A transaction open when the session failed is gone from the server (or, begun
        while disconnected, would acknowledge messages the failure voided): rolled back."""
        candidates = [self.tx] + [op.tx for _, op, _ in self._pending if isinstance(op, TxOp)]
        lost = []
        for tx in candidates:
            if tx is not None and tx.state is TxState.OPEN:
                tx.state = TxState.ROLLED_BACK
                for result in tx.sends:
                    result.finish(Outcome.ROLLED_BACK)
                lost.append(tx.id)
        self.stats["rolled_back"] += len(lost)
        return tuple(lost)

    def _still_wanted(self, item: tuple[Frame, Op | None, bool],
                      rolled_back: set[str]) -> bool:
        """A frame queued during the failover, judged now that a fresh session replaces
        the failed one (`rolled_back`: the transactions the failover voided)."""
        frame, op, _ = item
        if frame.headers.get("transaction") in rolled_back:
            if isinstance(op, TxOp) and op.kind == "commit":
                op.finish(Outcome.ROLLED_BACK, rolled_back_error(op.tx))
            elif isinstance(op, TxOp):
                op.finish(Outcome.CONFIRMED)  # begin, abort: nothing left to do
            elif op is not None:
                op.finish(Outcome.ROLLED_BACK)
            return False
        if isinstance(op, AckOp) and op.kind == "ack":  # a message of the failed session
            self._doubt(op.keys)
            op.finish(Outcome.UNKNOWN)
            return False
        if op is not None and op.kind in ("nack", "unsubscribe"):
            op.finish(Outcome.CONFIRMED)  # back in its queue; not on the new server either
            return False
        # a SUBSCRIBE made while disconnected: recovery creates it, with the others
        return not (op is not None and op.kind == "subscribe")

    def _renumber_after(self, refused: SendResult) -> None:
        """A stamped message was refused: what its producer sent to that destination after
        it was not taken either (the server closed the connection), so it is numbered
        again in a new epoch, which the server takes from any number (client/sequences.py).
        Frames built but not written yet, and outbox rows, get the new stamps too."""
        stamp = stamp_in(refused.headers)
        if stamp is None or refused.transaction is not None:
            return
        later = []
        for result in self.unconfirmed.values():
            other = stamp_in(result.headers)
            if result.destination == refused.destination and other is not None \
                    and other.producer == stamp.producer and other.epoch == stamp.epoch \
                    and other.seq > stamp.seq:
                later.append(result)
        self.sequences.renumber(stamp, refused.destination,
                                [(r.headers, message_count(r.headers)) for r in later])
        renumbered = {id(r) for r in later}
        for frame, op, _ in self._pending:
            if id(op) in renumbered:
                assert isinstance(op, SendResult)
                for name in STAMP_HEADERS:
                    frame.headers.pop(name, None)
                frame.headers.update((k, v) for k, v in op.headers.items()
                                     if k in STAMP_HEADERS)
        for result in later:
            if result.outbox_id is not None:
                self.restamped.append((result.outbox_id, dict(result.headers)))

    def give_up(self, error: ClientError, now: float) -> None:
        """No more connections: every operation still open ends (UNKNOWN or ROLLED_BACK)."""
        if self.link in (Link.CLOSED, Link.FAILED):
            return
        self.error = error
        self.session = None
        self._move("give-up" if self.link is not Link.CLOSING else "lost")
        if self.generation:
            started = self._failed_at if self._failed_at is not None else now
            self.events.append(FailoverEvent(EventKind.DISCONNECT, self._failed_server, None,
                                             f"{self._failure}; {error}",
                                             seconds=round(now - started, 3)))
        self._finish_all(ClientClosed(f"the client gave up: {error}"))

    def _finish_all(self, error: ClientError) -> None:
        """Closed or given up: every operation still open ends, UNKNOWN when the server
        may have done it."""
        for result in self.unconfirmed.values():
            result.finish(Outcome.UNKNOWN, error)
        for _, op in self._awaiting.values():
            op.finish(Outcome.UNKNOWN, error)
        for _, pending, _ in self._pending:
            if pending is not None:
                pending.finish(Outcome.UNKNOWN, error)
        if self.tx is not None:
            for result in self.tx.sends:
                result.finish(Outcome.ROLLED_BACK, error)
        for sub in self.subscriptions.values():
            if sub.op is not None:
                sub.op.finish(Outcome.FAILED, error)
        self._pending.clear()
        self._awaiting.clear()
        self._log.clear()
        self._recovering.clear()
