"""SUBSCRIBE and UNSUBSCRIBE on queues and topics: a consumer attached to its queue (made
if new), a durable topic subscription and its queue, a selector (a topic subscription
keeps what matches; a queue consumer takes what matches, core/selective.py), and the
temporary queue a SEND's reply-to makes, with its sender subscribed (as RabbitMQ does).
Part of the Broker (a mixin over core/broker/state.py); a stream's subscriptions are in
core/broker/streams.py.
"""

from __future__ import annotations

from typing import Final

from pairmq.core import records as rec
from pairmq.core.broker.handover import Handover
from pairmq.core.destinations import QUEUE, REPLY, TEMP, TOPIC, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.permissions import Exists
from pairmq.core.permissions import durable_name as durable_name_of
from pairmq.core.queue import Address, Queue
from pairmq.core.queue_args import QueueArgs
from pairmq.core.selective import SelectorIndex
from pairmq.core.selector import Selector, compile_selector
from pairmq.core.session import Session
from pairmq.core.subscription import Subscription, ack_mode_of

NOTHING: Final = Exists()


class Subscribing(Handover):
    """The Broker's subscriptions to queues and topics (a mixin)."""

    def subscribe(self, conn_id: int, sub_id: str, destination: str, now: int,
                  ack: str = "auto", prefetch: int | None = None,
                  durable_name: str | None = None, selector: str | None = None,
                  queue_args: QueueArgs | None = None) -> Subscription:
        """`selector`: a JMS message selector (core/selector.py), parsed here once: a
        topic subscription keeps only what matches; a queue consumer takes only what
        matches and leaves the rest for others (core/selective.py)."""
        session = self._session(conn_id)
        session.check_free(sub_id, self.settings.max_subscriptions_per_connection)
        ack_mode = ack_mode_of(ack)
        chosen = compile_selector(selector) if selector is not None else None
        if prefetch is None or prefetch <= 0:
            prefetch = self.settings.default_prefetch
        kind, name = parse_destination(destination)
        self._may_create(destination, kind)
        durable = False
        if kind == QUEUE:
            q = self._plain_queue(destination, queue_args)  # settings if made now
        elif kind == TEMP:
            q = self._temp_queue(session, name)
        elif kind == REPLY:
            found = self.reply_queues.get(name)
            if found is None:
                raise CoreError(f"temporary queue {destination!r} no longer exists")
            if found.owner != conn_id:
                raise CoreError("only the connection that created a temporary queue may "
                                "subscribe to it")
            q = found
        else:
            address = self._address(destination, TOPIC)
            if durable_name:
                durable = True
                q = self._durable_queue(session, address, name, durable_name)
                self._reselect(q, chosen)
            else:
                q = Queue(f"{destination}#{session.token}/{sub_id}", address, name)
                q.accepts = chosen
                address.queues.append(q)
        index = None
        if chosen is not None and kind != TOPIC:
            index = SelectorIndex(chosen)
            index.fill(q.entries())
            q.selective.append(index)
        sub = Subscription(session, sub_id, destination, q, ack_mode, prefetch, durable, index)
        session.subs[sub_id] = sub
        q.consumers.append(sub)
        self._dispatch(q, now)
        return sub

    def _reselect(self, q: Queue, chosen: Selector | None) -> None:
        """A durable subscription keeps what its subscriber's selector matches. A
        subscriber coming back with another selector (or after a restart or a failover,
        where the selector, held in memory, was lost) changes it; what waits and does not
        match is dropped, as JMS does when a durable subscriber changes its selector."""
        before = q.accepts
        q.accepts = chosen
        if chosen is None or (before is not None and before.text == chosen.text):
            return
        for entry in q.remove_where(lambda e: not chosen.matches_message(e.message)):
            self._consumed(q, entry)

    def exists_for(self, conn_id: int, command: str, headers: dict[str, str]) -> Exists:
        """What a SUBSCRIBE or UNSUBSCRIBE finds on this connection (its client-id's
        durable subscription, the non-durable topic subscription it ends): what its
        permission check asks (core/permissions.py)."""
        if command not in ("SUBSCRIBE", "UNSUBSCRIBE"):
            return NOTHING
        session = self._session(conn_id)
        name = durable_name_of(headers)
        if name is not None:
            key = f"{session.client_id}:{name}" if session.client_id else name
            q = self.durables.get(key)
            return Exists(durable_topic=None if q is None else q.address.name)
        sub = session.subs.get(headers.get("id", "")) if command == "UNSUBSCRIBE" else None
        if sub is not None and not sub.durable and sub.queue.address.kind == TOPIC:
            return Exists(non_durable_topic=sub.queue.address.name)
        return NOTHING

    def _durable_queue(self, session: Session, address: Address, topic_name: str,
                       durable_name: str) -> Queue:
        key = f"{session.client_id}:{durable_name}" if session.client_id else durable_name
        q = self.durables.get(key)
        if q is not None and q.consumers:
            raise CoreError(f"durable subscription {key!r} is already active on another "
                            "connection")
        if q is not None and q.address is not address:
            # Re-subscribing a durable name to another topic replaces it, as in ActiveMQ.
            self._drop_durable(key)
            q = None
        if q is None:
            q = Queue(f"durable:{key}", address, topic_name)
            q.durable_key = key
            q.key = f"durable:{key}"
            address.queues.append(q)
            self.durables[key] = q
            self.records.append((rec.DURABLE, key, address.name))
        return q

    def unsubscribe(self, conn_id: int, sub_id: str | None, now: int,
                    delete_durable: bool = False, durable_name: str | None = None) -> None:
        """Remove a subscription; with delete_durable, also the durable subscription behind it."""
        session = self._session(conn_id)
        if self._stream_unsubscribe(session, sub_id):
            return
        sub = session.subs.pop(sub_id, None) if sub_id is not None else None
        if sub is not None:
            self._detach(sub, now, delete=delete_durable)
            return
        if delete_durable and durable_name:
            key = f"{session.client_id}:{durable_name}" if session.client_id else durable_name
            q = self.durables.get(key)
            if q is None:
                raise CoreError(f"no durable subscription {key!r}")
            if q.consumers:
                raise CoreError(f"durable subscription {key!r} is active on another connection")
            self._drop_durable(key)
            return
        raise CoreError(f"no subscription with id {sub_id!r} on this connection")

    def _detach(self, sub: Subscription, now: int, delete: bool) -> None:
        q = sub.queue
        session = sub.session
        if sub in q.consumers:
            q.consumers.remove(sub)
        if sub.index is not None and sub.index in q.selective:
            q.selective.remove(sub.index)
        held = list(sub.unacked.items())
        sub.unacked.clear()
        for ack_id, entry in held:
            session.acks.pop(ack_id, None)
            self._forget_legacy(session, sub.id, entry.message.message_id, ack_id)
        entries = [entry for _, entry in held]
        temporary_topic_queue = q.address.kind == TOPIC and q.durable_key is None
        if temporary_topic_queue or (delete and q.durable_key is not None):
            for entry in entries:
                self._consumed(q, entry)
            if q.durable_key is not None:
                self._drop_durable(q.durable_key)
            else:
                self._delete_queue(q)
            return
        self._return(q, entries, now)
        self._dispatch(q, now)

    def _drop_durable(self, key: str) -> None:
        q = self.durables.pop(key)
        self._delete_queue(q)
        self.records.append((rec.UNDURABLE, key))

    def _reply_temp_queue(self, session: Session, name: str, now: int) -> None:
        """A SEND's `reply-to:/temp-queue/NAME` makes that temporary queue and, as RabbitMQ
        does, subscribes its sender to it: id `/temp-queue/NAME`, ack auto, so that replies
        reach it without a SUBSCRIBE. Not when the sender has a subscription there already
        (nor when the id is taken or the connection has all the subscriptions it may: a
        COMMIT applies whole, so this never refuses). An explicit SUBSCRIBE to the temp
        queue later takes its place (`end_auto_reply`)."""
        q = self._temp_queue(session, name)
        sub_id = f"/temp-queue/{name}"
        most = self.settings.max_subscriptions_per_connection
        if q.consumers or sub_id in session.subs or sub_id in session.cursors or (
                most and len(session.subs) + len(session.cursors) >= most):
            return
        session.auto_replies[sub_id] = self.subscribe(session.id, sub_id, sub_id, now)

    def end_auto_reply(self, conn_id: int, destination: str, now: int) -> None:
        """A SUBSCRIBE to `/temp-queue/NAME`: the subscription a reply-to made there, if
        it is still there, ends first (its replies are not shared with the new one)."""
        session = self._session(conn_id)
        sub = session.auto_replies.pop(destination, None)
        if sub is not None and session.subs.get(destination) is sub:
            self.unsubscribe(conn_id, destination, now)
