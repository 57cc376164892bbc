"""The client's transaction: its id, whether a failover voided it, the messages sent in it
(confirmed or rolled back together at its end), and the operations that begin and end it.
One transaction at a time per client, as a transacted JMS session: while it is open, the
client's sends and acknowledgements go in it (the calls are client/transacting.py's)."""

from __future__ import annotations

from enum import StrEnum

from pairmq.client.errors import TransactionRolledBack
from pairmq.client.outcomes import Outcome
from pairmq.client.results import Op, SendResult


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


def rolled_back_error(tx: Transaction) -> TransactionRolledBack:
    return TransactionRolledBack(
        f"transaction {tx.id} was rolled back by a failover: nothing sent or acknowledged "
        "in it took effect; messages received in it come again", Outcome.ROLLED_BACK)
