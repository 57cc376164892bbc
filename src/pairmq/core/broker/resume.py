"""A session whose connection broke but whose client may come back (STOMP CONNECT with
`connection-ttl`, a pairmq extension, as Artemis' connection TTL): it is *parked*, keeping
its subscriptions, unacknowledged deliveries, transactions, temp queues and client-id, and
delivering nothing, until the client resumes it or the server closes it.

Part of the Broker (a mixin, like core/broker/intake.py). When the client resumes, it says the
last ack id it received: ack ids count up per session, and a connection's MESSAGE frames go
out in that order, so every delivery numbered after it was lost with the socket and goes
back to its queue (redelivered), as a NACK would send it.
"""

from __future__ import annotations

from pairmq.core.broker.streams import Streams


class Resume(Streams):
    """The Broker's parking of sessions (a mixin)."""

    def park_session(self, conn_id: int) -> None:
        """The connection broke: keep the session, hand it nothing more. Deliveries not
        written yet are dropped here (a client-ack one comes back when the session is
        resumed or closed; an auto-ack one was consumed when it was dispatched)."""
        session = self._session(conn_id)
        session.writable = False
        self.outbox.pop(conn_id, None)
        self._capped.discard(conn_id)

    def resume_session(self, conn_id: int, last_ack: int, now: int) -> int:
        """The client is back and received deliveries up to ack id `last_ack`: those after
        it go back to their queues; the session takes deliveries again. Returns how many
        went back."""
        session = self._session(conn_id)
        returned = 0
        for sub in list(session.subs.values()):
            lost = [(ack_id, entry) for ack_id, entry in sub.unacked.items()
                    if ack_id.isdigit() and int(ack_id) > last_ack]
            for ack_id, entry in lost:
                del sub.unacked[ack_id]
                session.acks.pop(ack_id, None)
                self._forget_legacy(session, sub.id, entry.message.message_id, ack_id)
            if lost:
                self._return(sub.queue, [entry for _, entry in lost], now)
                returned += len(lost)
        returned += self._resume_cursors(session, last_ack)
        session.writable = True
        for sub in list(session.subs.values()):
            self._dispatch(sub.queue, now)
        self._feed_streams(session)
        return returned
