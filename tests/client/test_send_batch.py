"""`send_batch` (many messages in one `pairmq-batch` SEND, docs/clients.md) of the pairmq client
against a real server, blocking and asyncio: confirmed with one receipt, numbered by the
frame's producer stamp; bad batches refused before anything is sent; inside a transaction; through
the durable connection's outbox; and resent after the server restarted, each message kept
once."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pairmq.client
from pairmq.client import AsyncSubscription, ClientError, FailoverEvent, Outcome
from pairmq.protocol.batch import MAX_SEND_BATCH
from tests.integration.rawstomp import unique
from tests.netproxy import NetProxy
from tests.serverproc import ServerProcess, free_port
from tests.support.admin import admin_status, admin_user_flags
from tests.support.waiting import wait_until

WAIT = 20.0  # bound for anything that should happen promptly


def url(target: ServerProcess | str) -> str:
    address = f"{target.host}:{target.port}" if isinstance(target, ServerProcess) else target
    return f"failover:(stomp://{address})"


# ----------------------------------------------------------------------------- the clients


class _Loop:
    """An asyncio loop on its own thread, so that a test drives an AsyncClient with plain
    calls: each one runs on the loop and the test waits for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def on_the_loop() -> Any:
            return fn(*args, **kwargs)

        return self.run(on_the_loop())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class _Driven:
    """An AsyncClient (or AsyncSubscription) with the blocking client's call style."""

    def __init__(self, target: Any, loop: _Loop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if inspect.iscoroutinefunction(attr):
                value = self._loop.run(attr(*args, **kwargs))
            else:
                value = self._loop.call(attr, *args, **kwargs)
            return _Driven(value, self._loop) if isinstance(value, AsyncSubscription) else value

        return call


@pytest.fixture(params=["blocking", "asyncio"])
def connect(request) -> Iterator[Callable[..., Any]]:
    """`connect(url, **options)` -> a pairmq client, blocking or asyncio (driven through
    the same calls); closed at teardown. Retries fast, as tests/client/conftest.py's."""
    made: list[Any] = []
    loop = _Loop() if request.param == "asyncio" else None

    def factory(target: str, **options: Any) -> Any:
        options.setdefault("retry_interval", 50)
        options.setdefault("max_retry_interval", 500)
        if loop is None:
            client = pairmq.client.connect(target, **options)
        else:
            client = _Driven(loop.run(pairmq.client.connect_async(target, **options)), loop)
        made.append(client)
        return client

    yield factory
    for client in made:
        try:
            client.close(1.0)
        except Exception:
            pass
    if loop is not None:
        loop.close()


def until_marker(sub: Any, marker: bytes) -> list:
    """Every message up to and including the one whose body is `marker` (sent after
    everything else, so nothing sent before it can come after it)."""
    got = []
    while not got or got[-1].body != marker:
        message = sub.receive(10)
        assert message is not None, f"no {marker!r} after {[m.body for m in got]!r}"
        got.append(message)
    return got


def bodies(count: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(count)]


# ----------------------------------------------------------------------------- sending


def test_a_batch_of_100_is_confirmed_and_delivered_in_order_numbered_by_its_stamp(server,
                                                                                 connect):
    queue = f"/queue/{unique('cb')}"
    producer = connect(url(server))
    consumer = connect(url(server))
    sub = consumer.subscribe(queue, ack="auto")
    result = producer.send_batch(queue, bodies(100), headers={"color": "blue"})
    assert result.outcome is Outcome.CONFIRMED
    assert result.dup_id is None and result.dup_ids == ()  # the application gave none
    assert result.stamp is not None and result.stamp.seq == 0
    marker = producer.send(queue, b"marker")
    assert marker.stamp == result.stamp._replace(seq=100), "the batch took numbers 0 to 99"
    got = until_marker(sub, b"marker")
    assert [m.body for m in got] == [*bodies(100), b"marker"]
    for m in got[:-1]:
        assert m.dup_id is None
        assert m.headers["color"] == "blue" and m.destination == queue
        assert "pairmq-batch" not in m.headers


def test_items_may_be_bytes_str_or_a_body_with_its_own_headers(server, connect):
    queue = f"/queue/{unique('cbitems')}"
    producer = connect(url(server))
    items = [b"plain bytes",
             "a str, d\u00e9j\u00e0 vu",
             (b"bytes with headers", {"color": "red", "n": "2"}),
             ("str with its own dup-id", {"dup-id": "app-chosen"}),
             (b"headers None", None)]
    result = producer.send_batch(queue, items, headers={"color": "frame", "shared": "yes"})
    assert result.outcome is Outcome.CONFIRMED
    assert result.dup_ids == ("app-chosen",)
    producer.send(queue, b"marker")
    got = until_marker(connect(url(server)).subscribe(queue, ack="auto"), b"marker")[:-1]
    assert [m.body for m in got] == [b"plain bytes", "a str, d\u00e9j\u00e0 vu".encode(),
                                     b"bytes with headers", b"str with its own dup-id",
                                     b"headers None"]
    assert [m.headers["color"] for m in got] == ["frame", "frame", "red", "frame", "frame"]
    assert got[2].headers["n"] == "2" and all(m.headers["shared"] == "yes" for m in got)
    assert [m.dup_id for m in got] == [None, None, None, "app-chosen", None]


def test_a_batch_the_client_cannot_send_raises_and_sends_nothing(server, connect):
    queue = f"/queue/{unique('cbbad')}"
    producer = connect(url(server))
    refused: list[tuple[str, list, dict[str, str] | None, str]] = [
        ("empty", [], None, "1 to"),
        ("empty generator", (b for b in ()), None, "1 to"),
        ("one too many", [b"x"] * (MAX_SEND_BATCH + 1), None, str(MAX_SEND_BATCH)),
        ("a dup-id for the whole batch", [b"a", b"b"], {"dup-id": "whole"}, "dup-id"),
        ("a message naming its destination", [b"a", (b"b", {"destination": "/queue/x"})],
         None, "destination"),
        ("a message asking for a receipt", [(b"a", {"receipt": "r1"}), b"b"], None,
         "receipt"),
    ]
    for case, items, headers, words in refused:
        with pytest.raises(ClientError, match=words):
            producer.send_batch(queue, items, headers=headers)
        assert producer.connected, case
    most = producer.send_batch(queue, [b"x"] * MAX_SEND_BATCH, persistent=False)
    assert most.outcome is Outcome.SENT and most.dup_ids == ()  # the limit itself is fine
    producer.send(queue, b"marker")
    got = until_marker(connect(url(server)).subscribe(queue, ack="auto"), b"marker")
    assert len(got) == MAX_SEND_BATCH + 1 and {m.body for m in got[:-1]} == {b"x"}
    assert producer.stats()["unconfirmed"] == 0


def test_a_batch_in_a_transaction_is_delivered_at_commit_and_never_after_abort(server,
                                                                               connect):
    queue = f"/queue/{unique('cbtx')}"
    producer = connect(url(server))
    consumer = connect(url(server))
    sub = consumer.subscribe(queue, ack="auto")

    producer.begin()
    result = producer.send_batch(queue, bodies(20))
    assert result.outcome is Outcome.PENDING and result.transaction
    producer.subscribe(f"/queue/{unique('roundtrip')}")  # the server has read the batch
    consumer.send(queue, b"before commit")
    assert [m.body for m in until_marker(sub, b"before commit")] == [b"before commit"]
    producer.commit()
    assert result.outcome is Outcome.CONFIRMED
    consumer.send(queue, b"after commit")
    got = until_marker(sub, b"after commit")
    assert [m.body for m in got] == [*bodies(20), b"after commit"]
    assert [m.dup_id for m in got[:-1]] == list(result.dup_ids)

    producer.begin()
    aborted = producer.send_batch(queue, bodies(20, prefix="aborted"))
    producer.abort()
    assert aborted.outcome is Outcome.ROLLED_BACK
    consumer.send(queue, b"after abort")
    assert [m.body for m in until_marker(sub, b"after abort")] == [b"after abort"]


# ----------------------------------------------------------------------------- outbox


def test_a_batch_in_the_outbox_is_one_entry_kept_across_a_client_restart_and_sent_once(
        tmp_path, server_factory, connect):
    """No server yet: each batch goes to the outbox as one entry. The application stops
    and starts again on the same outbox, adds a batch; a server comes: both are forwarded,
    in order, each message once."""
    port = free_port()
    outbox = str(tmp_path / "outbox.db")
    queue = f"/queue/{unique('cbout')}"
    first = connect(url(f"127.0.0.1:{port}"), outbox=outbox, connection_ttl=0)
    one = first.send_batch(queue, bodies(100, prefix="one-"))
    assert one.outcome is Outcome.STORED
    assert first.stats()["outbox"]["depth"] == 1
    first.close(0.5)

    second = connect(url(f"127.0.0.1:{port}"), outbox=outbox, connection_ttl=0)
    two = second.send_batch(queue, bodies(100, prefix="two-"),
                            headers={"x-app": "second"})
    assert two.outcome is Outcome.STORED
    assert second.stats()["outbox"]["depth"] == 2

    srv = server_factory(port=port)
    second.flush(WAIT)
    assert two.outcome is Outcome.CONFIRMED
    wait_until(lambda: second.stats()["outbox"]["depth"] == 0, "an empty outbox", WAIT)
    second.send(queue, b"marker")
    got = until_marker(connect(url(srv)).subscribe(queue, ack="auto"), b"marker")[:-1]
    assert [m.body for m in got] == [*bodies(100, prefix="one-"), *bodies(100, prefix="two-")]
    assert one.stamp.producer != two.stamp.producer, "each client instance is a producer"
    assert [m.headers.get("x-app") for m in got] == [None] * 100 + ["second"] * 100


# ----------------------------------------------------------------------------- resending


def test_batches_resent_after_a_server_restart_arrive_exactly_once(server_factory, connect):
    """Batches written while the server's answers are cut off are stored but never
    confirmed; the server is killed and started again on its data: the client resends
    every one of those frames, and the server keeps each message once, by its stamp."""
    admin = f"127.0.0.1:{free_port()}"
    flags = ("--admin", admin, *admin_user_flags())
    srv = server_factory(*flags, name="restarted")
    queue = f"/queue/{unique('cbresend')}"
    events: list[FailoverEvent] = []
    with NetProxy(f"{srv.host}:{srv.port}") as proxy:
        producer = connect(url(proxy.address), connection_ttl=0, send_window=50,
                           failover_listener=events.append)
        results = [producer.send_batch(queue, bodies(50, prefix="f0-"))]
        proxy.cut("down")  # the SENDs still go up; the RECEIPTs are lost
        in_flight = [producer.send_batch_async(queue, bodies(50, prefix=f"f{i}-"))
                     for i in range(1, 6)]
        results += in_flight

        def all_on_disk() -> bool:
            status = admin_status(admin) or {}
            held = status.get("destinations", {}).get(queue, {}).get("messages")
            journal = status.get("journal", {})
            return held == 300 and journal["synced_seq"] == journal["appended_seq"]

        wait_until(all_on_disk, "the server to hold every batch on disk", WAIT)
        assert [r.outcome for r in in_flight] == [Outcome.PENDING] * 5
        srv.kill()
        srv = server_factory(*flags, name="restarted", port=srv.port)
        proxy.heal(drop=True)  # the client sees its connection close, and reconnects
        wait_until(lambda: events, "the client to fail over", WAIT)
        results += [producer.send_batch_async(queue, bodies(50, prefix=f"f{i}-"))
                    for i in range(6, 8)]
        producer.flush(WAIT)
        assert [r.outcome for r in results] == [Outcome.CONFIRMED] * 8
        (event,) = events
        assert not event.resumed, "a restarted server holds no session"
        assert event.resent == 5, "every unconfirmed batch frame is sent again"
        producer.close(5.0)

    consumer = connect(url(srv))
    consumer.send(queue, b"marker")
    got = until_marker(consumer.subscribe(queue, ack="auto"), b"marker")[:-1]
    expected = [b for i in range(8) for b in bodies(50, f"f{i}-")]
    counts = Counter(m.body for m in got)
    assert [d for d, n in counts.items() if n > 1] == [], "delivered twice"
    assert [d for d in expected if d not in counts] == [], "lost"
    assert [m.body for m in got] == expected, "in the order first sent"


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "fresh-session"])
def test_a_batch_whose_receipt_was_lost_in_a_blip_is_settled_and_kept_once(
        server, proxy, connect, resume):
    """The batch reaches the server, its RECEIPT is lost with the connection. Resumed
    (connection-ttl), the session's frames count it as done; on a fresh session the
    client sends it again and the server drops every message of it as a duplicate."""
    queue = f"/queue/{unique('cbblip')}"
    events: list[FailoverEvent] = []
    producer = connect(url(proxy.address), connection_ttl=10000 if resume else 0,
                       failover_listener=events.append)
    consumer = connect(url(server))
    sub = consumer.subscribe(queue, ack="auto")
    producer.send_batch(queue, bodies(10, prefix="warm-"))
    proxy.arm("down")  # the next bytes go up; every answer after them is lost
    lost = producer.send_batch_async(queue, bodies(50))
    got = [sub.receive(10) for _ in range(60)]  # the server has the whole batch
    assert [m.body for m in got if m is not None] == [*bodies(10, prefix="warm-"),
                                                      *bodies(50)]
    assert lost.outcome is Outcome.PENDING
    proxy.heal(drop=True)
    producer.flush(WAIT)
    assert lost.outcome is Outcome.CONFIRMED
    wait_until(lambda: events, "the client to reconnect", WAIT)
    (event,) = events
    assert event.resumed is resume
    assert event.resent == (0 if resume else 1)
    producer.send(queue, b"marker")
    assert [m.body for m in until_marker(sub, b"marker")] == [b"marker"], "sent twice"
