"""/topic/NAME: every subscriber gets a copy; no subscriber, no message."""

from __future__ import annotations

from tests.integration.rawstomp import unique


def test_fan_out_to_every_subscriber_in_order(server, stomp_client):
    topic = f"/topic/{unique('fan')}"
    subscribers = [stomp_client(server) for _ in range(3)]
    for s in subscribers:
        s.subscribe(topic)
    producer = stomp_client(server)
    for i in range(20):
        producer.send(topic, str(i), receipt=(i == 19))
    for s in subscribers:
        assert [m.body for m in s.wait_messages(20)] == [str(i) for i in range(20)]
    producer.send(topic, "sync")
    for s in subscribers:
        s.wait_body("sync")
        assert len(s.messages) == 21, "each subscriber gets exactly one copy"
        message_ids = {m.headers["message-id"] for m in s.messages}
        assert len(message_ids) == 21


def test_two_subscriptions_on_one_connection_each_get_a_copy(server, stomp_client):
    topic = f"/topic/{unique('two')}"
    client = stomp_client(server)
    a = client.subscribe(topic)
    b = client.subscribe(topic)
    client.send(topic, "hello")
    messages = client.wait_messages(2)
    assert sorted(m.headers["subscription"] for m in messages) == sorted([a, b])
    assert all(m.body == "hello" for m in messages)


def test_message_without_subscriber_goes_nowhere(server, stomp_client):
    topic = f"/topic/{unique('void')}"
    producer = stomp_client(server)
    producer.send(topic, "nobody listens")
    subscriber = stomp_client(server)
    subscriber.subscribe(topic)
    producer.send(topic, "now someone does")
    subscriber.wait_body("now someone does")
    assert subscriber.bodies() == ["now someone does"]


def test_unsubscribe_stops_only_that_subscriber(server, stomp_client):
    topic = f"/topic/{unique('un')}"
    leaving = stomp_client(server)
    sub = leaving.subscribe(topic)
    staying = stomp_client(server)
    staying.subscribe(topic)
    producer = stomp_client(server)
    producer.send(topic, "both")
    leaving.wait_body("both")
    leaving.unsubscribe(sub)
    producer.send(topic, "one")
    staying.wait_body("one")
    leaving.send(f"/queue/{unique('sync')}", "sync")
    assert leaving.bodies() == ["both"]
    assert staying.bodies() == ["both", "one"]


def test_plain_topic_subscriber_that_left_misses_messages(server, stomp_client):
    topic = f"/topic/{unique('gone')}"
    first = stomp_client(server)
    first.subscribe(topic)
    first.disconnect()
    producer = stomp_client(server)
    producer.send(topic, "while away")
    back = stomp_client(server)
    back.subscribe(topic)
    producer.send(topic, "after return")
    back.wait_body("after return")
    assert back.bodies() == ["after return"]


def test_client_ack_topic_subscribers_ack_independently(server, stomp_client):
    topic = f"/topic/{unique('ackt')}"
    a = stomp_client(server)
    a.subscribe(topic, ack="client-individual")
    b = stomp_client(server)
    b.subscribe(topic, ack="client-individual")
    producer = stomp_client(server)
    producer.send(topic, "x")
    (ma,) = a.wait_messages(1)
    (mb,) = b.wait_messages(1)
    a.ack(ma)
    b.nack(mb)
    again = b.wait_messages(2)[1]
    assert again.body == "x"
    assert again.headers.get("redelivered") == "true"
    assert again.headers.get("delivery-count") == "2"
    b.ack(again)
    a.send(f"/queue/{unique('sync')}", "sync")
    assert len(a.messages) == 1, "a NACK on one subscription does not redeliver to another"
