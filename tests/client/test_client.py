"""The pairmq client against a real server process: the API, interoperation with stomp.py,
transactions, and what a blocked call does when the server goes away."""

from __future__ import annotations

import threading
import time

import pytest

import pairmq.client
from pairmq.client import (
    AckFailed,
    ClientClosed,
    ClientError,
    ConnectionFailed,
    EventKind,
    FailoverError,
    Outcome,
    ServerError,
)
from tests.netproxy import NetProxy
from tests.serverproc import ServerProcess, free_port, start_server


def url(server: ServerProcess) -> str:
    return f"failover:(stomp://{server.host}:{server.port})"


def drain(client, destination: str, idle: float = 0.5) -> list[bytes]:
    sub = client.subscribe(destination)
    bodies = []
    while (message := sub.receive(idle)) is not None:
        bodies.append(message.body)
        client.ack(message)
    sub.unsubscribe()
    return bodies


def test_send_receive_ack_and_what_a_message_says(server, client_factory):
    client = client_factory(url(server))
    assert client.connected and client.server == f"{server.host}:{server.port}"
    result = client.send("/queue/api", b"hello", headers={"color": "red"})
    assert result.outcome is Outcome.CONFIRMED and result.stamp is not None
    assert result.dup_id is None  # the stamp names it; dup-ids are the application's
    sub = client.subscribe("/queue/api")
    message = sub.receive(5)
    assert message.body == b"hello" and message.text == "hello"
    assert message.headers["color"] == "red"
    assert message.dup_id is None
    assert not any(name.startswith("pairmq-") for name in message.headers), \
        "the stamp is the server's business, not the consumer's"
    assert message.destination == "/queue/api" and message.message_id
    assert not message.redelivered
    client.ack(message)
    assert sub.receive(0.3) is None


def test_stomp_py_and_the_pairmq_client_talk_to_each_other(server, client_factory,
                                                           stomp_client):
    ours = client_factory(url(server))
    theirs = stomp_client(server)
    theirs.subscribe("/queue/from-pairmq", ack="client-individual")
    ours.send("/queue/from-pairmq", b"to stomp.py", headers={"dup-id": "app-1"})
    got = theirs.wait_messages(1)[0]
    assert got.body == "to stomp.py" and got.headers["dup-id"] == "app-1"
    theirs.send("/queue/from-stomp-py", "to pairmq", persistent="true")
    assert drain(ours, "/queue/from-stomp-py") == [b"to pairmq"]


def test_pipelined_sends_are_all_confirmed_once_in_order(server, client_factory):
    client = client_factory(url(server), send_window=100)
    results = [client.send_async("/queue/pipe", b"%d" % i) for i in range(2000)]
    client.flush()
    assert {r.outcome for r in results} == {Outcome.CONFIRMED}
    assert drain(client, "/queue/pipe") == [b"%d" % i for i in range(2000)]


def test_transactions_commit_together_and_abort_gives_messages_back(server, client_factory):
    client = client_factory(url(server))
    with client.transaction():
        one = client.send("/queue/tx", b"1")
        client.send("/queue/tx", b"2")
        assert one.outcome is Outcome.PENDING  # the COMMIT confirms it
    assert one.outcome is Outcome.CONFIRMED
    client.begin()
    aborted = client.send("/queue/tx", b"never")
    client.abort()
    assert aborted.outcome is Outcome.ROLLED_BACK
    sub = client.subscribe("/queue/tx")
    first = sub.receive(5)
    client.begin()
    client.ack(first)
    client.abort()  # the ack is undone: the message comes again
    rest = []
    while (message := sub.receive(1)) is not None:
        rest.append((message.body, message.redelivered))
        client.ack(message)
    assert first.body == b"1"
    assert sorted(rest) == [(b"1", True), (b"2", False)]


def consume_with_small_prefetch_blocking(server, client_factory, destination: str
                                        ) -> list[bytes]:
    client = client_factory(url(server))
    sub = client.subscribe(destination, headers={"prefetch-count": "3"})
    bodies = []
    while len(bodies) < 300 and (message := sub.receive(5)) is not None:
        bodies.append(message.body)
        client.ack(message)
    return bodies


def consume_with_small_prefetch_asyncio(server, client_factory, destination: str
                                        ) -> list[bytes]:
    import asyncio

    async def main() -> list[bytes]:
        async with await pairmq.client.connect_async(url(server)) as client:
            sub = await client.subscribe(destination, headers={"prefetch-count": "3"})
            bodies = []
            while len(bodies) < 300 and (message := await sub.receive(5)) is not None:
                bodies.append(message.body)
                await client.ack(message)
            return bodies

    return asyncio.run(main())


@pytest.mark.parametrize("consume", [consume_with_small_prefetch_blocking,
                                     consume_with_small_prefetch_asyncio],
                         ids=["blocking", "asyncio"])
def test_a_consumer_with_a_small_prefetch_acks_without_stalling(server, client_factory,
                                                                consume):
    """Once its prefetch is used up the server sends nothing until an ACK arrives: the
    client must write that ACK at once, not wait for an answer the server does not owe.
    (Each such wait lasted up to a second: 100 of them here, 10-20 s in all, where
    the whole takes well under a second.)"""
    producer = client_factory(url(server), send_window=300)
    for i in range(300):
        producer.send_async("/queue/small-prefetch", b"%d" % i)
    producer.flush()
    started = time.monotonic()
    bodies = consume(server, client_factory, "/queue/small-prefetch")
    assert bodies == [b"%d" % i for i in range(300)]
    assert time.monotonic() - started < 5, "acks waited for answers never owed"


def test_nack_gives_the_message_back(server, client_factory):
    client = client_factory(url(server))
    client.send("/queue/nack", b"x")
    sub = client.subscribe("/queue/nack")
    message = sub.receive(5)
    client.nack(message)
    again = sub.receive(5)
    assert again.body == b"x" and again.redelivered
    client.ack(again)


def test_a_refused_operation_raises_the_servers_error_and_the_client_goes_on(
        server, client_factory):
    client = client_factory(url(server))
    for _ in range(10):  # however soon the ERROR comes (before send() looks, or after)
        with pytest.raises(ServerError, match="priority"):
            client.send("/queue/bad", b"x", headers={"priority": "high"})
        client.send("/queue/bad", b"fine")  # the client reconnected by itself
    assert drain(client, "/queue/bad") == [b"fine"] * 10


def test_a_message_too_large_for_the_server_raises_at_once_and_is_not_sent_again(
        server_factory, client_factory):
    """The server refuses the frame and closes the connection: its ERROR names the frame
    (receipt-id), so the client fails that send instead of resending it after every
    reconnection, and goes on with the next."""
    small = server_factory("--max-frame-bytes", str(64 * 1024))
    client = client_factory(url(small))
    with pytest.raises(ServerError, match="frame too large: more than 65536 bytes"):
        client.send("/queue/big", b"x" * (100 * 1024), timeout=10)
    with pytest.raises(ServerError, match="frame too large"):
        client.send_batch("/queue/big", [b"y" * 1024] * 100, timeout=10)
    client.send("/queue/big", b"fine")
    assert client.stats()["resent"] == 0
    assert drain(client, "/queue/big") == [b"fine"]


def test_connect_names_every_server_tried_when_none_answers():
    ports = [free_port(), free_port()]
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        pairmq.client.connect(f"failover:(stomp://127.0.0.1:{ports[0]},"
                              f"stomp://127.0.0.1:{ports[1]})?initialConnectAttempts=2"
                              "&retryInterval=50")
    text = str(caught.value)
    assert all(f"127.0.0.1:{p}" in text for p in ports)
    assert time.monotonic() - started < 5


def test_a_wrong_password_fails_at_once_and_says_so(server_factory):
    secured = server_factory("--no-allow-anonymous", "--user", "app:right", anonymous=False)
    with pytest.raises(ConnectionFailed, match="authentication failed"):
        pairmq.client.connect(url(secured), login="app", passcode="wrong",
                              initial_connect_attempts=-1)
    client = pairmq.client.connect(url(secured), login="app", passcode="right")
    client.close()


def test_a_restarted_server_the_client_reconnects_resends_and_tells_the_listener(
        tmp_path, client_factory):
    srv = start_server(tmp_path, name="one")
    events = []
    try:
        producer = client_factory(url(srv), connection_ttl=0)
        producer.add_failover_listener(events.append)
        consumer = client_factory(url(srv), connection_ttl=0)
        back = threading.Event()
        consumer.add_failover_listener(lambda event: back.set())
        sub = consumer.subscribe("/queue/restart")
        producer.send("/queue/restart", b"before")
        before = sub.receive(5)
        srv.kill()
        srv = start_server(tmp_path, name="one", port=srv.port)
        assert back.wait(10)
        # the message received before the failure went back to its queue on the server
        with pytest.raises(AckFailed, match="deliver it again"):
            consumer.ack(before)
        producer.send("/queue/restart", b"after")
        bodies = []
        while (message := sub.receive(3)) is not None:
            bodies.append((message.body, message.redelivered))
            consumer.ack(message)
        assert bodies == [(b"before", True), (b"after", False)]
        (event,) = [e for e in events if e.kind is EventKind.FAILOVER]
        assert event.old_server == event.new_server == f"{srv.host}:{srv.port}"
        assert not event.resumed and event.seconds < 30
    finally:
        srv.stop()


def test_a_call_blocked_by_a_long_failover_raises_and_its_outcome_settles_later(
        tmp_path, client_factory):
    srv = start_server(tmp_path, name="one")
    try:
        client = client_factory(url(srv), call_failover_timeout=1000, connection_ttl=0)
        client.send("/queue/blocked", b"first")
        srv.kill()
        started = time.monotonic()
        with pytest.raises(FailoverError) as caught:
            client.send("/queue/blocked", b"second")
        assert 0.9 < time.monotonic() - started < 5
        assert caught.value.outcome is Outcome.UNKNOWN
        (result,) = [r for r in client._engine.unconfirmed.values()]  # still owed
        srv = start_server(tmp_path, name="one", port=srv.port)
        assert result.wait(10) is Outcome.CONFIRMED  # resent with its dup-id
        assert drain(client, "/queue/blocked") == [b"first", b"second"]
    finally:
        srv.stop()


def test_the_client_gives_up_after_its_attempts_and_blocked_calls_raise(tmp_path):
    srv = start_server(tmp_path, name="one")
    events = []
    client = pairmq.client.connect(url(srv), reconnect_attempts=2, retry_interval=50,
                                   connection_ttl=0, failover_listener=events.append)
    sub = client.subscribe("/queue/gone")
    errors = []

    def receive() -> None:
        try:
            sub.receive()
        except ClientClosed as e:
            errors.append(e)

    waiter = threading.Thread(target=receive)
    waiter.start()
    srv.kill()
    waiter.join(10)
    assert not waiter.is_alive() and errors, "receive() stayed blocked after the client gave up"
    assert [e.kind for e in events] == [EventKind.DISCONNECT]
    assert events[0].old_server == f"{srv.host}:{srv.port}" and events[0].new_server is None
    with pytest.raises(ClientClosed, match="gave up"):
        client.send("/queue/gone", b"x")
    client.close()


def test_asyncio_client_does_the_same(server):
    import asyncio

    async def main() -> list[bytes]:
        async with await pairmq.client.connect_async(url(server)) as client:
            result = await client.send("/queue/aio", b"a")
            assert result.outcome is Outcome.CONFIRMED
            results = [await client.send_async("/queue/aio", b"%d" % i) for i in range(100)]
            await client.flush()
            assert {r.outcome for r in results} == {Outcome.CONFIRMED}
            async with client.transaction():
                await client.send("/queue/aio", b"tx")
            sub = await client.subscribe("/queue/aio")
            bodies = []
            while (message := await sub.receive(0.5)) is not None:
                bodies.append(message.body)
                await client.ack(message)
            return bodies

    bodies = asyncio.run(main())
    assert bodies == [b"a", *(b"%d" % i for i in range(100)), b"tx"]


def test_the_applications_dup_ids_in_flight_are_refused_past_the_servers_cache(
        server_factory, client_factory):
    """CONNECTED says the server remembers 5 dup-ids per destination: a sixth of the
    application's own in flight to one queue could be forgotten before its resend, so the
    client refuses it, naming both numbers. The client's own stamps count for nothing."""
    srv = server_factory("--dup-cache-size", "5")
    with NetProxy(f"{srv.host}:{srv.port}") as proxy:
        client = client_factory(f"failover:(stomp://{proxy.address})", send_window=100)
        proxy.cut("down")  # receipts lost: everything stays in flight
        for i in range(5):
            client.send_async("/queue/own", b"x", headers={"dup-id": f"own-{i}"})
        for _ in range(20):
            client.send_async("/queue/own", b"stamped")
        client.send_batch_async("/queue/other", [(b"y", {"dup-id": f"b-{i}"})
                                                 for i in range(5)])
        with pytest.raises(ClientError, match=r"6 messages with the application's own "
                                              r"dup-ids would be unconfirmed.*\(5 per"):
            client.send_async("/queue/own", b"x", headers={"dup-id": "own-5"})
        with pytest.raises(ClientError, match="6 messages"):
            client.send_batch_async("/queue/other", [(b"y", {"dup-id": "b-5"})])
        proxy.heal(drop=True)
        client.flush(10)
        client.send_async("/queue/own", b"x", headers={"dup-id": "own-5"})  # room again
        client.flush(10)
