"""/queue/NAME: kept until consumed, competing consumers, round-robin, per-producer order."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from tests.integration.rawstomp import unique


def test_messages_wait_for_a_consumer_and_are_consumed_once(server, stomp_client):
    queue = f"/queue/{unique('keep')}"
    producer = stomp_client(server)
    for i in range(5):
        producer.send(queue, f"m{i}")
    producer.disconnect()
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    assert [m.body for m in consumer.wait_messages(5)] == [f"m{i}" for i in range(5)]
    consumer.disconnect()
    # Consumed with ack:auto: a later subscriber gets only what is sent later.
    late = stomp_client(server)
    late.subscribe(queue)
    late.send(queue, "fresh")
    assert late.wait_messages(1)[0].body == "fresh"
    assert late.bodies() == ["fresh"]


def test_competing_consumers_round_robin(server, stomp_client):
    queue = f"/queue/{unique('rr')}"
    consumers = [stomp_client(server) for _ in range(3)]
    for c in consumers:
        c.subscribe(queue)
    producer = stomp_client(server)
    for i in range(30):
        producer.send(queue, str(i), receipt=(i == 29))
    consumers[0].listener.wait_for(
        lambda: sum(len(c.messages) for c in consumers) >= 30, 10, "30 messages"
    )
    got = [c.bodies() for c in consumers]
    everything = [int(b) for bodies in got for b in bodies]
    assert sorted(everything) == list(range(30)), "each message to exactly one consumer"
    assert [len(bodies) for bodies in got] == [10, 10, 10], f"not fair round-robin: {got}"
    for bodies in got:
        numbers = [int(b) for b in bodies]
        assert numbers == sorted(numbers)


def test_busy_consumer_does_not_hold_up_the_others(server, stomp_client):
    queue = f"/queue/{unique('busy')}"
    busy = stomp_client(server)
    busy.subscribe(queue, ack="client-individual", headers={"prefetch-count": "1"})
    idle = stomp_client(server)
    idle.subscribe(queue, ack="client-individual", headers={"prefetch-count": "100"})
    producer = stomp_client(server)
    for i in range(10):
        producer.send(queue, str(i))
    busy.wait_messages(1)
    idle.wait_messages(9)
    assert len(busy.messages) == 1
    assert sorted(int(b) for b in busy.bodies() + idle.bodies()) == list(range(10))


@pytest.mark.parametrize("consumer_count", [1, 2])
def test_per_producer_order(server, stomp_client, raw_client, consumer_count):
    queue = f"/queue/{unique('order')}"
    consumers = [stomp_client(server) for _ in range(consumer_count)]
    for c in consumers:
        c.subscribe(queue)
    producers = [raw_client(server)[0] for _ in range(3)]
    per_producer = 100

    def produce(index: int) -> None:
        client = producers[index]
        for seq in range(per_producer):
            client.send_frame("SEND", {"destination": queue, "producer": str(index)}, str(seq))
        client.request("SEND", {"destination": queue, "producer": str(index)}, "end")

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    total = 3 * (per_producer + 1)
    consumers[0].listener.wait_for(
        lambda: sum(len(c.messages) for c in consumers) >= total, 15, f"{total} messages"
    )
    seen: Counter[tuple[str, str]] = Counter()
    for c in consumers:
        last: dict[str, int] = {}
        for m in c.messages:
            producer, body = m.headers["producer"], m.body
            seen[(producer, body)] += 1
            seq = per_producer if body == "end" else int(body)
            assert seq > last.get(producer, -1), f"producer {producer} out of order"
            last[producer] = seq
    assert len(seen) == total and set(seen.values()) == {1}


def test_queue_and_topic_of_the_same_name_are_distinct(server, stomp_client):
    name = unique("same")
    topic_sub = stomp_client(server)
    topic_sub.subscribe(f"/topic/{name}")
    queue_sub = stomp_client(server)
    queue_sub.subscribe(f"/queue/{name}")
    producer = stomp_client(server)
    producer.send(f"/queue/{name}", "to-queue")
    producer.send(f"/topic/{name}", "to-topic")
    assert queue_sub.wait_messages(1)[0].body == "to-queue"
    assert topic_sub.wait_messages(1)[0].body == "to-topic"
    producer.send(f"/queue/{name}", "sync")
    queue_sub.wait_body("sync")
    assert topic_sub.bodies() == ["to-topic"]
    assert queue_sub.bodies() == ["to-queue", "sync"]


def test_unsubscribed_consumer_gets_nothing_more(server, stomp_client):
    queue = f"/queue/{unique('unsub')}"
    leaving = stomp_client(server)
    sub = leaving.subscribe(queue)
    staying = stomp_client(server)
    staying.subscribe(queue)
    leaving.unsubscribe(sub)
    producer = stomp_client(server)
    for i in range(4):
        producer.send(queue, str(i))
    staying.wait_messages(4)
    leaving.send(f"/queue/{unique('sync')}", "sync")
    assert leaving.messages == []
