"""The blocking failover client: usable from any number of threads.

A thin driver around the sans-IO `Engine`: one I/O thread per client opens connections,
reads the socket, keeps time (heart-beats, retries) and calls the failover listeners
(client/blocking_io.py); application threads call the engine under one lock and write what
it produced. Every wait is a `threading.Condition` on that lock, notified after each batch
the I/O thread applies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from pairmq.client.batching import BatchItem, pack_batch
from pairmq.client.blocking_io import BlockingIO
from pairmq.client.engine import Engine
from pairmq.client.errors import CallTimeout, ClientClosed, ClientError, ConnectionFailed
from pairmq.client.link import Link
from pairmq.client.options import ClientOptions
from pairmq.client.outbox import Outbox
from pairmq.client.outcomes import Outcome
from pairmq.client.results import FailoverEvent, Message, Op, SendResult
from pairmq.client.streams import info_headers, offsets_from_receipt, stream_destination
from pairmq.client.subscriptions import SubscriptionState
from pairmq.client.waiting import Waiting, outcome_of

log = logging.getLogger("pairmq.client")

Listener = Callable[[FailoverEvent], None]


class Subscription:
    """What `Client.subscribe` returns: receive its messages, or iterate over them."""

    def __init__(self, client: Client, state: SubscriptionState) -> None:
        self._client = client
        self._state = state

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def destination(self) -> str:
        return self._state.destination

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after `timeout` s (None: wait for ever). Raises when
        the subscription can deliver nothing more (refused, closed, the client gave up)."""
        return self._client._receive(self._state, timeout)

    def __iter__(self) -> Iterator[Message]:
        while True:
            message = self.receive()
            if message is not None:
                yield message

    def unsubscribe(self, headers: dict[str, str] | None = None) -> None:
        self._client._unsubscribe(self._state, headers)


class Client:
    """A connection to a pair (or one server) that fails over by itself."""

    def __init__(self, options: ClientOptions, name: str | None = None) -> None:
        self.options = options
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._engine = Engine(options, time.monotonic(), name)
        # the socket and the I/O thread (client/blocking_io.py)
        self._io = BlockingIO(self._engine, self._lock, self._cond, options,
                              self._after_batch)
        self._listeners: list[Listener] = []
        self._outbox: Outbox | None = None
        self._outbox_lock = threading.Lock()
        if options.outbox:
            self._outbox = Outbox(options.outbox, options.outbox_max_messages,
                                  options.outbox_max_bytes, options.outbox_full_policy)
            now = time.monotonic()
            for stored in self._outbox.stored():
                result = self._engine.send(stored.destination, stored.body, stored.headers,
                                           True, now, outbox_id=stored.seq)
                result.outcome = Outcome.STORED

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Client:
        """Connect (in the I/O thread) and wait for the first server to accept; with an
        outbox, return at once: messages wait in it until a server is reachable."""
        self._io.start()
        if self._outbox is not None:
            return self
        with self._cond:
            while self._engine.link is Link.CONNECTING:
                self._cond.wait(0.5)
            if self._engine.link is not Link.UP:
                error = self._engine.error
                raise error if isinstance(error, ConnectionFailed) else \
                    ConnectionFailed(str(error))
        return self

    def close(self, timeout: float | None = None) -> None:
        """Wait (up to `timeout` s, default call_timeout) for the persistent messages sent
        so far to be confirmed, then DISCONNECT. With an outbox, what is not confirmed by
        then stays in it for the next client on the same file."""
        if self._engine.link in (Link.CLOSED, Link.FAILED) and not self._io.running():
            return
        if timeout is None:
            timeout = self.options.call_timeout / 1000
        try:
            self.flush(timeout)
        except ClientError:
            pass
        with self._lock:
            op = self._engine.close(time.monotonic())
        self._io.flush()
        self._io.wake()
        try:
            self._wait(op, min(timeout, 5.0), raise_on_failure=False)
        except ClientError:
            pass
        with self._lock:
            if self._engine.link is not Link.CLOSED:
                self._engine.lost("closed by the application", time.monotonic())
        self._io.wake()
        self._io.join(5.0)
        if self._outbox is not None:
            self._outbox.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_failover_listener(self, listener: Listener) -> None:
        """`listener(event)` is called (from the client's I/O thread) after each failover,
        and once when the client gives up."""
        self._listeners.append(listener)

    # ------------------------------------------------------------ sending

    def send(self, destination: str, body: bytes | str, headers: dict[str, str] | None = None,
             persistent: bool = True, timeout: float | None = None) -> SendResult:
        """Send a message. A persistent one returns once the server confirmed it (or, with
        an outbox, once it is stored in it); it rides through failovers, resent with its
        producer stamp (the server drops what it has). Inside a transaction it returns at
        once (COMMIT confirms it)."""
        return self._settle(self.send_async(destination, body, headers, persistent), timeout)

    def _settle(self, result: SendResult, timeout: float | None) -> SendResult:
        self._io.flush()  # this call waits: nothing of it may wait for another answer
        if result.outcome is Outcome.PENDING and result.transaction is None:
            self._wait(result, timeout, raise_on_failure=False)
            if not result.done:
                raise CallTimeout(f"send: not confirmed within {timeout} s (its outcome "
                                  "may still come: result.wait())")
        outcome_of(result)  # refused, rolled back or unknown: raise, however fast it came
        return result

    def send_batch(self, destination: str, messages: Iterable[BatchItem],
                   headers: dict[str, str] | None = None, persistent: bool = True,
                   timeout: float | None = None) -> SendResult:
        """Send many messages in one frame (`pairmq-batch`, docs/stomp.md): each item a body
        or (body, its own headers); `headers` apply to all of them. The server takes or
        refuses them together and confirms them with one receipt; the frame's producer
        stamp numbers its messages, so a resend after a failover adds none twice."""
        return self._settle(self.send_batch_async(destination, messages, headers,
                                                  persistent), timeout)

    def send_batch_async(self, destination: str, messages: Iterable[BatchItem],
                         headers: dict[str, str] | None = None,
                         persistent: bool = True) -> SendResult:
        """`send_batch` without waiting for the confirmation (as `send_async`)."""
        items = list(messages)  # the application's iterable runs outside the client's lock
        with self._lock:
            body, hdrs, dup_ids = pack_batch(items, headers, persistent,
                                             self._engine.auto_dup_ids())
        result = self.send_async(destination, body, hdrs, persistent,
                                 _app_dup_ids=len(dup_ids))
        result.dup_ids = dup_ids
        return result

    def send_async(self, destination: str, body: bytes | str,
                   headers: dict[str, str] | None = None,
                   persistent: bool = True, _app_dup_ids: int | None = None) -> SendResult:
        """Send without waiting for the confirmation: `result.wait()` or `flush()` does.
        Blocks only while `send_window` persistent messages wait for theirs."""
        data = body.encode() if isinstance(body, str) else body
        engine = self._engine
        if persistent and self._outbox is not None and engine.tx is None:
            return self._store(destination, data, headers)
        with self._cond:
            if persistent and len(engine.unconfirmed) >= self.options.send_window:
                self._wait_for_window()
            result = engine.send(destination, data, headers, persistent, time.monotonic(),
                                 app_dup_ids=_app_dup_ids)
            later = engine.may_wait_to_write()
        if not later:
            self._io.flush()
        result.waiter = self._wait
        return result

    def _store(self, destination: str, data: bytes, headers: dict[str, str] | None
               ) -> SendResult:
        """Durable connection: into the outbox first (on disk when this returns), then on
        to the server in order."""
        outbox = self._outbox
        assert outbox is not None
        hdrs = dict(headers or {})
        with self._outbox_lock:
            with self._lock:  # stored with its stamp: a restart resends it with the same
                self._engine.stamp(destination, hdrs)
            seq = outbox.append(destination, hdrs, data)
            with self._lock:
                result = self._engine.send(destination, data, hdrs, True, time.monotonic(),
                                           outbox_id=seq)
                if not result.done:
                    result.outcome = Outcome.STORED
        self._io.flush()
        result.waiter = self._wait
        return result

    def _wait_for_window(self) -> None:
        engine = self._engine
        waiting = Waiting(self.options, None, "send (window full)", time.monotonic())
        while len(engine.unconfirmed) >= self.options.send_window:
            self._check_usable()
            self._cond.wait(waiting.next_wait(engine, time.monotonic()))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every persistent message sent so far is confirmed (with `timeout`, at
        most that many seconds in all; what is still unconfirmed then keeps its outcome)."""
        with self._lock:
            waiting = list(self._engine.unconfirmed.values())
        deadline = None if timeout is None else time.monotonic() + timeout
        for result in waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._wait(result, left)

    # ------------------------------------------------------------ receiving

    def subscribe(self, destination: str, ack: str = "client-individual",
                  headers: dict[str, str] | None = None, id: str | None = None
                  ) -> Subscription:
        """Subscribe (waiting for the server's receipt). The subscription is re-created
        after every failover, with the same id and headers."""
        with self._lock:
            state, op = self._engine.subscribe(destination, ack, headers, id, time.monotonic())
        self._io.flush()
        self._wait(op, None)
        return Subscription(self, state)

    def stream_info(self, stream: str, must_exist: bool = True) -> tuple[int, int]:
        """(first offset still stored, next offset to be appended) of a stream, from the
        active server. With `must_exist`, an unknown stream raises `ServerError` (`unknown
        stream /stream/NAME`) instead of being created."""
        destination = stream_destination(stream)
        with self._lock:
            state, op = self._engine.subscribe(destination, "auto", info_headers(must_exist),
                                               None, time.monotonic())
        self._io.flush()
        self._wait(op, None)
        offsets = offsets_from_receipt(destination, op.receipt_headers)
        self._unsubscribe(state, None)
        return offsets

    def _unsubscribe(self, state: SubscriptionState, headers: dict[str, str] | None) -> None:
        with self._lock:
            op = self._engine.unsubscribe(state.id, headers, time.monotonic())
        self._io.flush()
        self._wait(op, None, raise_on_failure=False)

    def _receive(self, state: SubscriptionState, timeout: float | None) -> Message | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        engine = self._engine
        with self._cond:
            while True:
                message = engine.take_message(state)
                if message is not None:
                    return message
                error = engine.subscription_error(state)
                if error is not None:
                    raise error
                if deadline is None:
                    self._cond.wait(1.0)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def ack(self, message: Message) -> None:
        """Acknowledge a message (client-ack modes). AckFailed if it was received before a
        failover: the server has put it back, and it will come again. During a failover it
        waits to know which (a resumed session keeps the message's ack id valid)."""
        with self._cond:
            self._wait_connected("ack")
            self._engine.ack(message, time.monotonic())
            later = self._engine.may_wait_to_write()
        if not later:
            self._io.flush()

    def nack(self, message: Message) -> None:
        """Give a message back to its queue (it comes again, redelivered)."""
        with self._cond:
            self._wait_connected("nack")
            self._engine.ack(message, time.monotonic(), nack=True)
        self._io.flush()

    def _wait_connected(self, what: str) -> None:
        """While a failover is under way (lock held): until it ends, by the usual rules."""
        engine = self._engine
        if engine.failing_since() is None:
            return
        waiting = Waiting(self.options, None, what, time.monotonic())
        while engine.failing_since() is not None:
            self._cond.wait(waiting.next_wait(engine, time.monotonic()))

    # ------------------------------------------------------------ transactions

    def begin(self) -> None:
        """Start the client's transaction: sends and acks go in it until commit()/abort()."""
        with self._lock:
            op = self._engine.begin(time.monotonic())
        self._io.flush()
        self._wait(op, None)

    def commit(self) -> None:
        """Apply the transaction. TransactionRolledBack if a failover voided it,
        TransactionOutcomeUnknown if the failover cut the COMMIT itself off."""
        with self._lock:
            op = self._engine.end_transaction(True, time.monotonic())
        self._io.flush()
        self._wait(op, None)

    def abort(self) -> None:
        with self._lock:
            op = self._engine.end_transaction(False, time.monotonic())
        self._io.flush()
        self._wait(op, None, raise_on_failure=False)

    @contextmanager
    def transaction(self) -> Iterator[Client]:
        """`with client.transaction():` commits at the end, aborts on an exception."""
        self.begin()
        try:
            yield self
        except BaseException:
            self.abort()
            raise
        self.commit()

    # ------------------------------------------------------------ what the client knows

    @property
    def server(self) -> str | None:
        """HOST:PORT of the server the client is (or was last) connected to."""
        return self._engine.server

    @property
    def connected(self) -> bool:
        return self._engine.link is Link.UP

    def stats(self) -> dict[str, Any]:
        """Failovers, resends and the like; with an outbox, its depth, the age of its oldest
        message and how many it forwarded."""
        with self._lock:
            engine = self._engine
            stats: dict[str, Any] = {**engine.stats, "unconfirmed": len(engine.unconfirmed),
                                     "link": engine.link.value, "server": engine.server}
        if self._outbox is not None:
            stats["outbox"] = self._outbox.stats()
        return stats

    # ------------------------------------------------------------ waiting

    def _wait(self, op: Op, timeout: float | None, raise_on_failure: bool = True) -> Outcome:
        """Until `op` is final (see client/waiting.py for how long)."""
        engine = self._engine
        if not op.done:
            self._io.flush()  # whatever the engine holds back for the reader goes out now
        with self._cond:
            if not op.done:
                waiting = Waiting(self.options, timeout, op.kind, time.monotonic())
                while not op.done:
                    pause = waiting.next_wait(engine, time.monotonic())
                    if pause is None:
                        return op.outcome
                    self._cond.wait(pause)
        return outcome_of(op, raise_on_failure)

    def _check_usable(self) -> None:
        if self._engine.link in (Link.CLOSED, Link.FAILED, Link.CLOSING):
            raise self._engine.closed_error()

    # ------------------------------------------------------------ after each batch (I/O thread)

    def _after_batch(self, forwarded: list[int], events: list[FailoverEvent],
                     restamped: list[tuple[int, dict[str, str]]]) -> None:
        if self._outbox is not None:
            if restamped:
                self._outbox.restamp(restamped)
            if forwarded:
                self._outbox.remove(forwarded)
        for event in events:
            log.info("pairmq client: %s from %s to %s after %.2f s (%s)", event.kind,
                     event.old_server, event.new_server, event.seconds, event.reason)
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:
                    log.exception("failover listener %r failed", listener)


def connect(url: str | list[str] | tuple[str, ...], *,
            failover_listener: Listener | None = None, name: str | None = None,
            **options: Any) -> Client:
    """Connect to a pair: `connect("failover:(stomp://h1:61613,stomp://h2:61614)")`.

    Options are keyword arguments or URL parameters (the Artemis names): see
    `pairmq.client.options.OPTIONS` and docs/clients.md."""
    from pairmq.client.options import parse_options

    client = Client(parse_options(url, options), name=name)
    if failover_listener is not None:
        client.add_failover_listener(failover_listener)
    try:
        return client.start()
    except BaseException:
        client.close(0)
        raise


__all__ = ["Client", "ClientClosed", "Subscription", "connect"]
