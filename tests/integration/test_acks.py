"""Ack modes auto, client (cumulative) and client-individual; NACK; redelivery of the unacked
messages of a closed connection or a removed subscription."""

from __future__ import annotations

import pytest

from tests.integration.clients import fill
from tests.integration.rawstomp import unique


def leave(client, how: str) -> None:
    client.drop() if how == "drop" else client.disconnect()


def assert_redelivered(messages, bodies: list[str], count: int = 2) -> None:
    assert [m.body for m in messages] == bodies
    for m in messages:
        assert m.headers.get("redelivered") == "true", m.headers
        assert m.headers.get("delivery-count") == str(count), m.headers


def test_auto_ack_messages_are_not_redelivered(server, stomp_client):
    queue = f"/queue/{unique('auto')}"
    fill(server, stomp_client, queue, 3)
    first = stomp_client(server)
    first.subscribe(queue)
    assert [m.body for m in first.wait_messages(3)] == ["m0", "m1", "m2"]
    first.drop()
    second = stomp_client(server)
    second.subscribe(queue)
    second.send(queue, "new")
    second.wait_body("new")
    assert second.bodies() == ["new"]


@pytest.mark.parametrize("how", ["drop", "disconnect"])
def test_client_ack_is_cumulative(server, stomp_client, how):
    queue = f"/queue/{unique('cum')}"
    fill(server, stomp_client, queue, 5)
    first = stomp_client(server)
    first.subscribe(queue, ack="client")
    messages = first.wait_messages(5)
    assert all(m.headers.get("ack") for m in messages)
    first.ack(messages[2])  # acknowledges m0, m1 and m2
    leave(first, how)
    second = stomp_client(server)
    second.subscribe(queue, ack="client")
    assert_redelivered(second.wait_messages(2), ["m3", "m4"])
    second.ack(second.messages[1])
    second.sync()
    assert len(second.messages) == 2


@pytest.mark.parametrize("how", ["drop", "disconnect"])
def test_client_individual_ack(server, stomp_client, how):
    queue = f"/queue/{unique('ind')}"
    fill(server, stomp_client, queue, 5)
    first = stomp_client(server)
    first.subscribe(queue, ack="client-individual")
    messages = first.wait_messages(5)
    for i in (0, 2, 4):
        first.ack(messages[i])
    leave(first, how)
    second = stomp_client(server)
    second.subscribe(queue, ack="client-individual")
    assert_redelivered(second.wait_messages(2), ["m1", "m3"])
    second.sync()
    assert len(second.messages) == 2


def test_nack_returns_the_message_to_the_head(server, stomp_client):
    queue = f"/queue/{unique('nack')}"
    fill(server, stomp_client, queue, 3)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual", headers={"prefetch-count": "1"})
    (first,) = consumer.wait_messages(1)
    assert first.body == "m0"
    assert first.headers["delivery-count"] == "1"
    assert first.headers.get("redelivered") != "true"
    consumer.nack(first)
    again = consumer.wait_messages(2)[1]
    assert again.body == "m0", "a NACKed message goes back at the head of the queue"
    assert again.headers["redelivered"] == "true"
    assert again.headers["delivery-count"] == "2"
    consumer.nack(again)
    third = consumer.wait_messages(3)[2]
    assert (third.body, third.headers["delivery-count"]) == ("m0", "3")
    consumer.ack(third)
    rest = consumer.wait_messages(4)[3]
    assert rest.body == "m1"
    assert rest.headers["delivery-count"] == "1"


def test_nack_in_client_mode_is_cumulative(server, stomp_client):
    queue = f"/queue/{unique('nackc')}"
    fill(server, stomp_client, queue, 3)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client")
    _m0, m1, _m2 = consumer.wait_messages(3)
    consumer.nack(m1)  # returns m0 and m1; m2 stays delivered and unacked
    assert_redelivered(consumer.wait_messages(5)[3:], ["m0", "m1"])
    consumer.sync()
    assert len(consumer.messages) == 5
    consumer.ack(consumer.messages[4])  # cumulative: everything delivered up to it
    consumer.drop()
    check = stomp_client(server)
    check.subscribe(queue)
    # m2 was delivered before the redelivered m1, so the cumulative ACK covered it.
    assert check.bodies_up_to_marker(queue) == ["after"]


def test_unsubscribe_returns_unacked_messages(server, stomp_client):
    queue = f"/queue/{unique('unsub')}"
    fill(server, stomp_client, queue, 2)
    first = stomp_client(server)
    sub = first.subscribe(queue, ack="client-individual")
    first.wait_messages(2)
    first.unsubscribe(sub)
    second = stomp_client(server)
    second.subscribe(queue, ack="client-individual")
    assert_redelivered(second.wait_messages(2), ["m0", "m1"])


def test_stomp_1_1_ack_and_nack_by_message_id_and_subscription(server, stomp_client):
    queue = f"/queue/{unique('v11')}"
    fill(server, stomp_client, queue, 3)
    consumer = stomp_client(server, version="1.1")
    consumer.subscribe(queue, ack="client-individual")
    m0, m1, _m2 = consumer.wait_messages(3)
    assert m0.headers["subscription"] and m0.headers["message-id"]
    consumer.ack(m0)
    consumer.nack(m1)
    again = consumer.wait_messages(4)[3]
    assert again.body == "m1" and again.headers["redelivered"] == "true"
    consumer.ack(again)
    consumer.drop()
    check = stomp_client(server)
    check.subscribe(queue, ack="client-individual")
    assert_redelivered(check.wait_messages(1), ["m2"])


def test_stomp_1_0_ack_by_message_id(server, stomp_client):
    queue = f"/queue/{unique('v10')}"
    fill(server, stomp_client, queue, 2)
    consumer = stomp_client(server, version="1.0")
    consumer.subscribe(queue, ack="client")
    m0, _m1 = consumer.wait_messages(2)
    consumer.ack(m0)
    consumer.drop()
    check = stomp_client(server)
    check.subscribe(queue, ack="client-individual")
    assert_redelivered(check.wait_messages(1), ["m1"])


def test_ack_of_another_connections_message_is_an_error(server, stomp_client):
    queue = f"/queue/{unique('foreign')}"
    fill(server, stomp_client, queue, 1)
    owner = stomp_client(server)
    owner.subscribe(queue, ack="client-individual")
    (message,) = owner.wait_messages(1)
    stranger = stomp_client(server)
    stranger.conn.ack(message.headers["ack"], receipt="steal")
    error = stranger.wait_error()
    assert error.headers.get("receipt-id") == "steal"
    owner.ack(message)
