"""Failover-aware test clients for the pair: a producer that resends with dup-ids, a consumer
that acknowledges with receipts and counts what it consumed, and a bulk loader.

Both clients follow the server's hints: a refusal (ERROR) names the active server in its
`active-server` header, and they try that address first.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence

from pairmq.client.plain import BlockingConnection, StompError
from pairmq.protocol import Frame, serialize

Address = tuple[str, int]
FAILURES = (StompError, OSError, ConnectionError, TimeoutError)


def parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host, int(port)


class _Failover:
    """Connect to whichever of `addresses` accepts, preferring the last active-server hint."""

    def __init__(self, addresses: Sequence[Address], connect_timeout: float = 30.0) -> None:
        self.addresses = list(addresses)
        self.connect_timeout = connect_timeout
        self.conn: BlockingConnection | None = None
        self.hint: Address | None = None
        self.connected_to: list[Address] = []
        self.refusals: list[str] = []
        self.failures: list[str] = []

    def _connect(self) -> BlockingConnection:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            order = list(self.addresses)
            if self.hint in order:
                order.remove(self.hint)
                order.insert(0, self.hint)
            for address in order:
                try:
                    conn = BlockingConnection(*address, timeout=2.0)
                except StompError as e:
                    self.refusals.append(f"{address}: {e}")
                    active = e.frame.headers.get("active-server")
                    if active:
                        self.hint = parse_address(active)
                    continue
                except (OSError, ConnectionError, TimeoutError):
                    continue
                self.conn = conn
                self.connected_to.append(address)
                return conn
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no server of {self.addresses} accepted a client within "
                                   f"{self.connect_timeout} s (refusals: {self.refusals[-3:]})")
            time.sleep(0.02)

    def _drop(self, error: BaseException) -> None:
        self.failures.append(f"{type(error).__name__}: {error}")
        if isinstance(error, StompError):
            active = error.frame.headers.get("active-server")
            if active:
                self.hint = parse_address(active)
        if self.conn is not None:
            try:
                self.conn.sock.close()
            except OSError:
                pass
        self.conn = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class FailoverProducer(_Failover):
    """Persistent SENDs with a receipt each, up to `window` unreceipted at a time.

    When the server dies, refuses or stops confirming, it reconnects to whichever server
    accepts and resends, in order, every message not yet receipted, with the same dup-id.
    """

    def __init__(self, addresses: Sequence[Address], destination: str, *, window: int = 16,
                 receipt_timeout: float = 10.0, connect_timeout: float = 30.0,
                 on_receipt: Callable[[Address, str, bytes], None] | None = None) -> None:
        super().__init__(addresses, connect_timeout)
        self.destination = destination
        self.on_receipt = on_receipt  # (server address, dup-id, body) as each RECEIPT arrives
        self.window = window
        self.receipt_timeout = receipt_timeout
        self.pending: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self.receipted: list[str] = []
        self.receipt_times: list[float] = []  # monotonic time of each receipt
        self.sent = 0
        self.resent = 0

    def _write(self, dup_id: str, body: bytes) -> None:
        assert self.conn is not None
        self.conn._write(Frame("SEND", {"destination": self.destination, "persistent": "true",
                                        "dup-id": dup_id, "receipt": dup_id}, body))

    def _read(self) -> None:
        assert self.conn is not None
        frame = self.conn.read_frame(self.receipt_timeout)
        if frame.command == "RECEIPT":
            rid = frame.headers.get("receipt-id", "")
            body = self.pending.pop(rid, None)
            if body is not None:
                self.receipted.append(rid)
                self.receipt_times.append(time.monotonic())
                if self.on_receipt is not None:
                    self.on_receipt(self.connected_to[-1], rid, body)

    def _run(self, dup_id: str | None, done) -> None:
        give_up = time.monotonic() + self.connect_timeout + self.receipt_timeout
        while True:
            try:
                if self.conn is None:
                    self._connect()
                    for pending_id, body in list(self.pending.items()):
                        self._write(pending_id, body)
                        self.resent += 1
                elif dup_id is not None:
                    self._write(dup_id, self.pending[dup_id])
                dup_id = None
                while not done():
                    self._read()
                return
            except FAILURES as e:
                self._drop(e)
                dup_id = None
                if time.monotonic() >= give_up:
                    raise

    def send(self, dup_id: str, body: bytes) -> None:
        self.pending[dup_id] = body
        self.sent += 1
        self._run(dup_id, lambda: len(self.pending) < self.window)

    def flush(self) -> None:
        """Wait until every message sent so far is receipted (reconnecting as needed)."""
        self._run(None, lambda: not self.pending)


class FailoverConsumer(_Failover):
    """Consumes with client-individual acks, each ACK with a receipt; never dedupes.

    `delivered[dup_id]` counts deliveries; `consumed[dup_id]` counts acks the server
    confirmed. A message consumed once must never be consumed again, and never be
    delivered again after its ack was confirmed (`after_ack` lists such deliveries).
    """

    def __init__(self, addresses: Sequence[Address], destination: str, *, prefetch: int = 100,
                 connect_timeout: float = 30.0) -> None:
        super().__init__(addresses, connect_timeout)
        self.destination = destination
        self.prefetch = prefetch
        self.delivered: collections.Counter[str] = collections.Counter()
        self.consumed: collections.Counter[str] = collections.Counter()
        self.after_ack: list[str] = []
        self.acks: dict[str, str] = {}  # ack receipt -> dup-id
        # acked, but the connection died before the receipt: the server may or may not
        # have applied the ack (the message was consumed, but may come again)
        self.in_doubt: set[str] = set()
        self._ack_seq = 0
        self.last_activity = time.monotonic()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _drop(self, error: BaseException) -> None:
        self.in_doubt.update(self.acks.values())
        self.acks.clear()
        super()._drop(error)

    def _subscribe(self) -> None:
        conn = self._connect()
        early = conn.request(Frame("SUBSCRIBE", {"destination": self.destination, "id": "1",
                                                 "ack": "client-individual",
                                                 "prefetch-count": str(self.prefetch)}))
        conn.pending.extendleft(reversed(early))

    def _step(self) -> None:
        assert self.conn is not None
        frame = self.conn.read_frame(0.2)
        self.last_activity = time.monotonic()
        if frame.command == "MESSAGE":
            dup_id = frame.headers.get("dup-id", "?")
            self.delivered[dup_id] += 1
            if self.consumed[dup_id]:
                self.after_ack.append(dup_id)
            self._ack_seq += 1
            receipt = f"ack-{self._ack_seq}"
            self.acks[receipt] = dup_id
            self.conn._write(Frame("ACK", {"id": frame.headers["ack"], "receipt": receipt}))
        elif frame.command == "RECEIPT":
            dup_id = self.acks.pop(frame.headers.get("receipt-id", ""), None)
            if dup_id is not None:
                self.consumed[dup_id] += 1
                self.in_doubt.discard(dup_id)

    def _loop(self) -> None:
        try:
            while not self.stop_event.is_set():
                try:
                    if self.conn is None:
                        self._subscribe()
                    self._step()
                except TimeoutError:
                    if self.conn is not None and not self.conn.pending:
                        continue  # idle
                    raise
                except FAILURES as e:
                    self._drop(e)
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def start(self) -> FailoverConsumer:
        self.thread.start()
        return self

    def got(self, dup_id: str) -> bool:
        """Consumed: its ack confirmed, or acked with the receipt lost to a failover."""
        return bool(self.consumed[dup_id]) or dup_id in self.in_doubt

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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and time.monotonic() - self.last_activity < quiet:
            time.sleep(0.05)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(10)
        if self.conn is not None:
            try:
                self.conn.sock.close()
            except OSError:
                pass
            self.conn = None
        if self.error is not None:
            raise self.error

    def duplicates(self) -> dict[str, int]:
        return {d: n for d, n in self.consumed.items() if n > 1}


class Load:
    """A producer thread sending `prefix-N` messages until stopped (then flushing)."""

    def __init__(self, addresses: Sequence[Address], destination: str, prefix: str = "m",
                 window: int = 16, pause: float = 0.0, receipt_timeout: float = 10.0) -> None:
        self.producer = FailoverProducer(addresses, destination, window=window,
                                         receipt_timeout=receipt_timeout)
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
        self.producer.close()
        return list(self.producer.receipted)


def bulk_send(address: Address, destination: str, count: int, *, prefix: str = "bulk",
              batch: int = 500, body_size: int = 32) -> list[str]:
    """Send `count` persistent messages fast: pipelined SENDs, a receipt on each batch's last.

    Receipts come in journal order on one connection, so the last one's receipt confirms
    the whole batch. Returns the dup-ids sent.
    """
    conn = BlockingConnection(*address, timeout=30.0)
    ids = []
    pad = b"x" * max(0, body_size - 16)
    try:
        for start in range(0, count, batch):
            chunk = []
            end = min(count, start + batch)
            for i in range(start, end):
                dup_id = f"{prefix}-{i}"
                ids.append(dup_id)
                headers = {"destination": destination, "persistent": "true", "dup-id": dup_id}
                if i == end - 1:
                    headers["receipt"] = f"batch-{i}"
                chunk.append(serialize(Frame("SEND", headers, b"%d " % i + pad), "1.2"))
            conn.sock.sendall(b"".join(chunk))
            while True:
                frame = conn.read_frame(30.0)
                if frame.command == "RECEIPT" and frame.headers["receipt-id"] == f"batch-{end - 1}":
                    break
    finally:
        conn.close()
    return ids


def drain(address: Address, destination: str, *, idle: float = 1.0, timeout: float = 60.0
          ) -> collections.Counter[str]:
    """Consume everything on `destination` (auto ack); counts of each dup-id received."""
    conn = BlockingConnection(*address, timeout=10.0)
    counts: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + timeout
    try:
        conn.subscribe(destination, sub_id="drain", ack="auto")
        while time.monotonic() < deadline:
            try:
                frame = conn.read_frame(idle)
            except TimeoutError:
                break
            if frame.command == "MESSAGE":
                counts[frame.headers.get("dup-id", "?")] += 1
    finally:
        conn.close()
    return counts


def check_exactly_once(receipted: Sequence[str], consumer: FailoverConsumer) -> None:
    """Every receipted message consumed, none consumed twice, none delivered after its
    confirmed ack (the consumer dedupes nothing: a stored duplicate would show here)."""
    missing = sorted(d for d in set(receipted) if not consumer.got(d))
    assert not missing, f"{len(missing)} receipted messages never consumed: {missing[:10]}"
    duplicates = consumer.duplicates()
    assert not duplicates, f"consumed more than once: {dict(list(duplicates.items())[:10])}"
    assert not consumer.after_ack, \
        f"delivered again after a confirmed ack: {consumer.after_ack[:10]}"


def send_some(address: Address, destination: str, prefix: str, count: int) -> list[str]:
    """Send `count` persistent messages, each waiting for its receipt; returns the dup-ids."""
    conn = BlockingConnection(*address, timeout=10.0)
    ids = []
    try:
        for i in range(count):
            dup_id = f"{prefix}-{i}"
            conn.send(destination, dup_id.encode(), {"persistent": "true", "dup-id": dup_id})
            ids.append(dup_id)
    finally:
        conn.close()
    return ids
