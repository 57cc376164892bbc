"""Priority, expiry (both expired_policy values) and dead-lettering after too many deliveries."""

from __future__ import annotations

import time

import pytest

from tests.integration.rawstomp import unique, unique_queue


def now_ms() -> int:
    return int(time.time() * 1000)


# -- priority ------------------------------------------------------------------------------------


def test_higher_priority_first_then_send_order(server, stomp_client):
    _, queue = unique_queue()
    producer = stomp_client(server)
    sends = [("a", "0"), ("b", "4"), ("c", "9"), ("d", None), ("e", "9"), ("f", "1"), ("g", "4")]
    for body, priority in sends:
        if priority is None:
            producer.send(queue, body)
        else:
            producer.send(queue, body, priority=priority)
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    consumer.wait_messages(len(sends))
    assert consumer.bodies() == ["c", "e", "b", "d", "g", "f", "a"]
    by_body = {m.body: m for m in consumer.messages}
    assert by_body["c"].headers.get("priority") == "9"


def test_priority_applies_to_what_waits_behind_a_busy_consumer(server, stomp_client):
    _, queue = unique_queue()
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual", headers={"prefetch-count": "1"})
    producer = stomp_client(server)
    producer.send(queue, "first", priority="0")
    (first,) = consumer.wait_messages(1)
    producer.send(queue, "low", priority="1")
    producer.send(queue, "high", priority="8")
    consumer.ack(first)
    second = consumer.wait_messages(2)[1]
    consumer.ack(second)
    third = consumer.wait_messages(3)[2]
    assert [second.body, third.body] == ["high", "low"]


# -- expiry --------------------------------------------------------------------------------------


def dlq_messages(server, stomp_client, dlq: str, expected: int) -> list:
    """Everything in a dead-letter queue: subscribe, then send a marker and read up to it."""
    reader = stomp_client(server)
    reader.subscribe(dlq)
    reader.send(dlq, "marker")
    reader.wait_body("marker")
    messages = [m for m in reader.messages if m.body != "marker"]
    assert len(messages) == expected, [(m.body, m.headers) for m in messages]
    return messages


def test_expired_message_is_dead_lettered_by_default(server, stomp_client):
    name, queue = unique_queue()
    producer = stomp_client(server)
    producer.send(queue, "stale", expires=str(now_ms() - 1000), x_tag="t1")
    producer.send(queue, "fresh", expires=str(now_ms() + 60_000))
    producer.send(queue, "forever", expires="0")
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    consumer.wait_messages(2)
    consumer.send(queue, "end")
    consumer.wait_body("end")
    assert consumer.bodies() == ["fresh", "forever", "end"]
    (dead,) = dlq_messages(server, stomp_client, f"/queue/DLQ.{name}", 1)
    assert dead.body == "stale"
    assert dead.headers.get("dead-letter-reason") == "expired"
    assert dead.headers.get("x-tag") == "t1"


def test_message_that_expires_while_waiting_is_not_delivered(server, stomp_client):
    name, queue = unique_queue()
    producer = stomp_client(server)
    expires = now_ms() + 300
    producer.send(queue, "short-lived", expires=str(expires))
    producer.send(queue, "long-lived", expires=str(now_ms() + 60_000))
    while now_ms() < expires + 200:  # let the first one expire
        time.sleep(0.05)
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    consumer.wait_body("long-lived")
    assert consumer.bodies() == ["long-lived"]
    (dead,) = dlq_messages(server, stomp_client, f"/queue/DLQ.{name}", 1)
    assert dead.body == "short-lived"
    assert dead.headers.get("dead-letter-reason") == "expired"


def test_expired_policy_drop(server_factory, stomp_client):
    srv = server_factory("--expired-policy", "drop")
    name, queue = unique_queue()
    producer = stomp_client(srv)
    producer.send(queue, "stale", expires=str(now_ms() - 1000))
    producer.send(queue, "soon stale", expires=str(now_ms() + 200))
    deadline = now_ms() + 400
    while now_ms() < deadline:
        time.sleep(0.05)
    producer.send(queue, "fresh")
    consumer = stomp_client(srv)
    consumer.subscribe(queue)
    consumer.wait_body("fresh")
    assert consumer.bodies() == ["fresh"]
    dlq_messages(srv, stomp_client, f"/queue/DLQ.{name}", 0)


def test_expired_messages_use_the_configured_dead_letter_prefix(server_factory, stomp_client):
    srv = server_factory("--dead-letter-prefix", "DEAD.")
    name, queue = unique_queue()
    producer = stomp_client(srv)
    producer.send(queue, "stale", expires=str(now_ms() - 1000))
    producer.send(queue, "fresh")
    consumer = stomp_client(srv)
    consumer.subscribe(queue)
    consumer.wait_body("fresh")
    (dead,) = dlq_messages(srv, stomp_client, f"/queue/DEAD.{name}", 1)
    assert dead.body == "stale"
    dlq_messages(srv, stomp_client, f"/queue/DLQ.{name}", 0)


# -- dead-lettering after max_delivery_attempts ------------------------------------------------


def nack_until_gone(client, attempts_expected: int) -> list:
    """NACK every delivery; return the deliveries seen once the message stops coming back."""
    for n in range(1, attempts_expected + 1):
        message = client.wait_messages(n)[n - 1]
        assert message.headers["delivery-count"] == str(n)
        client.nack(message)
    client.send(f"/queue/{unique('sync')}", "sync")
    return list(client.messages)


def assert_dead_lettered(dead, body: str, origin_name: str, origin: str) -> None:
    assert dead.body == body
    assert dead.headers.get("dead-letter-reason") == "max-delivery-attempts"
    assert dead.headers.get("original-destination") in (origin, origin_name), dead.headers


def test_message_goes_to_dlq_after_max_delivery_attempts(server_factory, stomp_client):
    srv = server_factory("--max-delivery-attempts", "3")
    name, queue = unique_queue()
    consumer = stomp_client(srv)
    consumer.subscribe(queue, ack="client-individual")
    producer = stomp_client(srv)
    producer.send(queue, "poison", x_app="kept")
    deliveries = nack_until_gone(consumer, 3)
    assert [m.headers["delivery-count"] for m in deliveries] == ["1", "2", "3"]
    (dead,) = dlq_messages(srv, stomp_client, f"/queue/DLQ.{name}", 1)
    assert_dead_lettered(dead, "poison", name, queue)
    assert dead.headers.get("x-app") == "kept"
    # The queue itself is empty now.
    producer.send(queue, "next")
    nxt = consumer.wait_body("next")
    consumer.ack(nxt)
    assert len(consumer.messages) == 4


def test_default_max_delivery_attempts_is_ten(server, stomp_client):
    name, queue = unique_queue()
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    stomp_client(server).send(queue, "poison")
    deliveries = nack_until_gone(consumer, 10)
    assert len(deliveries) == 10
    (dead,) = dlq_messages(server, stomp_client, f"/queue/DLQ.{name}", 1)
    assert_dead_lettered(dead, "poison", name, queue)


def test_zero_means_unlimited_attempts(server_factory, stomp_client):
    srv = server_factory("--max-delivery-attempts", "0")
    name, queue = unique_queue()
    consumer = stomp_client(srv)
    consumer.subscribe(queue, ack="client-individual")
    stomp_client(srv).send(queue, "again and again")
    nack_until_gone(consumer, 12)
    again = consumer.wait_messages(13)[12]
    assert again.headers["delivery-count"] == "13"
    dlq_messages(srv, stomp_client, f"/queue/DLQ.{name}", 0)


def test_closed_connections_count_as_deliveries(server_factory, stomp_client):
    srv = server_factory("--max-delivery-attempts", "2")
    name, queue = unique_queue()
    # The server learns of a dropped socket asynchronously: wait on a DLQ subscription.
    dlq = stomp_client(srv)
    dlq.subscribe(f"/queue/DLQ.{name}")
    stomp_client(srv).send(queue, "crashes its consumers")
    for attempt in (1, 2):
        consumer = stomp_client(srv)
        consumer.subscribe(queue, ack="client-individual")
        (message,) = consumer.wait_messages(1)
        assert message.headers["delivery-count"] == str(attempt)
        consumer.drop()
    (dead,) = dlq.wait_messages(1)
    assert_dead_lettered(dead, "crashes its consumers", name, queue)


def test_dead_letter_prefix_flag(server_factory, stomp_client):
    srv = server_factory("--max-delivery-attempts", "1", "--dead-letter-prefix", "Dead_")
    name, queue = unique_queue()
    consumer = stomp_client(srv)
    consumer.subscribe(queue, ack="client-individual")
    stomp_client(srv).send(queue, "once")
    nack_until_gone(consumer, 1)
    (dead,) = dlq_messages(srv, stomp_client, f"/queue/Dead_{name}", 1)
    assert_dead_lettered(dead, "once", name, queue)


@pytest.mark.parametrize("durable", [False, True])
def test_topic_subscription_dead_letters_to_the_topic_name(server_factory, stomp_client, durable):
    srv = server_factory("--max-delivery-attempts", "2")
    name = unique("t")
    topic = f"/topic/{name}"
    subscriber = stomp_client(srv, headers={"client-id": unique("c")})
    headers = {"activemq.subscriptionName": "s"} if durable else {}
    subscriber.subscribe(topic, ack="client-individual", headers=headers)
    stomp_client(srv).send(topic, "bad news")
    nack_until_gone(subscriber, 2)
    (dead,) = dlq_messages(srv, stomp_client, f"/queue/DLQ.{name}", 1)
    assert_dead_lettered(dead, "bad news", name, topic)
