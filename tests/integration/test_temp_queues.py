"""/temp-queue/NAME: private to its connection, addressed by others as /reply-queue/TOKEN,
deleted with the connection."""

from __future__ import annotations

from tests.integration.rawstomp import unique
from tests.support.waiting import wait_until


def request(requester, service, temp: str, body: str):
    """requester sends a request with reply-to:temp; returns the request as the service got it."""
    service_queue = service.service_queue
    before = len(service.messages)
    requester.send(service_queue, body, reply_to=temp)
    return service.wait_messages(before + 1)[before]


def make_service(server, stomp_client):
    service = stomp_client(server)
    service.service_queue = f"/queue/{unique('svc')}"
    service.subscribe(service.service_queue)
    return service


def test_reply_to_is_rewritten_and_replies_reach_the_owner(server, stomp_client):
    service = make_service(server, stomp_client)
    requester = stomp_client(server)
    sub = requester.subscribe("/temp-queue/replies")
    got = request(requester, service, "/temp-queue/replies", "what time is it?")
    reply_to = got.headers["reply-to"]
    assert reply_to.startswith("/reply-queue/"), reply_to
    assert len(reply_to) > len("/reply-queue/")
    service.send(reply_to, "tea time", correlation_id="c1")
    (reply,) = requester.wait_messages(1)
    assert reply.body == "tea time"
    assert reply.headers["subscription"] == sub
    assert reply.headers["correlation-id"] == "c1"


def test_reply_reaches_the_owner_whether_or_not_it_subscribed_first(server, stomp_client):
    """The reply comes through the subscription its SEND made (as RabbitMQ); an explicit
    SUBSCRIBE made later takes that subscription over."""
    service = make_service(server, stomp_client)
    requester = stomp_client(server)
    got = request(requester, service, "/temp-queue/later", "ping")
    service.send(got.headers["reply-to"], "pong")
    requester.subscribe("/temp-queue/later")
    assert requester.wait_messages(1)[0].body == "pong"


def test_temp_queues_are_private_to_their_connection(server, stomp_client):
    service = make_service(server, stomp_client)
    a = stomp_client(server)
    b = stomp_client(server)
    a.subscribe("/temp-queue/same")
    b.subscribe("/temp-queue/same")
    reply_a = request(a, service, "/temp-queue/same", "from a").headers["reply-to"]
    reply_b = request(b, service, "/temp-queue/same", "from b").headers["reply-to"]
    assert reply_a != reply_b, "the same temp queue name on two connections is two queues"
    # Uneven traffic, so that a shared queue could not pass by round-robin luck.
    for i in range(4):
        a.send("/temp-queue/same", f"a to itself {i}")
    b.send("/temp-queue/same", "b to itself")
    for i in range(3):
        service.send(reply_a, f"reply for a {i}")
    service.send(reply_b, "reply for b")
    a.wait_messages(7)
    b.wait_messages(2)
    a.send("/temp-queue/same", "sync")
    b.send("/temp-queue/same", "sync")
    a.wait_body("sync")
    b.wait_body("sync")
    assert a.bodies() == [f"a to itself {i}" for i in range(4)] + [
        f"reply for a {i}" for i in range(3)
    ] + ["sync"]
    assert b.bodies() == ["b to itself", "reply for b", "sync"]


def test_only_the_owner_may_subscribe_to_the_reply_queue(server, stomp_client):
    service = make_service(server, stomp_client)
    owner = stomp_client(server)
    owner.subscribe("/temp-queue/mine")
    reply_to = request(owner, service, "/temp-queue/mine", "hi").headers["reply-to"]
    thief = stomp_client(server)
    thief.conn.subscribe(reply_to, "steal", headers={"receipt": "steal"})
    error = thief.wait_error()
    assert error.headers.get("message")
    assert error.headers.get("receipt-id") == "steal"
    service.send(reply_to, "private")
    assert owner.wait_messages(1)[0].body == "private"


def test_sending_after_the_owner_left_gets_an_error(server, stomp_client):
    service = make_service(server, stomp_client)
    owner = stomp_client(server)
    owner.subscribe("/temp-queue/gone")
    reply_to = request(owner, service, "/temp-queue/gone", "hi").headers["reply-to"]
    owner.disconnect()
    service.conn.send(reply_to, "too late", headers={"receipt": "late"})
    error = service.wait_error()
    assert "no longer exists" in error.headers.get("message", "")
    assert error.headers.get("receipt-id") == "late"
    assert "late" not in service.listener.receipts


def test_sending_after_the_owner_dropped_gets_an_error(server, stomp_client):
    service = make_service(server, stomp_client)
    owner = stomp_client(server)
    reply_to = request(owner, service, "/temp-queue/crash", "hi").headers["reply-to"]
    owner.drop()

    # The server learns of the closed socket asynchronously; ask until it has.
    def error_or_none():
        probe = stomp_client(server)
        probe.conn.send(reply_to, "too late", headers={"receipt": "late"})
        probe.listener.wait_for(
            lambda: probe.listener.errors or "late" in probe.listener.receipts, 5, "answer"
        )
        return probe.listener.errors[0] if probe.listener.errors else None

    error = wait_until(error_or_none, "ERROR for a dead temp queue", 5)
    assert "no longer exists" in error.headers.get("message", "")


def test_temp_queue_messages_are_deleted_with_the_connection(server, stomp_client):
    first = stomp_client(server)
    first.send("/temp-queue/box", "left behind")
    first.disconnect()
    second = stomp_client(server)
    second.subscribe("/temp-queue/box")
    second.send("/temp-queue/box", "fresh")
    second.wait_body("fresh")
    assert second.bodies() == ["fresh"]
