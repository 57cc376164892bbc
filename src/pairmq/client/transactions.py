"""The client's transaction: its id, whether a failover voided it, the messages sent in it
(confirmed or rolled back together at its end), and the BEGIN/COMMIT/ABORT calls (part of
the Engine, a mixin). One transaction at a time per client, as a transacted JMS session:
while it is open, the client's sends and acknowledgements go in it."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pairmq.client.errors import ClientError, TransactionRolledBack
from pairmq.client.results import Op, Outcome, SendResult
from pairmq.protocol import Frame


class TxState(StrEnum):
    OPEN = "open"
    ROLLED_BACK = "rolled-back"  # a failover lost it: COMMIT raises TransactionRolledBack


class Transaction:
    __slots__ = ("id", "sends", "state")

    def __init__(self, tx_id: str) -> None:
        self.id = tx_id
        self.state = TxState.OPEN
        self.sends: list[SendResult] = []


class TxOp(Op):
    """A BEGIN, COMMIT or ABORT waiting for its receipt."""

    __slots__ = ("tx",)

    def __init__(self, kind: str, receipt: str | None, tx: Transaction) -> None:
        super().__init__(kind, receipt)
        self.tx = tx


class Transacting:
    """BEGIN, COMMIT and ABORT (a mixin: the Engine provides the state and helpers)."""

    name: str
    tx: Transaction | None

    if TYPE_CHECKING:  # provided by the Engine
        def _next_id(self, prefix: str) -> str: ...
        def _emit(self, frame: Frame, op: Op | None, log: bool, now: float) -> None: ...

    def begin(self, now: float) -> Op:
        if self.tx is not None:
            raise ClientError(f"transaction {self.tx.id} is open: commit or abort it first")
        tx = Transaction(self._next_id(f"tx-{self.name}-"))
        self.tx = tx
        op = TxOp("begin", self._next_id("t"), tx)
        self._emit(Frame("BEGIN", {"transaction": tx.id, "receipt": op.receipt or ""}), op,
                   True, now)
        return op

    def end_transaction(self, commit: bool, now: float) -> Op:
        """COMMIT or ABORT the open transaction; TransactionRolledBack when a failover
        voided it (ABORT of a voided one is simply done)."""
        tx = self.tx
        if tx is None:
            raise ClientError("no transaction is open")
        self.tx = None
        if tx.state is TxState.ROLLED_BACK:
            if commit:
                raise rolled_back_error(tx)
            done = TxOp("abort", None, tx)
            done.finish(Outcome.CONFIRMED)
            return done
        kind = "commit" if commit else "abort"
        op = TxOp(kind, self._next_id("t"), tx)
        self._emit(Frame(kind.upper(), {"transaction": tx.id, "receipt": op.receipt or ""}),
                   op, True, now)
        return op


def rolled_back_error(tx: Transaction) -> TransactionRolledBack:
    return TransactionRolledBack(
        f"transaction {tx.id} was rolled back by a failover: nothing sent or acknowledged "
        "in it took effect; messages received in it come again", Outcome.ROLLED_BACK)
