"""A short blip to the same server: the session the server kept (connection-ttl) is resumed.

The link runs through a real TCP proxy (tests/netproxy.py) that loses a frame's answer or
drops the connection, while the server process stays up; raw STOMP shows what the server
does with a parked session."""

from __future__ import annotations

import threading
import time

from pairmq.client import Outcome
from tests.integration import rawstomp
from tests.netproxy import NetProxy


def url_of(proxy: NetProxy) -> str:
    return f"failover:(stomp://{proxy.address})"


def blip(proxy: NetProxy) -> None:
    """The next bytes the client writes reach the server, the answer is lost, and the
    connection dies (both ends see it closed)."""
    proxy.arm("down")


def cut_now(proxy: NetProxy) -> None:
    proxy.cut()
    proxy.heal(drop=True)


def wait_failover(events: list, count: int = 1, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(events) >= count, f"no failover within {timeout} s"


def test_a_send_whose_receipt_was_lost_is_confirmed_by_the_resume_not_sent_again(
        proxy, client_factory):
    events = []
    client = client_factory(url_of(proxy), failover_listener=events.append)
    client.send("/queue/blip", b"warm-up")
    blip(proxy)
    result = client.send_async("/queue/blip", b"the one")
    time.sleep(0.3)  # the SEND went up, its RECEIPT into the void
    proxy.heal(drop=True)
    assert result.wait(10) is Outcome.CONFIRMED
    wait_failover(events)  # listeners are told after the waiters wake
    (event,) = events
    assert event.resumed and event.resent == 0
    assert event.old_server == event.new_server == proxy.address


def test_messages_received_before_the_blip_can_still_be_acked_and_lost_ones_come_again(
        server, proxy, client_factory):
    events = []
    client = client_factory(url_of(proxy), failover_listener=events.append)
    sub = client.subscribe("/queue/held", headers={"prefetch-count": "10"})
    producer = client_factory(f"failover:(stomp://{server.host}:{server.port})")
    for i in range(3):
        producer.send("/queue/held", b"%d" % i)
    first = sub.receive(5)
    time.sleep(0.2)  # 1 and 2 are in the client's buffer too
    cut_now(proxy)
    producer.send("/queue/held", b"3")  # delivered to the parked session? not before resume
    wait_failover(events)
    assert events[0].resumed
    client.ack(first)  # its ack id is still good: no AckFailed, no redelivery
    bodies = []
    while (message := sub.receive(1)) is not None:
        bodies.append((message.body, message.redelivered))
        client.ack(message)
    # 1 and 2 reached the client before the blip: not delivered again. 3 may have been
    # written to the dying socket (then it comes back redelivered) or waited in the queue.
    assert [b for b, _ in bodies] == [b"1", b"2", b"3"]
    assert bodies[:2] == [(b"1", False), (b"2", False)]


def test_deliveries_lost_in_the_blip_go_back_and_come_again(server, proxy, client_factory):
    events = []
    client = client_factory(url_of(proxy), failover_listener=events.append)
    sub = client.subscribe("/queue/lost", headers={"prefetch-count": "10"})
    proxy.cut("down")  # from now on the server's MESSAGE frames do not reach the client
    producer = client_factory(f"failover:(stomp://{server.host}:{server.port})")
    for i in range(3):
        producer.send("/queue/lost", b"%d" % i)
    time.sleep(0.2)
    proxy.heal(drop=True)
    wait_failover(events)
    assert events[0].resumed
    bodies = []
    while (message := sub.receive(1)) is not None:
        bodies.append((message.body, message.redelivered))
        client.ack(message)
    assert bodies == [(b"0", True), (b"1", True), (b"2", True)]


def test_after_the_ttl_the_session_is_gone_and_the_client_starts_afresh(
        server, client_factory):
    target = f"{server.host}:{server.port}"
    proxy = NetProxy(target).start()
    try:
        events = []
        client = client_factory(url_of(proxy), connection_ttl=300,
                                failover_listener=events.append)
        sub = client.subscribe("/queue/ttl")
        client.send("/queue/ttl", b"x")
        message = sub.receive(5)
        proxy.stop()  # both ends see the connection closed; the client finds no way back
        time.sleep(1.0)  # longer than the 300 ms the server keeps the session
        proxy = NetProxy(target, listen_port=proxy.listen_port).start()
        wait_failover(events)
        assert not events[0].resumed
        again = sub.receive(5)
        assert again.body == b"x" and again.redelivered
        assert again.message_id == message.message_id
        client.ack(again)
        assert "did not come back within its connection TTL" in server.logs()
    finally:
        proxy.stop()


def test_a_server_that_missed_the_break_hands_the_session_over(server):
    """The client takes its old connection for dead, the server does not yet (its socket is
    still open): the resume closes the old connection and moves the session to the new
    one, unacknowledged deliveries included."""
    old, connected = rawstomp.connect(server.address, headers={"connection-ttl": "5000"})
    old.request("SUBSCRIBE", {"destination": "/queue/half-open", "id": "1",
                              "ack": "client-individual"})
    old.request("SEND", {"destination": "/queue/half-open", "persistent": "true"}, "kept")
    message = old.read_message()
    new, answer = rawstomp.connect(server.address, headers={
        "resume-session": connected.headers["session"],
        "resume-key": connected.headers["resume-key"],
        "resume-last-ack": message.headers["ack"]})
    assert answer.headers["resumed"] == "true"
    assert answer.headers["resume-frames"] == "2"
    assert not old.is_open(1.0)  # closed by the server, without an ERROR
    new.request("ACK", {"id": message.headers["ack"]})  # the ack id is still the session's
    assert "resumed the session on a new connection" in server.logs()
    new.close()


def test_raw_resume_needs_the_key_and_the_login_else_a_fresh_session(server):
    conn, connected = rawstomp.connect(server.address, headers={"connection-ttl": "5000"})
    assert connected.headers["connection-ttl"] == "5000"
    token, key = connected.headers["session"], connected.headers["resume-key"]
    conn.request("SUBSCRIBE", {"destination": "/queue/raw", "id": "1", "ack": "client"})
    conn.close()  # abruptly: no DISCONNECT
    wrong, answer = rawstomp.connect(server.address, headers={
        "resume-session": token, "resume-key": "0" * 32, "resume-last-ack": "0"})
    assert "resumed" not in answer.headers and answer.headers["session"] != token
    wrong.close()
    right, answer = rawstomp.connect(server.address, headers={
        "resume-session": token, "resume-key": key, "resume-last-ack": "0",
        "connection-ttl": "99999999"})
    assert answer.headers["resumed"] == "true" and answer.headers["session"] == token
    assert answer.headers["resume-frames"] == "1"
    assert answer.headers["connection-ttl"] == "60000"  # capped by the server
    right.close()


def test_a_parked_client_id_is_taken_by_a_new_connection_of_the_same_login(server):
    first, _ = rawstomp.connect(server.address, headers={"connection-ttl": "30000",
                                                         "client-id": "app"})
    first.close()
    time.sleep(0.2)
    second, answer = rawstomp.connect(server.address, headers={"client-id": "app"})
    assert answer.command == "CONNECTED"
    second.close()


def test_a_plain_stomp_client_is_never_parked(server, stomp_client):
    """Without connection-ttl a broken connection ends its session at once, as before:
    another consumer gets its unacknowledged messages immediately."""
    gone = stomp_client(server)
    gone.subscribe("/queue/plain", ack="client-individual")
    gone.send("/queue/plain", "m")
    gone.wait_messages(1)
    other = stomp_client(server)
    other.subscribe("/queue/plain", ack="client-individual")
    gone.drop()
    assert other.wait_messages(1, timeout=5)[0].body == "m"


def test_resume_under_load_loses_and_doubles_nothing(server, proxy, client_factory):
    """Blips every 0.3 s while a producer and a consumer run through the proxy."""
    events: list = []
    producer = client_factory(url_of(proxy), failover_listener=events.append)
    consumer = client_factory(url_of(proxy), failover_listener=events.append)
    sub = consumer.subscribe("/queue/load", headers={"prefetch-count": "20"})
    total = 1500
    got: list[bytes] = []
    done = threading.Event()

    def consume() -> None:
        deadline = time.monotonic() + 60
        while len(got) < total and time.monotonic() < deadline:
            message = sub.receive(0.5)
            if message is not None:
                got.append(message.body)
                consumer.ack(message)

    def blips() -> None:
        while not done.wait(0.3):
            cut_now(proxy)

    reader = threading.Thread(target=consume)
    cutter = threading.Thread(target=blips)
    reader.start()
    cutter.start()
    try:
        for i in range(total):
            producer.send("/queue/load", b"%d" % i)
    finally:
        done.set()
        cutter.join(10)
    reader.join(70)
    assert len(got) == len(set(got)), "a message was consumed twice"
    assert sorted(got, key=int) == [b"%d" % i for i in range(total)]
    assert len(events) >= 4 and all(e.resumed for e in events), events
