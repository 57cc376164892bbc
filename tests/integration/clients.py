"""stomp.py (a third-party client) wrapped for tests: every wait is bounded.

`Client` records everything the server sends; its `send`/`subscribe`/... helpers ask
for a receipt by default and wait for it, so a test knows the frame took effect
before it goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import stomp
from stomp.utils import Frame

from tests.integration.rawstomp import unique
from tests.support.waiting import WAIT

_CONNECTIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Collector(stomp.ConnectionListener):
    """Records every frame the server sends, and lets a test wait for them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.connected: Frame | None = None
        self.messages: list[Frame] = []
        self.receipts: list[str] = []
        self.errors: list[Frame] = []
        self.heartbeats: list[float] = []
        self.disconnected = False

    def _record(self, fn: Callable[[], None]) -> None:
        with self.cond:
            fn()
            self.cond.notify_all()

    def on_connected(self, frame: Frame) -> None:
        self._record(lambda: setattr(self, "connected", frame))

    def on_message(self, frame: Frame) -> None:
        self._record(lambda: self.messages.append(frame))

    def on_receipt(self, frame: Frame) -> None:
        self._record(lambda: self.receipts.append(frame.headers.get("receipt-id", "")))

    def on_error(self, frame: Frame) -> None:
        self._record(lambda: self.errors.append(frame))

    def on_heartbeat(self) -> None:
        self._record(lambda: self.heartbeats.append(time.monotonic()))

    def on_disconnected(self) -> None:
        self._record(lambda: setattr(self, "disconnected", True))

    def wait_for(self, predicate: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"timed out after {timeout}s waiting for {what or 'frames'}; "
                        f"messages={[m.body for m in self.messages]!r} "
                        f"errors={[(e.headers, e.body) for e in self.errors]!r}"
                    )
                self.cond.wait(min(remaining, 0.1))


class Client:
    """One stomp.py connection plus its Collector."""

    def __init__(
        self,
        address: tuple[str, int],
        version: str = "1.2",
        heartbeats: tuple[int, int] = (0, 0),
    ) -> None:
        cls = _CONNECTIONS[version]
        kwargs: dict[str, Any] = {"reconnect_attempts_max": 1, "timeout": WAIT}
        if version != "1.0":
            kwargs["heartbeats"] = heartbeats
        self.version = version
        self.conn = cls([address], **kwargs)
        self.listener = Collector()
        self.conn.set_listener("collector", self.listener)

    # -- connection --------------------------------------------------------------------------

    def connect(
        self,
        login: str | None = None,
        passcode: str | None = None,
        headers: dict[str, str] | None = None,
        expect_error: bool | None = False,
        timeout: float = WAIT,
    ) -> Frame | None:
        """CONNECT and wait for CONNECTED (or, with expect_error, for the ERROR; with
        expect_error=None, for either: the CONNECTED frame or None is returned)."""
        kwargs: dict[str, Any] = {"wait": False, "headers": dict(headers or {})}
        if self.version != "1.0":
            kwargs["with_connect_command"] = True
        self.conn.connect(login, passcode, **kwargs)
        listener = self.listener
        listener.wait_for(
            lambda: listener.connected or listener.errors or listener.disconnected,
            timeout,
            "CONNECTED or ERROR",
        )
        if expect_error is None:
            return listener.connected
        if expect_error:
            assert listener.connected is None, f"expected an ERROR, got {listener.connected}"
            return listener.wait_for(lambda: listener.errors and listener.errors[0], timeout)
        if listener.connected is None:
            raise AssertionError(
                f"connect failed: {[(e.headers, e.body) for e in listener.errors]!r}"
            )
        return listener.connected

    def disconnect(self) -> None:
        """A clean DISCONNECT with a receipt."""
        if self.conn.is_connected():
            self.conn.disconnect(receipt=unique("bye"))
        self.listener.wait_for(lambda: self.listener.disconnected, WAIT, "disconnect")

    def drop(self) -> None:
        """Close the socket without DISCONNECT, as a crashed client would."""
        self.conn.transport.disconnect_socket()
        self.listener.wait_for(lambda: self.listener.disconnected, WAIT, "socket closed")

    def close(self) -> None:
        """Best-effort cleanup for teardown."""
        try:
            if self.conn.is_connected():
                self.conn.transport.disconnect_socket()
        except Exception:
            pass

    # -- frames, each waiting for its receipt by default ------------------------------------

    def _receipted(self, receipt: bool, send: Callable[[dict[str, str]], None]) -> str | None:
        if not receipt:
            send({})
            return None
        rid = unique()
        send({"receipt": rid})
        self.wait_receipt(rid)
        return rid

    def wait_receipt(self, rid: str, timeout: float = WAIT) -> None:
        listener = self.listener

        def done() -> bool:
            if rid in listener.receipts:
                return True
            if listener.errors:
                raise AssertionError(
                    f"ERROR instead of receipt {rid}: "
                    f"{[(e.headers, e.body) for e in listener.errors]!r}"
                )
            return False

        listener.wait_for(done, timeout, f"receipt {rid}")

    def send(
        self, destination: str, body: str | bytes = "", receipt: bool = True, **headers: Any
    ) -> None:
        headers = {k.replace("_", "-"): str(v) for k, v in headers.items()}
        self._receipted(
            receipt,
            lambda extra: self.conn.send(destination, body, headers={**headers, **extra}),
        )

    def subscribe(
        self,
        destination: str,
        id: str | None = None,
        ack: str = "auto",
        receipt: bool = True,
        headers: dict[str, str] | None = None,
    ) -> str:
        sub_id = id or unique("sub")
        hdrs = dict(headers or {})

        def do(extra: dict[str, str]) -> None:
            if self.version == "1.0":
                self.conn.subscribe(destination, id=sub_id, ack=ack, headers={**hdrs, **extra})
            else:
                self.conn.subscribe(destination, sub_id, ack=ack, headers={**hdrs, **extra})

        self._receipted(receipt, do)
        return sub_id

    def unsubscribe(
        self, id: str, receipt: bool = True, headers: dict[str, str] | None = None
    ) -> None:
        hdrs = dict(headers or {})

        def do(extra: dict[str, str]) -> None:
            if self.version == "1.0":
                self.conn.unsubscribe(id=id, headers={**hdrs, **extra})
            else:
                self.conn.unsubscribe(id, headers={**hdrs, **extra})

        self._receipted(receipt, do)

    def _ack_args(self, message: Frame) -> tuple[Any, ...]:
        h = message.headers
        if self.version == "1.2":
            return (h["ack"],)
        if self.version == "1.1":
            return (h["message-id"], h["subscription"])
        return (h["message-id"],)

    def ack(self, message: Frame, transaction: str | None = None, receipt: bool = True) -> None:
        args = self._ack_args(message)
        self._receipted(
            receipt,
            lambda extra: self.conn.ack(
                *args, transaction=transaction, receipt=extra.get("receipt")
            ),
        )

    def nack(self, message: Frame, transaction: str | None = None, receipt: bool = True) -> None:
        args = self._ack_args(message)
        self._receipted(
            receipt,
            lambda extra: self.conn.nack(
                *args, transaction=transaction, receipt=extra.get("receipt")
            ),
        )

    def begin(self, transaction: str, receipt: bool = True) -> None:
        self._receipted(receipt, lambda extra: self.conn.begin(transaction, headers=extra))

    def commit(self, transaction: str, receipt: bool = True) -> None:
        self._receipted(receipt, lambda extra: self.conn.commit(transaction, headers=extra))

    def abort(self, transaction: str, receipt: bool = True) -> None:
        self._receipted(receipt, lambda extra: self.conn.abort(transaction, headers=extra))

    # -- what arrived --------------------------------------------------------------------------

    @property
    def messages(self) -> list[Frame]:
        return self.listener.messages

    @property
    def errors(self) -> list[Frame]:
        return self.listener.errors

    def bodies(self) -> list[str]:
        with self.listener.cond:
            return [m.body for m in self.listener.messages]

    def wait_messages(self, count: int, timeout: float = WAIT) -> list[Frame]:
        """Wait until at least `count` messages arrived; return the first `count`."""
        listener = self.listener
        listener.wait_for(lambda: len(listener.messages) >= count, timeout, f"{count} messages")
        with listener.cond:
            return list(listener.messages[:count])

    def wait_error(self, timeout: float = WAIT) -> Frame:
        listener = self.listener
        return listener.wait_for(lambda: listener.errors and listener.errors[0], timeout, "ERROR")

    def wait_body(self, body: str, timeout: float = WAIT) -> Frame:
        """Wait for the message with this body and return it."""
        listener = self.listener

        def find() -> Frame | None:
            for m in listener.messages:
                if m.body == body:
                    return m
            return None

        return listener.wait_for(find, timeout, f"message {body!r}")

    def sync(self) -> None:
        """A receipted round trip: anything the server sent before it has arrived."""
        self.send(f"/queue/{unique('sync')}", "sync")

    def bodies_up_to_marker(self, destination: str, marker: str = "after") -> list[str]:
        """Send `marker` to `destination`, which this client consumes, and wait for it: the
        bodies received by then, in order. A queue hands out what it held before the marker,
        so `["after"]` says it held nothing."""
        self.send(destination, marker)
        self.wait_body(marker)
        return self.bodies()

    def clear(self) -> None:
        with self.listener.cond:
            self.listener.messages.clear()


def fill(server: Any, stomp_client: Callable[..., Client], queue: str, count: int,
         prefix: str = "m") -> None:
    """`count` messages PREFIX0, PREFIX1, ... sent to `queue` by a producer of their own (the
    last one receipted, so all are there), which then disconnects."""
    producer = stomp_client(server)
    for i in range(count):
        producer.send(queue, f"{prefix}{i}", receipt=(i == count - 1))
    producer.disconnect()
