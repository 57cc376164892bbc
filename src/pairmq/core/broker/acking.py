"""The Broker's ACK, NACK and transactions (a mixin, like core/broker/intake.py): what a
consumer settles, alone or inside a transaction, and what COMMIT and ABORT do with it.
"""

from __future__ import annotations

from collections.abc import Iterable

from pairmq.core.admission import ACCEPTED, Admission, Cause, Outcome, refusal
from pairmq.core.broker.committing import COMMIT_SLICE, Committing
from pairmq.core.destinations import REPLY, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.message import Entry
from pairmq.core.queue import Queue
from pairmq.core.session import PendingSend, Session, Transaction
from pairmq.core.subscription import ACK_CLIENT, Subscription


class Acknowledgements(Committing):
    """ACK, NACK, BEGIN, COMMIT, ABORT (a mixin)."""

    # ----------------------------------------------------------------- ACK / NACK

    def ack(self, conn_id: int, ack_id: str, now: int, transaction: str | None = None) -> None:
        if transaction is None:  # settled at once: every consumer's ACK takes this path
            session = self._session(conn_id)
            if session.cursors and self._stream_acked(session, ack_id):
                return  # a stream's delivery: credit back only
            sub, entries = self._take_acked(session, ack_id)
            q = sub.queue
            for entry in entries:
                self._consumed(q, entry)
        else:
            settled = self._settled(conn_id, ack_id, transaction)
            if settled is None:
                return
            tx, sub, entries = settled
            assert tx is not None
            tx.acked.extend((sub.queue, e) for e in entries)
            q = sub.queue
        self.stats["acknowledged"] += len(entries)
        self._dispatch(q, now)

    def nack(self, conn_id: int, ack_id: str, now: int, transaction: str | None = None,
             requeue: bool = True) -> None:
        """`requeue=False` (RabbitMQ's `requeue:false`): to the dead-letter destination
        (`_reject`) rather than back to the queue; a stream's NACK gives back credit only."""
        settled = self._settled(conn_id, ack_id, transaction)
        if settled is None:
            return
        tx, sub, entries = settled
        if tx is not None:
            (tx.nacked if requeue else tx.rejected).extend((sub.queue, e) for e in entries)
        elif requeue:
            self._return(sub.queue, entries, now)
        else:
            self._reject(sub.queue, entries, now)
        self._dispatch(sub.queue, now)

    def _settled(self, conn_id: int, ack_id: str, transaction: str | None
                 ) -> tuple[Transaction | None, Subscription, list[Entry]] | None:
        """What an ACK or NACK settles: its transaction (None: at once), subscription and
        deliveries; None for a stream's (it gives credit back only). (An ACK outside a
        transaction, every consumer's, takes the same steps in `ack` itself.) In a transaction,
        only while that holds fewer than max_transaction_messages, sent or settled: its
        COMMIT applies them in one turn (about 2.3 µs each; its sends in slices,
        core/broker/committing.py)."""
        session = self._session(conn_id)
        tx = self._tx(session, transaction) if transaction is not None else None
        if self._stream_acked(session, ack_id):
            return None
        if tx is not None and tx.held() >= (most := self.settings.max_transaction_messages):
            raise CoreError(f"transaction {transaction!r} holds max_transaction_messages "
                            f"({most}) messages, sent or acknowledged: COMMIT it before "
                            "acknowledging more")
        sub, entries = self._take_acked(session, ack_id)
        return tx, sub, entries

    def _reject(self, q: Queue, entries: list[Entry], now: int) -> None:
        """NACKed with requeue:false: dead-lettered (`dead-letter-reason: rejected`); from
        a dead-letter queue, or a queue that went away, discarded (as RabbitMQ discards
        what it cannot dead-letter)."""
        for entry in entries:
            if q.deleted or q.is_dead_letter:
                self._consumed(q, entry)
            else:
                self._dead_letter(q, entry, "rejected", now)

    def legacy_ack_id(self, conn_id: int, message_id: str, sub_id: str | None) -> str:
        """STOMP 1.0/1.1 name a delivery by message-id (and subscription): find its ack id."""
        session = self._session(conn_id)
        index = session.legacy_index or {}
        ack_id = index.get((sub_id or "", message_id))
        if ack_id is None:
            where = f" on subscription {sub_id!r}" if sub_id else ""
            raise CoreError(f"no unacknowledged message with message-id {message_id!r}{where}")
        return ack_id

    def _take_acked(self, session: Session, ack_id: str) -> tuple[Subscription, list[Entry]]:
        sub = session.acks.get(ack_id)
        if sub is None:
            raise CoreError(f"no unacknowledged message with ack id {ack_id!r} on this connection")
        if sub.ack_mode == ACK_CLIENT:
            ids: list[str] = []
            for key in sub.unacked:
                ids.append(key)
                if key == ack_id:
                    break
        else:
            ids = [ack_id]
        entries = []
        legacy = session.legacy_index is not None  # STOMP 1.0 and 1.1 sessions only
        for key in ids:
            entry = sub.unacked.pop(key)
            session.acks.pop(key, None)
            if legacy:
                self._forget_legacy(session, sub.id, entry.message.message_id, key)
            entries.append(entry)
        return sub, entries

    @staticmethod
    def _forget_legacy(session: Session, sub_id: str, message_id: str, ack_id: str) -> None:
        index = session.legacy_index
        if index is None:
            return
        for key in ((sub_id, message_id), ("", message_id)):
            if index.get(key) == ack_id:
                del index[key]

    # ----------------------------------------------------------------- transactions

    def begin(self, conn_id: int, transaction: str) -> None:
        session = self._session(conn_id)
        if transaction in session.txs:
            raise CoreError(f"transaction {transaction!r} is already open")
        session.txs[transaction] = Transaction()

    def commit(self, conn_id: int, transaction: str, now: int,
               journal_full: str | None = None) -> Outcome:
        """Apply the transaction's work at once. It is held or refused as a whole when one
        of its messages would be now; otherwise every message is routed (page and drop
        still apply to each as it goes), and the destinations may pass their limits. One
        of more than COMMIT_SLICE sends is applied in slices (core/broker/committing.py)."""
        session = self._session(conn_id)
        tx = self._tx(session, transaction)
        if len(tx.sends) > COMMIT_SLICE:  # too long for one turn: core/broker/committing.py
            return self._begin_run(conn_id, transaction, tx, now)
        refused = self._refused(session, tx.sends, transaction, journal_full)
        if refused is not None:  # checked before anything changes
            return refused
        del session.txs[transaction]
        self._unstage(tx)
        for pending in tx.sends:
            kind, name = parse_destination(pending.destination)
            self._route(session, pending.destination, kind, name, pending.headers,
                        pending.body, now, journal_full, admitted=True)
        self._settle_transaction(tx, now)
        return ACCEPTED

    def _refused(self, session: Session, sends: list[PendingSend], transaction: str,
                 journal_full: str | None) -> Outcome | None:
        """Why these sends of a COMMIT are held or refused now, as a whole (None: they are
        not): one to a temporary queue gone, or one admission would hold or refuse."""
        for pending in sends:
            kind, name = parse_destination(pending.destination)
            if kind == REPLY and name not in self.reply_queues:
                return Outcome(Admission.FAILED, Cause.NONE, None,
                               f"temporary queue {pending.destination!r} no longer exists; "
                               f"transaction {transaction!r} left open")
        for pending in sends:
            kind, name = parse_destination(pending.destination)
            admission, cause, address = self._admission(session, pending.destination, kind,
                                                         name, pending.headers, journal_full)
            if admission is Admission.HELD or admission is Admission.FAILED:
                return refusal(admission, cause, address, self.capacity, journal_full)
        return None

    def _settle_transaction(self, tx: Transaction, now: int) -> None:
        """What a COMMIT does with the deliveries acked and nacked in its transaction."""
        touched: list[Queue] = []
        for q, entry in tx.acked:
            self._consumed(q, entry)
            if q not in touched:
                touched.append(q)
        self._return_grouped(tx.nacked, now, touched)
        for q, entry in tx.rejected:
            self._reject(q, [entry], now)
        for q in touched:
            self._dispatch(q, now)

    def abort(self, conn_id: int, transaction: str, now: int) -> None:
        session = self._session(conn_id)
        tx = self._tx(session, transaction)
        del session.txs[transaction]
        self._undo(tx, now)

    def _undo(self, tx: Transaction, now: int) -> None:
        self._unstage(tx)
        touched: list[Queue] = []
        self._return_grouped(tx.acked + tx.nacked + tx.rejected, now, touched)
        for q in touched:
            self._dispatch(q, now)

    def _return_grouped(self, items: Iterable[tuple[Queue, Entry]], now: int,
                        touched: list[Queue]) -> None:
        grouped: dict[int, tuple[Queue, list[Entry]]] = {}
        for q, entry in items:
            grouped.setdefault(id(q), (q, []))[1].append(entry)
        for q, entries in grouped.values():
            self._return(q, entries, now)
            if q not in touched:
                touched.append(q)
