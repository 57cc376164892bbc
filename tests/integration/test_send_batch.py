"""The batched SEND (`pairmq-batch: K`, docs/stomp.md) against a real server: K messages packed
in one frame's body (pairmq.protocol.batch.encode_send_records), sent by a third-party
client (stomp.py) or byte for byte (rawstomp). Each record becomes one message to the
frame's destination with the frame's headers and its own over them; each dup-id counts on
its own; one RECEIPT once all are on disk (they survive a kill -9); admission is all or
nothing; a malformed batch gets an ERROR naming the problem while other connections carry
on; to a stream, the records get consecutive offsets."""

from __future__ import annotations

import pytest

from pairmq.protocol.batch import MAX_SEND_BATCH, SEND_HEAD, encode_send_records
from tests.integration.clients import Client
from tests.integration.rawstomp import Frame, RawStomp, unique
from tests.serverproc import free_port
from tests.support.admin import admin_status, admin_user_flags
from tests.support.servers import restart
from tests.support.waiting import wait_until

P = {"persistent": "true"}
K = 50


def records(count: int, start: int = 0, prefix: str = "d") -> list[tuple[dict[str, str], bytes]]:
    """`count` records: dup-id PREFIX<i>, n:<i>, every even one overrides the frame's
    `color`, and one header value that needs escaping; body `body-<i>`."""
    out = []
    for i in range(start, start + count):
        own = {"dup-id": f"{prefix}{i}", "n": str(i), "odd": f"a:b\\c{i}"}
        if i % 2 == 0:
            own["color"] = f"own-{i}"
        out.append((own, f"body-{i}".encode()))
    return out


def batch_headers(destination: str, count: int, **more: str) -> dict[str, str]:
    return {"destination": destination, **P, "pairmq-batch": str(count), "color": "frame",
            "shared": "yes", **more}


def send_batch(client: Client, destination: str, recs: list, **more: str) -> None:
    """One batched SEND through stomp.py, waiting for its RECEIPT (an ERROR fails)."""
    headers = batch_headers(destination, len(recs), **more)
    headers.pop("destination")
    client.send(destination, encode_send_records(recs), **headers)


def until_marker(client: Client, marker: str, already: int = 0) -> list:
    """Every message after the first `already` up to and including the one with body
    `marker` (sent after everything else, so nothing sent before it can come later)."""
    client.wait_body(marker)
    messages = list(client.messages)
    bodies = [m.body for m in messages]
    assert bodies.count(marker) == 1, bodies
    return messages[already:bodies.index(marker) + 1]


def check_delivered(messages: list, start: int, count: int, destination: str) -> None:
    """`messages` are records start..start+count-1, in order, with the merged headers."""
    assert [m.body for m in messages] == [f"body-{i}" for i in range(start, start + count)]
    for i, m in zip(range(start, start + count), messages, strict=True):
        h = m.headers
        assert h["dup-id"] == f"d{i}" and h["n"] == str(i)
        assert h["shared"] == "yes", "a frame header is on every message"
        assert h["color"] == (f"own-{i}" if i % 2 == 0 else "frame"), \
            "a record's own header wins over the frame's"
        assert h["odd"] == f"a:b\\c{i}", "an escaped record header comes back as sent"
        assert h["destination"] == destination and h["persistent"] == "true"
        assert "pairmq-batch" not in h, "pairmq-batch describes the frame, not its messages"
        assert "receipt" not in h


# ----------------------------------------------------------------------------- delivery


def test_one_batched_send_from_stomp_py_is_k_messages_in_order_with_merged_headers(
        server, stomp_client):
    queue = f"/queue/{unique('sb')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    producer = stomp_client(server)
    send_batch(producer, queue, records(K))
    producer.send(queue, "marker", persistent="true")
    got = until_marker(consumer, "marker")
    assert len(got) == K + 1, [m.body for m in got]
    check_delivered(got[:K], 0, K, queue)
    assert len({m.headers["message-id"] for m in got[:K]}) == K, "one message per record"


def test_the_same_batch_again_is_receipted_and_delivers_nothing_new(server, stomp_client):
    queue = f"/queue/{unique('sbdup')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    producer = stomp_client(server)
    send_batch(producer, queue, records(K))
    producer.send(queue, "first marker", persistent="true")
    check_delivered(until_marker(consumer, "first marker")[:-1], 0, K, queue)

    again = stomp_client(server)  # a producer that never saw its RECEIPT sends it again
    send_batch(again, queue, records(K))  # RECEIPT, no ERROR
    # Overlapping: 10 known dup-ids, then 10 new ones: only the new ones are delivered.
    send_batch(again, queue, records(20, start=K - 10))
    # A record repeating a dup-id of the same batch: delivered once.
    send_batch(again, queue, [*records(2, start=100), *records(1, start=100)])
    again.send(queue, "second marker", persistent="true")
    got = until_marker(consumer, "second marker", already=K + 1)
    assert [m.body for m in got] == [*(f"body-{i}" for i in range(K, K + 10)),
                                     "body-100", "body-101", "second marker"]
    check_delivered(got[:10], K, 10, queue)


def test_after_the_receipt_a_kill_9_loses_nothing_and_doubles_nothing(server_factory,
                                                                      stomp_client):
    srv = server_factory()
    queue = f"/queue/{unique('sbkill')}"
    producer = stomp_client(srv)
    send_batch(producer, queue, records(K))  # waits for the RECEIPT

    srv = restart(srv)
    again = stomp_client(srv)
    send_batch(again, queue, records(K))  # the dup-ids were journaled with the messages
    again.send(queue, "marker", persistent="true")
    consumer = stomp_client(srv)
    consumer.subscribe(queue)
    got = until_marker(consumer, "marker")
    assert len(got) == K + 1, [m.body for m in got]
    check_delivered(got[:K], 0, K, queue)


def test_in_a_transaction_the_batch_waits_for_commit_and_abort_drops_it(server,
                                                                         stomp_client):
    queue = f"/queue/{unique('sbtx')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    producer = stomp_client(server)
    producer.begin("t1")
    send_batch(producer, queue, records(5), transaction="t1")
    producer.begin("t2")
    send_batch(producer, queue, records(5, start=5), transaction="t2")
    stomp_client(server).send(queue, "outside", persistent="true")
    assert [m.body for m in until_marker(consumer, "outside")] == ["outside"]
    producer.abort("t2")
    producer.commit("t1")
    producer.send(queue, "marker", persistent="true")
    got = until_marker(consumer, "marker", already=1)
    assert [m.body for m in got] == [*(f"body-{i}" for i in range(5)), "marker"]
    assert "transaction" not in got[0].headers


# ----------------------------------------------------------------------------- admission


def test_a_full_destination_refuses_the_whole_batch(server_factory, raw_client):
    """address_full_policy fail: a batch to a full queue is refused as a whole (nothing of
    it stored), but one made only of messages already there is receipted."""
    srv = server_factory("--address-full-policy", "fail", "--max-size-bytes", "20000")
    queue = f"/queue/{unique('sbfull')}"
    producer, _ = raw_client(srv)
    stored = 0
    error: Frame | None = None
    while error is None:  # batches of 5 x 1 KiB until the queue is full
        assert stored < 100, "the queue never filled up"
        recs = [({"dup-id": f"d{i}"}, b"x" * 1024) for i in range(stored, stored + 5)]
        producer.send_frame("SEND", {"destination": queue, **P, "pairmq-batch": "5",
                                     "receipt": f"r{stored}"}, encode_send_records(recs))
        frame = producer.read_frame()
        if frame.command == "ERROR":
            error = frame
        else:
            assert frame.headers["receipt-id"] == f"r{stored}"
            stored += 5
    assert queue in error.headers["message"] and "full" in error.headers["message"]

    resender, _ = raw_client(srv)
    known = [({"dup-id": f"d{i}"}, b"x" * 1024) for i in range(3)]
    resender.request("SEND", {"destination": queue, **P, "pairmq-batch": "3"},
                     encode_send_records(known))
    mixed, _ = raw_client(srv)
    mixed.send_frame("SEND", {"destination": queue, **P, "pairmq-batch": "3", "receipt": "m"},
                     encode_send_records([known[0], ({"dup-id": "new"}, b"new"), known[1]]))
    (refusal,) = mixed.read_until_closed()
    assert refusal.command == "ERROR" and "full" in refusal.headers["message"]

    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s"})
    got = [consumer.read_message().headers["dup-id"] for _ in range(stored)]
    assert got == [f"d{i}" for i in range(stored)]
    with pytest.raises(TimeoutError):
        consumer.read_message(0.5)  # neither the refused batch nor "new"


def test_a_full_destination_holds_the_whole_batch_until_there_is_room(server_factory,
                                                                      raw_client):
    """address_full_policy block: a batch to a full queue waits, none of it taken, until a
    consumer makes room; then all of it is taken, once, and receipted."""
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--address-full-policy", "block", "--max-size-bytes", "20000",
                         "--admin", admin, *admin_user_flags())
    queue = f"/queue/{unique('sbblock')}"

    def destination() -> dict:
        status = wait_until(lambda: admin_status(admin), "GET /status", 10)
        return status["destinations"].get(queue, {})

    def kib(first: int, count: int) -> bytes:
        return encode_send_records([({"dup-id": f"d{i}"}, b"x" * 1024)
                                    for i in range(first, first + count)])

    producer, _ = raw_client(srv)
    stored = 0
    while destination().get("state") != "full":  # a batch is taken whole while open
        assert stored < 100, "the queue never filled up"
        producer.request("SEND", {"destination": queue, **P, "pairmq-batch": "5"}, kib(stored, 5))
        stored += 5
    producer.send_frame("SEND", {"destination": queue, **P, "pairmq-batch": "5",
                                 "receipt": "held"}, kib(stored, 5))
    with pytest.raises(TimeoutError):
        producer.read_frame(0.5)  # no RECEIPT while the queue is full
    resender, _ = raw_client(srv)  # only known messages: answered even now
    resender.request("SEND", {"destination": queue, **P, "pairmq-batch": "3"}, kib(0, 3))
    assert destination()["messages"] == stored, "part of the held batch was taken"

    consumer, _ = raw_client(srv)
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "s"})
    got = [consumer.read_message().headers["dup-id"] for _ in range(stored + 5)]
    assert got == [f"d{i}" for i in range(stored + 5)]
    assert producer.wait_receipt("held").headers["receipt-id"] == "held"
    with pytest.raises(TimeoutError):
        consumer.read_message(0.5)


# ----------------------------------------------------------------------------- bad input


def body_of(count: int) -> bytes:
    return encode_send_records(records(count, prefix="bad"))


BAD = {
    "count mismatch, fewer": ({"pairmq-batch": "5"}, body_of(3),
                              ["packs 3 messages", "pairmq-batch", "says 5"]),
    "count mismatch, more": ({"pairmq-batch": "2"}, body_of(3),
                             ["packs 3 messages", "pairmq-batch", "says 2"]),
    "truncated body": ({"pairmq-batch": "3"}, body_of(3)[:-4], ["message 3", "runs past the body"]),
    "cut in a record header": ({"pairmq-batch": "3"}, body_of(2) + b"\x05\x00\x00",
                               ["cut inside the header", "message 3"]),
    "pairmq-batch 0": ({"pairmq-batch": "0"}, body_of(1), ["pairmq-batch", "from 1 to", "'0'"]),
    "pairmq-batch abc": ({"pairmq-batch": "abc"}, body_of(1), ["pairmq-batch", "integer", "'abc'"]),
    "pairmq-batch too big": ({"pairmq-batch": str(MAX_SEND_BATCH + 1)}, body_of(1),
                        ["pairmq-batch", str(MAX_SEND_BATCH), f"'{MAX_SEND_BATCH + 1}'"]),
    "frame dup-id": ({"pairmq-batch": "3", "dup-id": "frame-level"}, body_of(3),
                     ["dup-id", "per message", "not on the frame"]),
    "record header without a colon": ({"pairmq-batch": "2"}, body_of(1) + SEND_HEAD.pack(8, 1)
                                      + b"nocolon\nx", ["header line without a colon",
                                                         "nocolon"]),
    "record with a bad priority": ({"pairmq-batch": "3"}, encode_send_records(
        [*records(1, prefix="bad"), ({"priority": "high"}, b"x"), *records(1, prefix="bad")]),
        ["priority", "'high'"]),
}


def test_a_malformed_batch_gets_an_error_naming_it_and_other_connections_carry_on(
        server, raw_client):
    queue = f"/queue/{unique('sbbad')}"
    healthy, _ = raw_client(server)
    healthy.request("SUBSCRIBE", {"destination": queue, "id": "s"})
    sent = 0
    for case, (headers, body, words) in BAD.items():
        bad, _ = raw_client(server)
        bad.send_frame("SEND", {"destination": queue, **P, **headers, "receipt": "bad"},
                       body)
        frames = bad.read_until_closed()  # the ERROR, then the server closes
        assert [f.command for f in frames] == ["ERROR"], (case, frames)
        error = frames[0]
        assert error.headers["receipt-id"] == "bad", case
        message = error.headers["message"]
        for word in words:
            assert word in message, (case, message)
        # The healthy connection sends a batch and receives it, as if nothing happened.
        healthy.request("SEND", {"destination": queue, **P, "pairmq-batch": "2"},
                        encode_send_records(records(2, start=sent)))
        got = [healthy.read_message() for _ in range(2)]
        assert [m.text for m in got] == [f"body-{sent}", f"body-{sent + 1}"], case
        sent += 2
    assert server.alive()
    with pytest.raises(TimeoutError):  # nothing of any bad batch was stored
        healthy.read_message(0.5)


# ----------------------------------------------------------------------------- streams


def test_a_batch_to_a_stream_gets_consecutive_offsets(server, stomp_client, raw_client):
    stream = f"/stream/{unique('sbs')}"
    producer = stomp_client(server)
    send_batch(producer, stream, records(K))
    send_batch(producer, stream, records(3, start=K))
    send_batch(producer, stream, records(3, start=K))  # duplicates: no offsets taken
    producer.send(stream, "marker")
    reader = stomp_client(server)
    reader.subscribe(stream, headers={"x-stream-offset": "first"})
    got = until_marker(reader, "marker")
    assert [int(m.headers["x-stream-offset"]) for m in got] == list(range(K + 4))
    check_delivered(got[:K + 3], 0, K + 3, stream)
    stamps = [int(m.headers["timestamp"]) for m in got]
    assert stamps == sorted(stamps) and stamps[0] > 0

    raw, _ = raw_client(server)  # what the server says the stream holds
    receipt = raw.request("SUBSCRIBE", {"destination": stream, "id": "i",
                                        "x-stream-offset": "next"})
    assert receipt.headers["x-stream-first-offset"] == "0"
    assert receipt.headers["x-stream-next-offset"] == str(K + 4)


def test_a_batch_to_a_topic_reaches_every_subscriber_with_one_receipt(server, raw_client):
    topic = f"/topic/{unique('sbt')}"
    subscribers: list[RawStomp] = []
    for i in range(2):
        sub, _ = raw_client(server)
        sub.request("SUBSCRIBE", {"destination": topic, "id": f"t{i}"})
        subscribers.append(sub)
    producer, _ = raw_client(server)
    producer.send_frame("SEND", {**batch_headers(topic, 4), "receipt": "batch"},
                        encode_send_records(records(4)))
    producer.send_frame("SEND", {"destination": topic, "receipt": "single"}, "single")
    answers = [producer.read_frame(), producer.read_frame()]
    assert [(f.command, f.headers["receipt-id"]) for f in answers] == [
        ("RECEIPT", "batch"), ("RECEIPT", "single")], "one RECEIPT for the whole frame"
    for sub in subscribers:
        got = [sub.read_message() for _ in range(4)]
        assert [m.text for m in got] == [f"body-{i}" for i in range(4)]
        assert [m.headers["color"] for m in got] == ["own-0", "frame", "own-2", "frame"]
