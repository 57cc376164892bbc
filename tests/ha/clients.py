"""The HA suite's clients: thin test wrappers over pairmq's own failover client.

`pairmq.client` does the failing over (following the pair, resending with dup-ids,
re-creating subscriptions, acknowledging redeliveries of acks in doubt); these wrappers only
record what the tests check: which servers a client was connected to, what each failover
was, which messages were confirmed (and by which server), which were consumed and how often.

The one-server helpers (`send_some`, `bulk_send`, `drain`) use the same client without
failover, held to the server they are given: a test that asks one server what it accepts or
holds must not be answered by the other.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pairmq.client
from pairmq.client import (
    AckFailed,
    Client,
    ClientError,
    FailoverEvent,
    Outcome,
    SendResult,
    Subscription,
)
from pairmq.client.options import Address, parse_address

# Retry faster than the library's defaults (100 ms x1.5 up to 500 ms): the tests' pair fails
# over in well under a second, and the wait between rounds adds to every test's time.
RETRY_MS = 50
MAX_RETRY_MS = 200


def _server_list(addresses: Sequence[Address]) -> list[str]:
    return [f"{host}:{port}" for host, port in addresses]


def _rounds(seconds: float) -> int:
    """Connection rounds that last about `seconds` when every server refuses."""
    return max(1, round(seconds * 1000 / MAX_RETRY_MS))


class _Failover:
    """One failover client and what the tests read of its failovers.

    `connected_to` lists the servers it served on, in order (the first, then each failover's
    new server); `failures` says why each connection ended."""

    def __init__(self, addresses: Sequence[Address], *, receipt_timeout: float,
                 connect_timeout: float, **options: Any) -> None:
        self._lock = threading.Lock()  # the listener (client I/O thread) and the test's
        self.connected_to: list[Address] = []
        self.failures: list[str] = []
        self.events: list[FailoverEvent] = []
        # connect_timeout: how long without any serving server before calls fail (and the
        # client gives up, so a client a test forgot to close does not retry for ever);
        # receipt_timeout: how long a server may stay silent or leave a call unanswered
        rounds = _rounds(connect_timeout)
        self.client: Client = pairmq.client.connect(
            _server_list(addresses), failover_listener=self._failover,
            retry_interval=RETRY_MS, max_retry_interval=MAX_RETRY_MS,
            initial_connect_attempts=rounds, reconnect_attempts=rounds,
            call_failover_timeout=round(connect_timeout * 1000),
            call_timeout=round(receipt_timeout * 1000),
            client_failure_check_period=round(receipt_timeout * 1000), **options)
        with self._lock:
            if not self.connected_to:  # else a failover's listener was first
                self.connected_to.append(self._server(self.client.server))

    @staticmethod
    def _server(text: str | None) -> Address:
        assert text is not None, "a connected client names its server"
        return parse_address(text)

    def _failover(self, event: FailoverEvent) -> None:
        with self._lock:
            if not self.connected_to:
                self.connected_to.append(self._server(event.old_server))
            self._before_switch()
            self.events.append(event)
            self.failures.append(f"{event.kind}: {event.reason}")
            if event.new_server is not None:
                self.connected_to.append(self._server(event.new_server))

    def _before_switch(self) -> None:
        """Lock held, before `connected_to` names the new server (see FailoverProducer)."""

    def close(self, timeout: float | None = 5.0) -> None:
        self.client.close(timeout)


class FailoverProducer(_Failover):
    """Persistent sends named by the test's dup-ids, up to `window` unconfirmed at a time;
    the client resends unconfirmed ones after a failover, with the same dup-ids.

    `receipted` lists the dup-ids confirmed, in order; `on_receipt(server, dup_id, body)` is
    called for each with the server that confirmed it. Confirmations are noticed on the next
    send or flush, and at each failover before the new server is recorded: the client reads
    nothing on a new connection before its failover listener ran (and what a resumed session
    confirms on reconnecting, the same server confirmed), so each is attributed to the server
    that sent it.
    """

    def __init__(self, addresses: Sequence[Address], destination: str, *, window: int = 16,
                 receipt_timeout: float = 10.0, connect_timeout: float = 30.0,
                 on_receipt: Callable[[Address, str, bytes], None] | None = None) -> None:
        self.destination = destination
        self.window = window
        self.on_receipt = on_receipt
        self.pending: collections.OrderedDict[str, SendResult] = collections.OrderedDict()
        self.receipted: list[str] = []
        super().__init__(addresses, receipt_timeout=receipt_timeout,
                         connect_timeout=connect_timeout, send_window=window)

    @property
    def resent(self) -> int:
        """Messages the client sent again after failovers (with their dup-ids)."""
        return sum(event.resent for event in self.events)

    def _before_switch(self) -> None:
        self._collect()

    def _collect(self) -> None:
        """Move what is confirmed from `pending` to `receipted` (lock held)."""
        server = self.connected_to[-1]
        for dup_id, result in list(self.pending.items()):
            if result.outcome is not Outcome.CONFIRMED:
                continue
            del self.pending[dup_id]
            self.receipted.append(dup_id)
            if self.on_receipt is not None:
                self.on_receipt(server, dup_id, result.body)

    def _wait_for_room(self, room: int) -> None:
        """Until at most `room` sends are unconfirmed. Raises what the client raises for a
        send it cannot get confirmed (CallTimeout, FailoverError, ServerError, ...)."""
        while True:
            with self._lock:
                self._collect()
                if len(self.pending) <= room:
                    return
                dup_id, oldest = next(iter(self.pending.items()))
            outcome = oldest.wait()
            if outcome is not Outcome.CONFIRMED and oldest.done:
                raise ClientError(f"send {dup_id}: {outcome} ({oldest.error})")

    def send(self, dup_id: str, body: bytes) -> None:
        """Send one message named `dup_id` once fewer than `window` are unconfirmed."""
        self._wait_for_room(self.window - 1)
        # Held while sending, so that a failover cannot collect the result before it is in
        # `pending`. send_async does not wait here: fewer than `window` are unconfirmed.
        with self._lock:
            self.pending[dup_id] = self.client.send_async(self.destination, body,
                                                          headers={"dup-id": dup_id})

    def flush(self) -> None:
        """Wait until every message sent so far is confirmed (through failovers)."""
        self._wait_for_room(0)


class FailoverConsumer(_Failover):
    """A checker: consumes with client-individual acks and dedupes nothing.

    `delivered[dup_id]` counts what the client handed out; `consumed[dup_id]` counts acks
    the client accepted (an ack that raises AckFailed was not applied: the message comes
    again). A consumed message must never be handed out again (`after_ack` lists those).
    An ack a failover left in doubt is the client's business: if the message comes again,
    the client acknowledges it itself instead of handing it out.
    """

    def __init__(self, addresses: Sequence[Address], destination: str, *, prefetch: int = 100,
                 receipt_timeout: float = 10.0, connect_timeout: float = 30.0) -> None:
        self.destination = destination
        self.prefetch = prefetch
        self.delivered: collections.Counter[str] = collections.Counter()
        self.consumed: collections.Counter[str] = collections.Counter()
        self.after_ack: list[str] = []
        self.ack_failed = 0
        self.subscription: Subscription | None = None
        self.last_activity = time.monotonic()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        super().__init__(addresses, receipt_timeout=receipt_timeout,
                         connect_timeout=connect_timeout)

    def start(self) -> FailoverConsumer:
        """Subscribe (the server's receipt received), then consume in a thread."""
        self.subscription = self.client.subscribe(
            self.destination, ack="client-individual",
            headers={"prefetch-count": str(self.prefetch)})
        self.thread.start()
        return self

    def _loop(self) -> None:
        subscription = self.subscription
        assert subscription is not None
        try:
            while not self.stop_event.is_set():
                message = subscription.receive(0.2)
                if message is None:
                    continue
                self.last_activity = time.monotonic()
                dup_id = message.dup_id or "?"
                self.delivered[dup_id] += 1
                if self.consumed[dup_id]:
                    self.after_ack.append(dup_id)
                try:
                    self.client.ack(message)
                except AckFailed:
                    self.ack_failed += 1  # received before a failover: it comes again
                    continue
                self.consumed[dup_id] += 1
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def got(self, dup_id: str) -> bool:
        return bool(self.consumed[dup_id])

    def wait_consumed(self, dup_ids: set[str], timeout: float) -> set[str]:
        """Wait until every one of `dup_ids` is consumed; returns those still missing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.error is None:
            missing = {d for d in dup_ids if not self.got(d)}
            if not missing:
                return set()
            time.sleep(0.05)
        return {d for d in dup_ids if not self.got(d)}

    def wait_idle(self, quiet: float = 0.5, timeout: float = 10.0) -> None:
        """Until nothing was handed out for `quiet` s (a late duplicate would show by then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and time.monotonic() - self.last_activity < quiet:
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop consuming and close (DISCONNECT confirms the acks); raises what the consuming
        thread met."""
        self.stop_event.set()
        self.thread.join(10)
        self.close()
        if self.error is not None:
            raise self.error

    def duplicates(self) -> dict[str, int]:
        return {d: n for d, n in self.consumed.items() if n > 1}


class Load:
    """A producer thread sending `prefix-N` messages until stopped (then flushing);
    `on_receipt` as FailoverProducer's."""

    def __init__(self, addresses: Sequence[Address], destination: str, prefix: str = "m",
                 window: int = 16, pause: float = 0.0, receipt_timeout: float = 10.0,
                 on_receipt: Callable[[Address, str, bytes], None] | None = None) -> None:
        self.producer = FailoverProducer(addresses, destination, window=window,
                                         receipt_timeout=receipt_timeout,
                                         on_receipt=on_receipt)
        self.prefix = prefix
        self.pause = pause
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        n = 0
        try:
            while not self.stop_event.is_set():
                self.producer.send(f"{self.prefix}-{n}", f"body {self.prefix} {n}".encode())
                n += 1
                if self.pause:
                    time.sleep(self.pause)
            self.producer.flush()
        except BaseException as e:
            self.error = e
        finally:
            self.producer.close(1.0)  # even when the test failed before stop()

    def start(self) -> Load:
        self.thread.start()
        return self

    def receipted_count(self) -> int:
        return len(self.producer.receipted)

    def wait_receipts(self, count: int, timeout: float) -> None:
        """Wait until `count` more messages than now are receipted."""
        target = self.receipted_count() + count
        deadline = time.monotonic() + timeout
        while self.receipted_count() < target:
            if self.error is not None:
                raise self.error
            if time.monotonic() >= deadline:
                raise TimeoutError(f"only {self.receipted_count()} of {target} receipts within "
                                   f"{timeout} s (failures: {self.producer.failures[-3:]})")
            time.sleep(0.02)

    def stop(self, timeout: float = 60.0) -> list[str]:
        """Stop sending, wait for every receipt; returns the receipted dup-ids."""
        self.stop_event.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"the producer did not finish within {timeout} s "
                               f"(pending {len(self.producer.pending)}, failures "
                               f"{self.producer.failures[-3:]})")
        if self.error is not None:
            raise self.error
        return list(self.producer.receipted)


@contextmanager
def _one_server(address: Address, timeout: float = 30.0, **options: Any) -> Iterator[Client]:
    """The client held to `address`: no reconnecting, and an error if `address` refused
    (a refusal's hint would otherwise take the client to the other server)."""
    client = pairmq.client.connect(_server_list([address]), reconnect_attempts=0,
                                   connection_ttl=0, call_timeout=round(timeout * 1000),
                                   **options)
    try:
        if parse_address(client.server or "") != address:
            raise ConnectionError(f"{address[0]}:{address[1]} refused the client, which went "
                                  f"to {client.server}")
        yield client
    finally:
        client.close(timeout)


def _confirmed(results: Sequence[SendResult]) -> None:
    """Every one confirmed: flush() does not wait for (nor report) a send the server already
    refused, and send() can return a refused one without raising when the refusal came fast."""
    failed = [r for r in results if r.outcome is not Outcome.CONFIRMED]
    if failed:
        raise ClientError(f"{len(failed)} of {len(results)} sends not confirmed, the first: "
                          f"{failed[0].dup_id} {failed[0].outcome} ({failed[0].error})")


def send_some(address: Address, destination: str, prefix: str, count: int) -> list[str]:
    """Send `count` persistent messages to that server, each waiting for its receipt;
    returns the dup-ids."""
    ids = [f"{prefix}-{i}" for i in range(count)]
    with _one_server(address, timeout=10.0) as client:
        _confirmed([client.send(destination, dup_id, headers={"dup-id": dup_id})
                    for dup_id in ids])
    return ids


def bulk_send(address: Address, destination: str, count: int, *, prefix: str = "bulk",
              batch: int = 500, body_size: int = 32) -> list[str]:
    """Send `count` persistent messages to that server fast: pipelined, `batch` unconfirmed
    at most. Returns the dup-ids sent."""
    ids = [f"{prefix}-{i}" for i in range(count)]
    pad = b"x" * max(0, body_size - 16)
    with _one_server(address, send_window=batch) as client:
        results = [client.send_async(destination, b"%d " % i + pad, headers={"dup-id": dup_id})
                   for i, dup_id in enumerate(ids)]
        client.flush()
    _confirmed(results)
    return ids


def drain(address: Address, destination: str, *, idle: float = 1.0, timeout: float = 60.0
          ) -> collections.Counter[str]:
    """Consume everything on `destination` of that server (auto ack); counts of each dup-id
    received."""
    counts: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + timeout
    with _one_server(address) as client:
        subscription = client.subscribe(destination, ack="auto")
        while time.monotonic() < deadline:
            message = subscription.receive(idle)
            if message is None:
                break
            counts[message.dup_id or "?"] += 1
    return counts


def consumed_exactly_once(addresses: Sequence[Address], destination: str,
                          receipted: Sequence[str]) -> None:
    """A FailoverConsumer drains `destination` until every one of `receipted` is consumed
    and nothing more comes; then check_exactly_once."""
    consumer = FailoverConsumer(addresses, destination).start()
    try:
        consumer.wait_consumed(set(receipted), 30)
        consumer.wait_idle()
    finally:
        consumer.stop()
    check_exactly_once(receipted, consumer)


def check_exactly_once(receipted: Sequence[str], consumer: FailoverConsumer) -> None:
    """Every receipted message consumed, none consumed twice, none handed out again after it
    was consumed (the consumer dedupes nothing: a stored duplicate, or a message the server
    delivered again after a confirmed ack, would show here)."""
    missing = sorted(d for d in set(receipted) if not consumer.got(d))
    assert not missing, f"{len(missing)} receipted messages never consumed: {missing[:10]}"
    duplicates = consumer.duplicates()
    assert not duplicates, f"consumed more than once: {dict(list(duplicates.items())[:10])}"
    assert not consumer.after_ack, \
        f"delivered again after it was consumed: {consumer.after_ack[:10]}"
