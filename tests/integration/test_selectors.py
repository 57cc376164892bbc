"""JMS message selectors on SUBSCRIBE (`selector` header, ActiveMQ / Artemis / TIBCO EMS),
against a real server with stomp.py: queues leave what a consumer does not match for the
others, topics and durable subscriptions keep only what matches, streams skip it."""

from __future__ import annotations

import time

from pairmq.protocol.batch import decode_records
from tests.integration.rawstomp import unique
from tests.support.servers import restart
from tests.support.streams import subscribe
from tests.support.waiting import wait_until

COLOURS = ["red", "blue", "red", "green", "red", "blue"]


def send_colours(producer, destination: str, **extra: str) -> None:
    for i, colour in enumerate(COLOURS):
        producer.send(destination, f"{colour}-{i}", color=colour, weight=str(i * 10), **extra)


def settle(client, count: int) -> list[str]:
    """The bodies, once `count` arrived and nothing more came for a moment."""
    client.wait_messages(count)
    time.sleep(0.3)
    return client.bodies()


def test_queue_consumer_takes_only_what_matches_and_leaves_the_rest(server, stomp_client):
    queue = f"/queue/{unique('sel')}"
    producer = stomp_client(server)
    send_colours(producer, queue, persistent="true")
    reds = stomp_client(server)
    reds.subscribe(queue, ack="client-individual", headers={"selector": "color = 'red'"})
    assert settle(reds, 3) == ["red-0", "red-2", "red-4"]
    heavy = stomp_client(server)
    heavy.subscribe(queue, headers={"selector": "weight >= 30 AND color <> 'red'"})
    assert settle(heavy, 2) == ["green-3", "blue-5"]
    # what no selector matched is still there, in order, for a consumer without one
    rest = stomp_client(server)
    rest.subscribe(queue)
    assert settle(rest, 1) == ["blue-1"]
    # a NACKed message goes back for its selector's consumer, first in line
    reds.nack(reds.messages[0])
    reds.wait_messages(4)
    assert reds.messages[3].body == "red-0"
    assert reds.messages[3].headers["redelivered"] == "true"
    # new messages follow the same rule while consumers are attached; one nobody
    # attached matches waits for a consumer that does
    rest.disconnect()
    producer.send(queue, "late-red", color="red")
    producer.send(queue, "late-plain")
    reds.wait_body("late-red")
    time.sleep(0.3)
    assert "late-plain" not in reds.bodies() + heavy.bodies()
    again = stomp_client(server)
    again.subscribe(queue)
    assert settle(again, 1) == ["late-plain"]


def test_bad_selector_is_refused_naming_position_and_token(server, stomp_client):
    client = stomp_client(server)
    client.subscribe(f"/queue/{unique('bad')}", receipt=False,
                     headers={"selector": "color = 'red' AND AND weight > 1"})
    error = client.wait_error()
    message = error.headers["message"]
    assert "selector" in message and "AND" in message and "position" in message, message
    # the server keeps serving everyone else
    other = stomp_client(server)
    queue = f"/queue/{unique('ok')}"
    other.subscribe(queue)
    other.send(queue, "fine")
    other.wait_body("fine")


def test_topic_and_durable_subscriptions_keep_only_what_matches(server, stomp_client):
    topic = f"/topic/{unique('t')}"
    cid, name = unique("cid"), unique("sub")
    durable = stomp_client(server, headers={"client-id": cid})
    durable.subscribe(topic, id="d1", headers={"activemq.subscriptionName": name,
                                                "selector": "weight > 20"})
    reds = stomp_client(server)
    reds.subscribe(topic, headers={"selector": "color IN ('red', 'green') AND weight < 40"})
    everything = stomp_client(server)
    everything.subscribe(topic)
    producer = stomp_client(server)
    send_colours(producer, topic)
    assert settle(everything, 6) == [f"{c}-{i}" for i, c in enumerate(COLOURS)]
    assert settle(reds, 3) == ["red-0", "red-2", "green-3"]
    assert settle(durable, 3) == ["green-3", "red-4", "blue-5"]
    durable.disconnect()
    send_colours(producer, topic, persistent="true")  # kept while away: only what matches
    back = wait_until(lambda: _reconnect(stomp_client, server, cid), "client-id released", 5)
    back.subscribe(topic, id="d2", headers={"activemq.subscriptionName": name,
                                             "selector": "weight > 20"})
    assert settle(back, 3) == ["green-3", "red-4", "blue-5"]


def _reconnect(stomp_client, server, cid: str):
    client = stomp_client(server, connect=False)
    client.connect(headers={"client-id": cid}, expect_error=None)
    return client if client.listener.connected else None


def test_durable_subscriber_with_a_new_selector_keeps_only_what_it_matches(
        server, stomp_client):
    topic, cid, name = f"/topic/{unique('t')}", unique("cid"), unique("sub")
    subscriber = stomp_client(server, headers={"client-id": cid})
    subscriber.subscribe(topic, id="d", headers={"activemq.subscriptionName": name})
    subscriber.disconnect()
    producer = stomp_client(server)
    send_colours(producer, topic, persistent="true")
    back = wait_until(lambda: _reconnect(stomp_client, server, cid), "client-id released", 5)
    back.subscribe(topic, id="d", headers={"activemq.subscriptionName": name,
                                           "selector": "color = 'blue'"})
    assert settle(back, 2) == ["blue-1", "blue-5"]


def test_stream_subscription_skips_what_does_not_match(server, stomp_client):
    stream = f"/stream/{unique('s')}"
    producer = stomp_client(server)
    send_colours(producer, stream)
    plain = stomp_client(server)
    plain.subscribe(stream, ack="client", headers={
        "x-stream-offset": "first", "selector": "color = 'red' OR weight = 50",
        "prefetch-count": "2"})
    frames = plain.wait_messages(2)
    assert [f.headers["x-stream-offset"] for f in frames] == ["0", "2"]
    time.sleep(0.3)
    assert len(plain.messages) == 2  # the window counts delivered records only
    plain.ack(frames[-1])
    frames = plain.wait_messages(4)
    assert [f.headers["x-stream-offset"] for f in frames] == ["0", "2", "4", "5"]
    assert [f.body for f in frames] == ["red-0", "red-2", "red-4", "blue-5"]


def test_batched_stream_range_with_a_selector_before_and_after_a_kill(server_factory,
                                                                    raw_client):
    """x-stream-batch with a selector over 1,200 records (most of them older than what a
    stream keeps in memory, so read back from the journal): each record with its own
    offset, the range's end marker after them; the same after a kill -9."""
    server = server_factory()
    stream = f"/stream/{unique('s')}"
    c, _ = raw_client(server)
    for i in range(1200):
        headers = {"destination": stream, "n": str(i)}
        if i == 1199:
            c.request("SEND", headers, b"%d" % i)
        else:
            c.send_frame("SEND", headers, b"%d" % i)
    want = [0, 1, 2, *range(1190, 1200)]
    assert _filtered_range(raw_client, server, stream) == want
    server = restart(server)
    assert _filtered_range(raw_client, server, stream) == want


def _filtered_range(raw_client, server, stream: str) -> list[int]:
    reader, _ = raw_client(server)
    subscribe(reader, stream, "offset=0", ack="client", **{
        "x-stream-end-offset": "1200", "x-stream-batch": "50", "prefetch-count": "1000",
        "selector": "n < 3 OR n >= 1190"})
    found: list[int] = []
    while True:
        frame = reader.read_message(10)
        h = frame.headers
        if h.get("x-stream-end") == "true":
            assert h["x-stream-offset"] == "1200"
            return found
        records = decode_records(frame.body)
        assert int(h["x-stream-offset"]) == records[0][0]
        assert all(r[4] == b"%d" % r[0] for r in records)
        found.extend(r[0] for r in records)
        reader.request("ACK", {"id": h["ack"]})


def test_temporary_queue_consumer_with_a_selector(server, stomp_client):
    """A connection's own temporary queue (RabbitMQ's /temp-queue/) filters as a queue."""
    owner = stomp_client(server)
    owner.subscribe("/temp-queue/replies", id="picky", headers={"selector": "ok = TRUE"})
    for body, ok in (("no", "false"), ("yes", "true"), ("none", None)):
        headers = {} if ok is None else {"ok": ok}
        owner.send("/temp-queue/replies", body, **headers)
    assert settle(owner, 1) == ["yes"]
