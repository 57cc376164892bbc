"""Durable topic subscriptions, ActiveMQ style (client-id + activemq.subscriptionName) and
RabbitMQ style (durable:true + id)."""

from __future__ import annotations

import pytest

from tests.integration.rawstomp import unique
from tests.support.waiting import wait_until


def activemq(name: str) -> dict[str, str]:
    return {"activemq.subscriptionName": name}


def reconnect(stomp_client, server, cid: str):
    """Connect with a client-id whose previous connection was dropped (the server may need
    a moment to notice the closed socket)."""

    def attempt():
        client = stomp_client(server, connect=False)
        client.connect(headers={"client-id": cid}, expect_error=None)
        return client if client.listener.connected else None

    return wait_until(attempt, f"client-id {cid} released", 5)


def test_activemq_durable_subscription_keeps_messages_while_away(server, stomp_client):
    topic, cid, name = f"/topic/{unique('t')}", unique("cid"), unique("sub")
    subscriber = stomp_client(server, headers={"client-id": cid})
    subscriber.subscribe(topic, id="d1", headers=activemq(name))
    plain = stomp_client(server)
    plain.subscribe(topic)
    producer = stomp_client(server)
    producer.send(topic, "live")
    subscriber.wait_body("live")
    plain.wait_body("live")
    subscriber.disconnect()
    for i in range(5):
        producer.send(topic, f"away-{i}")
    back = stomp_client(server, headers={"client-id": cid})
    back.subscribe(topic, id="d2", headers=activemq(name))
    assert [m.body for m in back.wait_messages(5)] == [f"away-{i}" for i in range(5)]
    assert all(m.headers["subscription"] == "d2" for m in back.messages)
    producer.send(topic, "after")
    back.wait_body("after")
    assert back.bodies() == [f"away-{i}" for i in range(5)] + ["after"]


def test_activemq_subscription_belongs_to_the_client_id(server, stomp_client):
    topic, name = f"/topic/{unique('t')}", unique("sub")
    owner_id, other_id = unique("cid"), unique("cid")
    owner = stomp_client(server, headers={"client-id": owner_id})
    owner.subscribe(topic, id="d", headers=activemq(name))
    owner.disconnect()
    producer = stomp_client(server)
    producer.send(topic, "for the owner")
    # Same subscription name, other client-id: another (new, empty) subscription.
    other = stomp_client(server, headers={"client-id": other_id})
    other.subscribe(topic, id="d", headers=activemq(name))
    producer.send(topic, "for both")
    other.wait_body("for both")
    assert other.bodies() == ["for both"]
    owner = stomp_client(server, headers={"client-id": owner_id})
    owner.subscribe(topic, id="d", headers=activemq(name))
    owner.wait_messages(2)
    assert owner.bodies() == ["for the owner", "for both"]


@pytest.mark.parametrize("flag", ["durable", "persistent"])
def test_rabbitmq_durable_subscription_keeps_messages_while_away(server, stomp_client, flag):
    topic, sub_id = f"/topic/{unique('t')}", unique("rid")
    subscriber = stomp_client(server)
    subscriber.subscribe(topic, id=sub_id, headers={flag: "true"})
    subscriber.disconnect()
    producer = stomp_client(server)
    for i in range(3):
        producer.send(topic, f"away-{i}")
    back = stomp_client(server)
    back.subscribe(topic, id=sub_id, headers={flag: "true"})
    assert [m.body for m in back.wait_messages(3)] == ["away-0", "away-1", "away-2"]


def test_rabbitmq_durable_id_is_scoped_by_client_id(server, stomp_client):
    topic, sub_id = f"/topic/{unique('t')}", unique("rid")
    a = stomp_client(server, headers={"client-id": unique("ca")})
    b = stomp_client(server, headers={"client-id": unique("cb")})
    # C:I differs, so both may be subscribed at once and each gets every message.
    a.subscribe(topic, id=sub_id, headers={"durable": "true"})
    b.subscribe(topic, id=sub_id, headers={"durable": "true"})
    producer = stomp_client(server)
    producer.send(topic, "to both")
    a.wait_body("to both")
    b.wait_body("to both")


def test_only_one_connection_at_a_time(server, stomp_client):
    topic, sub_id = f"/topic/{unique('t')}", unique("rid")
    first = stomp_client(server)
    first.subscribe(topic, id=sub_id, headers={"durable": "true"})
    second = stomp_client(server)
    second.conn.subscribe(topic, sub_id, headers={"durable": "true", "receipt": "r"})
    error = second.wait_error()
    assert error.headers.get("message")
    assert error.headers.get("receipt-id") == "r"
    # The first subscriber keeps working.
    producer = stomp_client(server)
    producer.send(topic, "still mine")
    first.wait_body("still mine")


@pytest.mark.parametrize("style", ["activemq", "rabbitmq"])
def test_plain_unsubscribe_keeps_the_subscription(server, stomp_client, style):
    topic, cid, name = f"/topic/{unique('t')}", unique("cid"), unique("sub")
    headers = activemq(name) if style == "activemq" else {"durable": "true"}
    sub_id = "s1" if style == "activemq" else name
    subscriber = stomp_client(server, headers={"client-id": cid})
    subscriber.subscribe(topic, id=sub_id, headers=headers)
    subscriber.unsubscribe(sub_id)
    producer = stomp_client(server)
    producer.send(topic, "kept")
    subscriber.subscribe(topic, id=sub_id, headers=headers)
    assert subscriber.wait_messages(1)[0].body == "kept"


@pytest.mark.parametrize("style", ["activemq", "rabbitmq"])
def test_unsubscribe_with_name_deletes_subscription_and_backlog(server, stomp_client, style):
    topic, cid, name = f"/topic/{unique('t')}", unique("cid"), unique("sub")
    headers = activemq(name) if style == "activemq" else {"durable": "true"}
    sub_id = "s1" if style == "activemq" else name
    subscriber = stomp_client(server, headers={"client-id": cid})
    subscriber.subscribe(
        topic, id=sub_id, ack="client-individual", headers={**headers, "prefetch-count": "1"}
    )
    producer = stomp_client(server)
    for i in range(3):
        producer.send(topic, f"backlog-{i}")
    subscriber.wait_messages(1)  # the other two wait in the subscription's backlog
    subscriber.unsubscribe(sub_id, headers=headers)
    producer.send(topic, "nobody subscribed")
    subscriber.clear()
    subscriber.subscribe(topic, id=sub_id, headers=headers)
    producer.send(topic, "new")
    subscriber.wait_body("new")
    assert subscriber.bodies() == ["new"], "the deleted subscription's backlog is gone"


def test_unacked_messages_come_back_to_the_durable_subscriber(server, stomp_client):
    topic, cid, name = f"/topic/{unique('t')}", unique("cid"), unique("sub")
    subscriber = stomp_client(server, headers={"client-id": cid})
    subscriber.subscribe(topic, id="d", ack="client-individual", headers=activemq(name))
    producer = stomp_client(server)
    producer.send(topic, "acked")
    producer.send(topic, "unacked")
    first, _ = subscriber.wait_messages(2)
    subscriber.ack(first)
    subscriber.drop()
    # Once the client-id is free again the server has seen the close: what is published
    # now waits in the subscription and was never delivered.
    back = reconnect(stomp_client, server, cid)
    producer.send(topic, "while away")
    back.subscribe(topic, id="d", ack="client-individual", headers=activemq(name))
    again, away = back.wait_messages(2)
    assert again.body == "unacked"
    assert again.headers.get("redelivered") == "true"
    assert again.headers.get("delivery-count") == "2"
    assert away.body == "while away"
    assert away.headers.get("delivery-count") == "1"
