"""BEGIN, COMMIT and ABORT: the application's calls on the client's transaction (one part of
the Engine, client/engine_state.py; the transaction itself is client/transactions.py)."""

from __future__ import annotations

from pairmq.client.engine_state import EngineState
from pairmq.client.errors import ClientError
from pairmq.client.outcomes import Outcome
from pairmq.client.results import Op
from pairmq.client.transactions import Transaction, TxOp, TxState, rolled_back_error
from pairmq.protocol import Frame


class Transacting(EngineState):
    """BEGIN, COMMIT and ABORT."""

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
