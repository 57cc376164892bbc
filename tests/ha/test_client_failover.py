"""The pairmq client through real failovers of a real pair (kill -9 of the active server):
an application that sends and consumes all along sees no error but the documented ones,
and consumes exactly what was sent."""

from __future__ import annotations

import collections
import signal
import threading
import time

import pytest

import pairmq.client
from pairmq.client import (
    AckFailed,
    Client,
    EventKind,
    FailoverEvent,
    Outcome,
    TransactionRolledBack,
)
from tests.ha.pair import NAMES, Pair

CYCLES = 10  # each: a failover (kill -9 of the active) and a failback (the primary back)


def pair_url(pair: Pair) -> str:
    servers = ",".join(f"stomp://{pair.stomp_address(n)}" for n in NAMES)
    return f"failover:({servers})?retryInterval=50&maxRetryInterval=200"


class Application:
    """A producer thread and a consumer thread, as an application would write them."""

    def __init__(self, url: str, queue: str) -> None:
        self.events: list[FailoverEvent] = []
        self.producer = pairmq.client.connect(url, failover_listener=self.events.append)
        self.consumer = pairmq.client.connect(url, failover_listener=self.events.append)
        self.sub = self.consumer.subscribe(queue, headers={"prefetch-count": "50"})
        self.queue = queue
        self.sent: list[str] = []
        self.consumed: collections.Counter[str] = collections.Counter()
        self.ack_failed = 0
        self.errors: list[BaseException] = []  # anything undocumented
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce),
                        threading.Thread(target=self._consume)]

    def start(self) -> Application:
        for thread in self.threads:
            thread.start()
        return self

    def _produce(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                body = f"m-{n}"
                result = self.producer.send(self.queue, body)
                assert result.outcome is Outcome.CONFIRMED
                self.sent.append(body)
                n += 1
        except BaseException as e:
            self.errors.append(e)

    def _consume(self) -> None:
        try:
            while True:
                message = self.sub.receive(1.0)
                if message is None:
                    if self.stop.is_set() and set(self.sent) <= set(self.consumed):
                        return
                    continue
                try:
                    self.consumer.ack(message)
                except AckFailed:
                    self.ack_failed += 1  # documented: it comes again, redelivered
                    continue
                self.consumed[message.text] += 1
        except BaseException as e:
            self.errors.append(e)

    def finish(self, timeout: float = 60.0) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)
        assert not any(t.is_alive() for t in self.threads), \
            f"the application did not finish: sent {len(self.sent)}, consumed " \
            f"{len(self.consumed)}, missing {sorted(set(self.sent) - set(self.consumed))[:5]}"

    def close(self) -> None:
        self.stop.set()
        self.producer.close(timeout=2)
        self.consumer.close(timeout=2)


@pytest.mark.long
def test_ten_failovers_and_failbacks_nothing_lost_nothing_doubled(pair: Pair) -> None:
    app = Application(pair_url(pair), "/queue/campaign").start()
    try:
        for cycle in range(CYCLES):
            before = len(app.sent)
            deadline = time.monotonic() + 20
            while len(app.sent) < before + 200 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not app.errors, app.errors
            pair.kill("primary")
            pair.wait_active(15, "backup")
            pair.start_server("primary")
            pair.wait_formed(30)  # failback: the primary is ACTIVE again
            assert not app.errors, f"cycle {cycle}: {app.errors}"
        app.finish()
    finally:
        app.close()
    assert not app.errors, app.errors
    duplicates = {body: n for body, n in app.consumed.items() if n > 1}
    assert not duplicates, f"consumed twice: {list(duplicates)[:10]}"
    missing = set(app.sent) - set(app.consumed)
    assert not missing, f"{len(missing)} confirmed messages never consumed: {sorted(missing)[:10]}"
    assert set(app.consumed) == set(app.sent)
    failovers = [e for e in app.events if e.kind is EventKind.FAILOVER]
    # each client saw each failover and each failback (a failback may count twice: the
    # active hands over, and a client that reconnected to it meanwhile goes again)
    assert len(failovers) >= 4 * CYCLES
    assert {e.new_server for e in failovers} == {pair.stomp_address(n) for n in NAMES}
    assert len(app.sent) > CYCLES * 200


def test_a_transaction_open_across_a_failover_is_rolled_back_and_done_again(
        pair: Pair) -> None:
    url = pair_url(pair)
    with pairmq.client.connect(url) as client:
        client.send("/queue/tx-in", b"request")
        sub = client.subscribe("/queue/tx-in")
        request = sub.receive(5)
        client.begin()
        client.send("/queue/tx-out", b"reply", headers={"dup-id": "reply-1"})
        client.ack(request)
        pair.kill("primary")
        pair.wait_active(15, "backup")
        with pytest.raises(TransactionRolledBack):
            client.commit()
        again = sub.receive(10)  # the request comes again: its ack was rolled back
        assert again.body == b"request" and again.redelivered
        with client.transaction():
            client.send("/queue/tx-out", b"reply", headers={"dup-id": "reply-1"})
            client.ack(again)
        out = client.subscribe("/queue/tx-out")
        replies = []
        while (message := out.receive(1)) is not None:
            replies.append(message.body)
            client.ack(message)
        assert replies == [b"reply"]
        assert sub.receive(0.5) is None


def test_the_listener_hears_each_failover_with_the_old_and_the_new_server(pair: Pair) -> None:
    events: list[FailoverEvent] = []
    client: Client = pairmq.client.connect(pair_url(pair), failover_listener=events.append)
    try:
        assert client.server == pair.stomp_address("primary")
        pair.kill("primary")
        pair.wait_active(15, "backup")
        client.send("/queue/listen", b"x")
        (event,) = events
        assert event.kind is EventKind.FAILOVER
        assert event.old_server == pair.stomp_address("primary")
        assert event.new_server == pair.stomp_address("backup") == client.server
        assert "closed" in event.reason and not event.resumed
        assert 0 < event.seconds < 10
    finally:
        client.close()


def test_pairmq_send_and_receive_find_the_active_server_from_a_failover_url(
        pair: Pair) -> None:
    backup_first = f"failover:(stomp://{pair.stomp_address('backup')}," \
                   f"stomp://{pair.stomp_address('primary')})"
    sent = pair.cli("send", "-s", backup_first, "/queue/cli", "hello")
    assert sent.returncode == 0, sent.stderr
    assert f"confirmed by {pair.stomp_address('primary')}" in sent.stdout
    got = pair.cli("receive", "-s", pair.stomp_address("backup"), "/queue/cli")
    assert got.returncode == 0, got.stderr  # the PASSIVE backup's refusal named the primary
    assert got.stdout.strip() == "hello"


def test_a_frozen_active_is_left_when_its_heart_beats_stop(pair_factory) -> None:
    """SIGSTOP: the server's sockets stay open, only heart-beats tell it is gone."""
    pair = pair_factory(flags=["--heartbeat-ms", "200"])
    pair.start(parallel=True)
    pair.wait_formed()
    events: list[FailoverEvent] = []
    client = pairmq.client.connect(pair_url(pair), client_failure_check_period=1000,
                                   connect_timeout=1000, failover_listener=events.append)
    primary = pair.servers["primary"]
    assert primary is not None
    try:
        client.send("/queue/frozen", b"before")
        primary.proc.send_signal(signal.SIGSTOP)
        result = client.send("/queue/frozen", b"after")  # rides through the failover
        assert result.outcome is Outcome.CONFIRMED
        (event,) = events
        assert "heart-beats missed" in event.reason
        assert event.new_server == pair.stomp_address("backup") == client.server
        sub = client.subscribe("/queue/frozen")
        bodies = [sub.receive(5).body, sub.receive(5).body]
        assert bodies == [b"before", b"after"]
    finally:
        primary.proc.send_signal(signal.SIGCONT)
        client.close(timeout=2)


def test_a_temporary_queue_is_created_again_on_the_new_server(pair: Pair) -> None:
    with pairmq.client.connect(pair_url(pair)) as client:
        replies = client.subscribe("/temp-queue/replies")
        client.send("/temp-queue/replies", b"one")
        assert replies.receive(5).body == b"one"
        pair.kill("primary")
        pair.wait_active(15, "backup")
        client.send("/temp-queue/replies", b"two")
        message = replies.receive(5)
        assert message is not None and message.body == b"two"
        client.ack(message)


def test_the_asyncio_client_fails_over_too(pair: Pair) -> None:
    import asyncio

    async def main() -> tuple[list[str], list[FailoverEvent], list[bytes]]:
        events: list[FailoverEvent] = []
        async with await pairmq.client.connect_async(
                pair_url(pair), failover_listener=events.append) as client:
            sent = []
            for n in range(400):
                if n == 200:
                    pair.kill("primary")  # the sends after it wait for the backup
                result = await client.send("/queue/aio-failover", f"m-{n}")
                assert result.outcome is Outcome.CONFIRMED
                sent.append(f"m-{n}")
            sub = await client.subscribe("/queue/aio-failover")
            bodies = []
            while (message := await sub.receive(1)) is not None:
                bodies.append(message.body)
                await client.ack(message)
            return sent, events, bodies

    sent, events, bodies = asyncio.run(main())
    assert [b.decode() for b in bodies] == sent
    assert [e.new_server for e in events] == [pair.stomp_address("backup")]


def test_a_selective_consumer_keeps_its_selector_through_a_failover(pair: Pair) -> None:
    """A consumer with a selector, some of its matches delivered and not acknowledged when
    the active is killed: on the backup it is subscribed again with its selector (the
    client re-creates the subscription), gets each of its matches once acknowledged, and
    nothing it does not match; what it does not match waits there for a plain consumer."""
    url = pair_url(pair)
    with pairmq.client.connect(url) as producer, pairmq.client.connect(url) as reds:
        sub = reds.subscribe("/queue/picky", headers={"selector": "color = 'red'",
                                                       "prefetch-count": "4"})
        for i in range(20):
            producer.send("/queue/picky", f"m-{i}",
                          headers={"color": "red" if i % 2 == 0 else "blue"})
        acked: list[str] = []
        for _ in range(3):
            message = sub.receive(5)
            assert message is not None
            reds.ack(message)
            acked.append(message.body.decode())
        held = sub.receive(5)  # delivered, not acknowledged, when the active dies
        assert held is not None and held.headers["color"] == "red"
        pair.kill("primary")
        pair.wait_active(15, "backup")
        for i in range(20, 30):
            producer.send("/queue/picky", f"m-{i}",
                          headers={"color": "red" if i % 2 == 0 else "blue"})
        while (message := sub.receive(2)) is not None:
            assert message.headers["color"] == "red", message.headers
            try:
                reds.ack(message)
            except AckFailed:
                continue  # delivered before the failover: it comes again
            acked.append(message.body.decode())
        assert sorted(acked) == sorted(f"m-{i}" for i in range(0, 30, 2))
        with pairmq.client.connect(url) as plain:
            rest = plain.subscribe("/queue/picky")
            blues = []
            while (message := rest.receive(2)) is not None:
                plain.ack(message)
                blues.append(message.body.decode())
        assert sorted(blues) == sorted(f"m-{i}" for i in range(1, 30, 2))
