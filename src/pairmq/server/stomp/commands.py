"""The frames a connection applies that neither hold it nor close it: SUBSCRIBE (a queue
browser too), UNSUBSCRIBE, ACK, NACK, BEGIN, ABORT. Part of `StompConnection` (a mixin, as
server/stomp/connect.py is), kept apart so that connection.py keeps to the connection's life,
its flow control and its output.
"""

from __future__ import annotations

from pairmq.core import CoreError
from pairmq.core.browsing import is_browser
from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.queue_args import parse_queue_args
from pairmq.core.rabbitmq import amq_target, requeue_of
from pairmq.protocol import Frame
from pairmq.server.clock import now_ms
from pairmq.server.stomp import wire
from pairmq.server.stomp.sliced_frames import SlicedFrames


class Commands(SlicedFrames):
    """Subscriptions, acknowledgements, transactions (a mixin: StompConnection provides
    the state)."""

    __slots__ = ()  # all in ConnectionState's

    def on_subscribe(self, frame: Frame) -> dict[str, str] | None:
        h = frame.headers
        destination = h.get("destination")
        if destination is None:
            raise CoreError("SUBSCRIBE requires a destination header")
        sub_id = h.get("id")
        if sub_id is None:
            if self.session.version != "1.0":
                raise CoreError("SUBSCRIBE requires an id header")
            sub_id = destination
        # RabbitMQ's /amq/queue/NAME: the stream NAME or the queue NAME (core/rabbitmq.py)
        destination = amq_target(destination, h, self.broker.streams, subscribe=True)
        if is_browser(h):
            self._browse(sub_id, destination)
            return None
        prefetch = _int_header(h, "prefetch-count")
        if prefetch is None:
            prefetch = _int_header(h, "activemq.prefetchSize")
        if destination.startswith(STREAM_PREFIX):  # docs/streams.md
            first, next_offset = self.broker.subscribe_stream(
                self.conn_id, sub_id, destination, h, ack=h.get("ack", "auto"),
                prefetch=prefetch)
            return {"x-stream-first-offset": str(first), "x-stream-next-offset": str(next_offset)}
        durable_name = h.get("activemq.subscriptionName")
        if durable_name is None and (h.get("durable") == "true" or h.get("persistent") == "true"):
            durable_name = sub_id
        queue_args = parse_queue_args(h, destination)  # RabbitMQ's x- arguments, checked
        if destination.startswith("/temp-queue/"):  # replaces the one a reply-to made
            self.broker.end_auto_reply(self.conn_id, destination, now_ms())
        self.broker.subscribe(self.conn_id, sub_id, destination, now_ms(),
                              ack=h.get("ack", "auto"), prefetch=prefetch,
                              durable_name=durable_name, selector=h.get("selector"),
                              queue_args=queue_args)
        return None

    def _browse(self, sub_id: str, destination: str) -> None:
        """A queue browser (core/browsing.py): the first messages waiting, as MESSAGEs
        without an ack header (each once its record is confirmed, as any delivery), then
        one with `browser:end`. Nothing is subscribed: the id is free again at once."""
        role = self.role
        version = self.session.version
        line = wire.subscription_line(sub_id, version)
        gate = role.delivery_gate if self.gated else None
        self.drain_deliveries()
        for message in role.browse(destination, self.config.max_browse_messages):
            ticket = gate(message) if gate is not None and message.persistent else None
            self.confirm(ticket, wire.encode_browsed(message, version, line, role.read_body))
        self.confirm(None, wire.browse_end(destination, version, line))

    def on_unsubscribe(self, frame: Frame) -> None:
        h = frame.headers
        sub_id = h.get("id")
        if sub_id is None and self.session.version == "1.0":
            sub_id = h.get("destination")
        durable_name = h.get("activemq.subscriptionName")
        delete = durable_name is not None or h.get("durable") == "true" \
            or h.get("persistent") == "true"
        if sub_id is None and not delete:
            raise CoreError("UNSUBSCRIBE requires an id header")
        self.broker.unsubscribe(self.conn_id, sub_id, now_ms(), delete_durable=delete,
                                durable_name=durable_name or sub_id)
        if sub_id is not None:
            self.sub_lines.pop(sub_id, None)

    def _ack_id(self, frame: Frame) -> str:
        h = frame.headers
        if self.session.version == "1.2":
            ack_id = h.get("id")
            if ack_id is None:
                raise CoreError(f"{frame.command} requires an id header (the MESSAGE's ack "
                                "header)")
            return ack_id
        message_id = h.get("message-id")
        if message_id is None:
            raise CoreError(f"{frame.command} requires a message-id header")
        return self.broker.legacy_ack_id(self.conn_id, message_id, h.get("subscription"))

    def on_ack(self, frame: Frame) -> None:
        self.broker.ack(self.conn_id, self._ack_id(frame), now_ms(),
                        frame.headers.get("transaction"))

    def on_nack(self, frame: Frame) -> None:
        self.broker.nack(self.conn_id, self._ack_id(frame), now_ms(),
                         frame.headers.get("transaction"), requeue=requeue_of(frame.headers))

    def _transaction(self, frame: Frame) -> str:
        tx = frame.headers.get("transaction")
        if tx is None:
            raise CoreError(f"{frame.command} requires a transaction header")
        return tx

    def on_begin(self, frame: Frame) -> None:
        self.broker.begin(self.conn_id, self._transaction(frame))

    def on_abort(self, frame: Frame) -> None:
        self.broker.abort(self.conn_id, self._transaction(frame), now_ms())


def _int_header(headers: dict[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise CoreError(f"{name} must be an integer, got {value!r}") from None
    if number < 0:
        raise CoreError(f"{name} must not be negative, got {value!r}")
    return number


