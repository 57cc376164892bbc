"""Streams as RabbitMQ's STOMP users read them (RabbitMQ 3.9+), against a real server with
stomp.py, headers written as RabbitMQ's documentation writes them: `/amq/queue/NAME` with
`x-queue-type:stream`, `x-stream-offset` (first, last, next, offset=N, timestamp=T in
seconds, and pairmq's ms), the offset on every MESSAGE, and stream filtering
(docs/streams.md, "RabbitMQ's names")."""

from __future__ import annotations

import time

from tests.integration.clients import Client
from tests.integration.rawstomp import unique
from tests.support.servers import shared_server

# One server for every test here (each names its own streams).
server = shared_server("rabbitmq-streams")


def stream_names() -> tuple[str, str]:
    """(`/amq/queue/NAME`, `/stream/NAME`) of a new stream."""
    name = unique("s")
    return f"/amq/queue/{name}", f"/stream/{name}"


def rabbit_subscribe(client: Client, destination: str, offset: str = "next",
                     **headers: str) -> str:
    """SUBSCRIBE as RabbitMQ's STOMP guide shows it for a stream."""
    return client.subscribe(destination, ack="client", headers={
        "x-queue-type": "stream", "prefetch-count": "10", "x-stream-offset": offset,
        **headers})


def offsets(messages) -> list[int]:
    return [int(m.headers["x-stream-offset"]) for m in messages]


def exactly(client: Client, count: int) -> list:
    """The first `count` messages, checking that no more come."""
    got = client.wait_messages(count)
    time.sleep(0.3)
    assert len(client.messages) == count, client.bodies()
    return got


def test_amq_queue_with_x_queue_type_stream_is_the_stream(server, stomp_client):
    amq, stream = stream_names()
    reader = stomp_client(server)
    rabbit_subscribe(reader, amq, "first")  # makes the stream
    producer = stomp_client(server)
    producer.send(stream, "by its pairmq name")
    producer.send(amq, "by its RabbitMQ name")  # appends to the stream, as RabbitMQ does
    got = reader.wait_messages(2)
    assert [m.body for m in got] == ["by its pairmq name", "by its RabbitMQ name"]
    assert offsets(got) == [0, 1]
    assert {m.headers["destination"] for m in got} == {stream}
    assert all(int(m.headers["timestamp"]) > 0 for m in got)
    reader.ack(got[-1])
    other = stomp_client(server)
    other.subscribe(stream, headers={"x-stream-offset": "first"})
    assert offsets(other.wait_messages(2)) == [0, 1]


def test_amq_queue_without_a_stream_is_the_queue(server, stomp_client):
    name = unique("q")
    producer = stomp_client(server)
    producer.send(f"/amq/queue/{name}", "to the queue")
    consumer = stomp_client(server)
    sub = consumer.subscribe(f"/queue/{name}")
    (message,) = consumer.wait_messages(1)
    assert message.headers["destination"] == f"/queue/{name}"
    assert "x-stream-offset" not in message.headers
    consumer.unsubscribe(sub)
    rabbit = stomp_client(server)
    rabbit.subscribe(f"/amq/queue/{name}")  # no x-queue-type, no stream: the queue
    producer.send(f"/queue/{name}", "second")
    assert rabbit.wait_messages(1)[0].headers["destination"] == f"/queue/{name}"


def test_x_stream_offset_first_last_next_and_offset(server, stomp_client):
    amq, stream = stream_names()
    producer = stomp_client(server)
    for i in range(4):
        producer.send(amq if i % 2 else stream, f"m{i}")
    readers = {}
    for offset in ("first", "last", "next", "offset=2"):
        readers[offset] = stomp_client(server)
        rabbit_subscribe(readers[offset], amq, offset)
    producer.send(amq, "m4")
    assert offsets(exactly(readers["first"], 5)) == [0, 1, 2, 3, 4]
    assert offsets(exactly(readers["last"], 2)) == [3, 4]
    assert offsets(exactly(readers["next"], 1)) == [4]
    assert offsets(exactly(readers["offset=2"], 3)) == [2, 3, 4]


def test_x_stream_offset_timestamp_in_seconds_or_ms(server, stomp_client):
    amq, stream = stream_names()
    producer = stomp_client(server)
    producer.send(stream, "early 0")
    producer.send(stream, "early 1")
    boundary = int(time.time()) + 1  # the next whole second
    time.sleep(boundary + 0.05 - time.time())
    producer.send(stream, "late 0")
    producer.send(stream, "late 1")
    everything = stomp_client(server)
    rabbit_subscribe(everything, amq, "first")
    stamps = [int(m.headers["timestamp"]) for m in everything.wait_messages(4)]
    assert stamps[1] < boundary * 1000 <= stamps[2]
    seconds = stomp_client(server)  # RabbitMQ: seconds since the epoch
    rabbit_subscribe(seconds, amq, f"timestamp={boundary}")
    assert [m.body for m in exactly(seconds, 2)] == ["late 0", "late 1"]
    ms = stomp_client(server)  # pairmq's own: ms since the epoch
    rabbit_subscribe(ms, amq, f"timestamp={stamps[3]}")
    first = next(i for i, stamp in enumerate(stamps) if stamp >= stamps[3])
    assert offsets(exactly(ms, 4 - first)) == list(range(first, 4))


def test_a_filter_value_is_kept_as_a_header_of_the_record(server, stomp_client):
    amq, _ = stream_names()
    reader = stomp_client(server)
    rabbit_subscribe(reader, amq, "first")  # makes the stream
    stomp_client(server).send(amq, "sunny", **{"x-stream-filter-value": "california"})
    (record,) = reader.wait_messages(1)
    assert record.headers["x-stream-filter-value"] == "california"
    assert record.headers["x-stream-offset"] == "0"


# -- stream filtering (RabbitMQ 3.13), as RabbitMQ's STOMP guide describes it -------------------

STATES = ["california", "texas", None, "california", "texas", None, "california"]


def publish_states(client: Client, destination: str) -> None:
    """SEND with x-stream-filter-value:california / texas / none (no header)."""
    for i, state in enumerate(STATES):
        headers = {} if state is None else {"x-stream-filter-value": state}
        client.send(destination, f"{state or 'unfiltered'} {i}", **headers)


def test_x_stream_filter_delivers_exactly_the_matching_records(server, stomp_client):
    amq, _ = stream_names()
    reader = stomp_client(server)  # the stream is made by this subscription (RabbitMQ's way)
    rabbit_subscribe(reader, amq, "first", **{"x-stream-filter": "california"})
    publish_states(stomp_client(server), amq)
    wanted = [i for i, state in enumerate(STATES) if state == "california"]
    got = exactly(reader, len(wanted))
    assert offsets(got) == wanted
    assert [m.body for m in got] == [f"california {i}" for i in wanted]
    assert {m.headers["x-stream-filter-value"] for m in got} == {"california"}


def test_x_stream_match_unfiltered_adds_the_records_without_a_value(server, stomp_client):
    amq, stream = stream_names()
    publish_states(stomp_client(server), stream)  # made by its first SEND, read from first
    reader = stomp_client(server)
    rabbit_subscribe(reader, amq, "first", **{"x-stream-filter": "california",
                                             "x-stream-match-unfiltered": "true"})
    wanted = [i for i, state in enumerate(STATES) if state in ("california", None)]
    got = exactly(reader, len(wanted))
    assert offsets(got) == wanted
    assert [m.body for m in got] == [f"{STATES[i] or 'unfiltered'} {i}" for i in wanted]
