"""Durability across crashes: what a client was told is safe survives a SIGKILL of the server.

Persistent messages (queues and durable topic subscriptions, both the ActiveMQ and the
RabbitMQ conventions), their acknowledgements, committed transactions, in-flight
messages (back as redelivered, delivery-count incremented), durable subscriptions and
destinations created at run time come back after `kill -9` and a restart on the same
data directory. Uncommitted transactions and non-persistent messages do not (documented).
A clean stop (SIGTERM) keeps the same state. A RECEIPT is sent only once the record is on
disk: with the filesystem frozen none arrives, and the server keeps serving meanwhile.
"""

from __future__ import annotations

import time

import pytest

from tests.integration import rawstomp
from tests.integration.rawstomp import RawStomp, unique
from tests.support.cli import run
from tests.support.servers import restart

P = {"persistent": "true"}


# ----------------------------------------------------------------------------- helpers


def send(client: RawStomp, destination: str, body: bytes | str = b"", **headers: str) -> None:
    """A SEND with a receipt, waited for."""
    client.request("SEND", {"destination": destination, **headers}, body)


def subscribe(client: RawStomp, destination: str, sub_id: str = "s", ack: str = "auto",
              **headers: str) -> None:
    client.request("SUBSCRIBE", {"destination": destination, "id": sub_id, "ack": ack,
                                 **headers})


def messages(client: RawStomp, count: int, timeout: float = 5.0) -> list[rawstomp.Frame]:
    return [client.read_message(timeout) for _ in range(count)]


def bodies(frames: list[rawstomp.Frame]) -> list[bytes]:
    return [f.body for f in frames]


def ack(client: RawStomp, frame: rawstomp.Frame, **headers: str) -> None:
    client.request("ACK", {"id": frame.headers["ack"], **headers})


# ----------------------------------------------------------------------------- queues


def test_persistent_messages_survive_sigkill_byte_for_byte(server_factory, raw_client):
    srv = server_factory()
    queue = f"/queue/{unique('dur')}"
    payloads = [b"plain", b"bin\x00ary\xff\r\n", "\u00fcn\u00efc\u00f6d\u00e9".encode(),
                bytes(range(256)) * 400, b""]
    producer, _ = raw_client(srv)
    for i, body in enumerate(payloads):
        # Headers with escapes are journaled escaped; plain ones are decoded lazily after a
        # restart (on first delivery): both must come back exactly.
        odd = {"x-odd": "a:b\\c\nd\re"} if i % 2 == 0 else {"x-plain": "just text"}
        send(producer, queue, body, **P, **{"x-seq": str(i), **odd,
                                            "content-type": "application/octet-stream"})

    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack="client-individual")
    got = messages(consumer, len(payloads))
    consumer.assert_quiet()
    assert bodies(got) == payloads
    for i, frame in enumerate(got):
        h = frame.headers
        assert h["x-seq"] == str(i)
        if i % 2 == 0:
            assert h["x-odd"] == "a:b\\c\nd\re" and "x-plain" not in h
        else:
            assert h["x-plain"] == "just text" and "x-odd" not in h
        assert h["content-type"] == "application/octet-stream"
        assert h["persistent"] == "true"
        assert h["destination"] == queue
        assert h["delivery-count"] == "1", "never delivered before the crash"
        assert "redelivered" not in h
        assert h["timestamp"].isdigit()
        assert h["content-length"] == str(len(payloads[i]))
    assert len({f.headers["message-id"] for f in got}) == len(payloads)


def test_priority_order_survives_sigkill(server_factory, raw_client):
    srv = server_factory()
    queue = f"/queue/{unique('prio')}"
    producer, _ = raw_client(srv)
    sent = [("1", "a"), ("9", "b"), ("4", "c"), ("9", "d"), ("0", "e"), ("4", "f")]
    for priority, body in sent:
        send(producer, queue, body, priority=priority, **P)
    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue)
    assert bodies(messages(consumer, 6)) == [b"b", b"d", b"c", b"f", b"a", b"e"]


@pytest.mark.parametrize("mode", ["client-individual", "client"])
def test_acknowledged_messages_do_not_come_back_after_sigkill(server_factory, raw_client, mode):
    srv = server_factory()
    queue = f"/queue/{unique('ack')}"
    producer, _ = raw_client(srv)
    for i in range(10):
        send(producer, queue, f"m{i}", **P)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack=mode)
    got = messages(consumer, 10)
    if mode == "client":
        ack(consumer, got[3])  # cumulative: m0..m3
    else:
        for frame in got[:4]:
            ack(consumer, frame)

    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack="client-individual")
    again = messages(consumer, 6)
    consumer.assert_quiet()
    assert bodies(again) == [f"m{i}".encode() for i in range(4, 10)]
    # They were in flight (delivered, not acknowledged) when the server died.
    assert [f.headers.get("redelivered") for f in again] == ["true"] * 6
    assert [f.headers["delivery-count"] for f in again] == ["2"] * 6
    assert [f.headers["message-id"] for f in again] == [f.headers["message-id"]
                                                        for f in got[4:]]


def test_auto_acknowledged_messages_do_not_come_back_after_sigkill(server_factory, raw_client):
    srv = server_factory()
    queue = f"/queue/{unique('auto')}"
    producer, _ = raw_client(srv)
    for i in range(5):
        send(producer, queue, f"gone{i}", **P)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue)
    assert bodies(messages(consumer, 5)) == [f"gone{i}".encode() for i in range(5)]
    consumer.request("UNSUBSCRIBE", {"id": "s"})  # its receipt follows the removals' records
    for i in range(3):
        send(producer, queue, f"kept{i}", **P)

    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue)
    assert bodies(messages(consumer, 3)) == [f"kept{i}".encode() for i in range(3)]
    consumer.assert_quiet()


def test_in_flight_messages_come_back_redelivered_with_a_higher_delivery_count(
        server_factory, raw_client):
    srv = server_factory()
    queue = f"/queue/{unique('flight')}"
    producer, _ = raw_client(srv)
    for i in range(5):
        send(producer, queue, f"m{i}", **P)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack="client-individual", **{"prefetch-count": "3"})
    first = messages(consumer, 3)
    ack(consumer, first[0])  # frees a slot: m3 is delivered before this ACK's receipt
    m3 = consumer.read_message()
    assert m3.body == b"m3"
    before = {f.body: f.headers["message-id"] for f in [*first[1:], m3]}

    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack="client-individual")
    got = messages(consumer, 4)
    consumer.assert_quiet()
    assert bodies(got) == [b"m1", b"m2", b"m3", b"m4"]
    for frame in got[:3]:
        assert frame.headers.get("redelivered") == "true", frame
        assert frame.headers["delivery-count"] == "2", frame
        assert frame.headers["message-id"] == before[frame.body]
    assert "redelivered" not in got[3].headers, "m4 was never delivered"
    assert got[3].headers["delivery-count"] == "1"

    # Crashed again while they were in flight a second time: the count keeps growing.
    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack="client-individual")
    got = messages(consumer, 4)
    assert bodies(got) == [b"m1", b"m2", b"m3", b"m4"]
    assert [f.headers["delivery-count"] for f in got] == ["3", "3", "3", "2"]
    assert all(f.headers.get("redelivered") == "true" for f in got)
    for frame in got:
        ack(consumer, frame)

    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue)
    consumer.assert_quiet()


def test_in_flight_message_stays_redelivered_when_its_segment_was_compacted(
        server_factory, raw_client):
    """The delivery of a long-lived in-flight message must survive compaction of the
    segment that recorded it: after a crash it still comes back redelivered:true."""
    flags = ("--segment-bytes", "65536")
    srv = server_factory(*flags)
    journal = srv.data_dir / "journal"
    queue, filler = f"/queue/{unique('slow')}", f"/queue/{unique('fill')}"
    producer, _ = raw_client(srv)
    send(producer, queue, "long-lived", **P)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack="client-individual")
    in_flight = consumer.read_message()
    for _ in range(20):  # roll to a second segment
        send(producer, filler, "f" * 10000, **P)
        if (journal / "journal-00000002.seg").exists():
            break
    drainer, _ = raw_client(srv)
    subscribe(drainer, filler)
    while True:  # everything but the in-flight message is consumed
        try:
            drainer.read_message(0.3)
        except TimeoutError:
            break
    deadline = time.monotonic() + 10
    while (journal / "journal-00000001.seg").exists():
        assert time.monotonic() < deadline, "the first segment was never compacted away"
        send(producer, filler, "nudge", **P)  # each journal write may start compaction
        drainer.read_message()
        time.sleep(0.05)

    srv = restart(srv, *flags)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue, ack="client-individual")
    again = consumer.read_message()
    assert again.body == b"long-lived"
    assert again.headers["message-id"] == in_flight.headers["message-id"]
    assert again.headers.get("redelivered") == "true", again
    assert again.headers["delivery-count"] == "2", again


def test_dead_lettered_message_survives_sigkill_in_its_dead_letter_queue(
        server_factory, raw_client):
    flags = ("--max-delivery-attempts", "1")
    srv = server_factory(*flags)
    name = unique("dlq")
    producer, _ = raw_client(srv)
    send(producer, f"/queue/{name}", "poison", **P, **{"x-keep": "yes"})
    consumer, _ = raw_client(srv)
    subscribe(consumer, f"/queue/{name}", ack="client-individual")
    frame = consumer.read_message()
    consumer.request("NACK", {"id": frame.headers["ack"]})

    srv = restart(srv, *flags)
    consumer, _ = raw_client(srv)
    subscribe(consumer, f"/queue/{name}", sub_id="orig")
    subscribe(consumer, f"/queue/DLQ.{name}", sub_id="dlq")
    dead = consumer.read_message()
    assert dead.headers["subscription"] == "dlq"
    assert dead.body == b"poison"
    assert dead.headers["dead-letter-reason"] == "max-delivery-attempts"
    assert dead.headers["original-destination"] == f"/queue/{name}"
    assert dead.headers["x-keep"] == "yes"
    consumer.assert_quiet()


def test_non_persistent_messages_are_lost_on_a_crash_and_persistent_ones_are_not(
        server_factory, raw_client):
    """Documented: only persistent:true messages are journaled."""
    srv = server_factory()
    queue = f"/queue/{unique('np')}"
    producer, _ = raw_client(srv)
    for i in range(3):
        send(producer, queue, f"p{i}", **P)
        send(producer, queue, f"np{i}")
        send(producer, queue, f"false{i}", persistent="false")
    srv = restart(srv)
    consumer, _ = raw_client(srv)
    subscribe(consumer, queue)
    assert bodies(messages(consumer, 3)) == [b"p0", b"p1", b"p2"]
    consumer.assert_quiet()


# ----------------------------------------------------------------------------- transactions


def test_committed_transactions_survive_sigkill_and_uncommitted_ones_vanish(
        server_factory, raw_client):
    srv = server_factory()
    sends, acks = f"/queue/{unique('txs')}", f"/queue/{unique('txa')}"
    producer, _ = raw_client(srv)
    for i in range(4):
        send(producer, acks, f"a{i}", **P)

    producer.request("BEGIN", {"transaction": "t1"})
    for i in range(3):
        send(producer, sends, f"committed{i}", transaction="t1", **P)
    producer.request("COMMIT", {"transaction": "t1"})
    producer.request("BEGIN", {"transaction": "t2"})
    send(producer, sends, "aborted", transaction="t2", **P)
    producer.request("ABORT", {"transaction": "t2"})
    producer.request("BEGIN", {"transaction": "t3"})
    for i in range(2):
        send(producer, sends, f"open{i}", transaction="t3", **P)  # never committed

    consumer, _ = raw_client(srv)
    subscribe(consumer, acks, ack="client-individual")
    got = messages(consumer, 4)
    consumer.request("BEGIN", {"transaction": "ta"})
    ack(consumer, got[0], transaction="ta")
    ack(consumer, got[1], transaction="ta")
    consumer.request("COMMIT", {"transaction": "ta"})
    consumer.request("BEGIN", {"transaction": "tb"})
    ack(consumer, got[2], transaction="tb")  # never committed

    srv = restart(srv)
    client, _ = raw_client(srv)
    subscribe(client, sends, sub_id="sends")
    assert bodies(messages(client, 3)) == [f"committed{i}".encode() for i in range(3)]
    client.assert_quiet()
    subscribe(client, acks, sub_id="acks", ack="client-individual")
    rest = messages(client, 2)
    assert bodies(rest) == [b"a2", b"a3"]
    assert all(f.headers.get("redelivered") == "true" for f in rest)
    client.assert_quiet()


# ----------------------------------------------------------------------------- durable topics


def test_activemq_durable_subscriptions_and_backlog_survive_sigkill(server_factory,
                                                                     stomp_client):
    srv = server_factory()
    topic, cid = f"/topic/{unique('amq')}", unique("cid")
    acked, auto = unique("subA"), unique("subB")
    sub = stomp_client(srv, headers={"client-id": cid})
    sub.subscribe(topic, id="a", ack="client-individual",
                  headers={"activemq.subscriptionName": acked})
    sub.subscribe(topic, id="b", headers={"activemq.subscriptionName": auto})
    producer = stomp_client(srv)
    producer.send(topic, "live", persistent="true")
    live = [m for m in sub.wait_messages(2) if m.headers["subscription"] == "a"]
    sub.ack(live[0])
    sub.unsubscribe("a")  # a plain UNSUBSCRIBE keeps the durable subscription
    sub.unsubscribe("b")
    sub.disconnect()
    for i in range(5):
        producer.send(topic, f"away-{i}", persistent="true")
    producer.send(topic, "not persistent")

    srv = restart(srv)
    producer = stomp_client(srv)
    stranger = stomp_client(srv, headers={"client-id": unique("cid")})
    stranger.subscribe(topic, id="x", headers={"activemq.subscriptionName": acked})
    sub = stomp_client(srv, headers={"client-id": cid})
    sub.subscribe(topic, id="a2", ack="client-individual",
                  headers={"activemq.subscriptionName": acked})
    got = sub.wait_messages(5)
    assert [m.body for m in got] == [f"away-{i}" for i in range(5)]
    assert all(m.headers["subscription"] == "a2" for m in got)
    assert all(m.headers["delivery-count"] == "1" for m in got)
    sub.subscribe(topic, id="b2", headers={"activemq.subscriptionName": auto})
    sub.wait_messages(10)
    producer.send(topic, "after", persistent="true")
    sub.wait_messages(12)
    by_sub: dict[str, list[str]] = {"a2": [], "b2": []}
    for m in sub.messages:
        by_sub[m.headers["subscription"]].append(m.body)
    expected = [f"away-{i}" for i in range(5)] + ["after"]
    assert by_sub == {"a2": expected, "b2": expected}
    stranger.wait_body("after")
    assert stranger.bodies() == ["after"], "a subscription name belongs to its client-id"


@pytest.mark.parametrize("flag", ["durable", "persistent"])
def test_rabbitmq_durable_subscription_survives_sigkill_with_in_flight_and_backlog(
        server_factory, raw_client, flag):
    srv = server_factory()
    topic, sub_id = f"/topic/{unique('rmq')}", unique("rid")
    sub, _ = raw_client(srv)
    subscribe(sub, topic, sub_id=sub_id, ack="client-individual", **{flag: "true"})
    producer, _ = raw_client(srv)
    send(producer, topic, "in-flight", **P)
    delivered = sub.read_message()  # its DELIVERED record went with the producer's receipt
    assert delivered.body == b"in-flight"
    sub.request("UNSUBSCRIBE", {"id": sub_id})  # plain: the subscription stays, unacked back
    for i in range(3):
        send(producer, topic, f"backlog-{i}", **P)
    sub.close()
    send(producer, topic, "while away", **P)

    srv = restart(srv)
    sub, _ = raw_client(srv)
    subscribe(sub, topic, sub_id=sub_id, ack="client-individual", **{flag: "true"})
    got = messages(sub, 5)
    assert bodies(got) == [b"in-flight", b"backlog-0", b"backlog-1", b"backlog-2",
                           b"while away"]
    assert got[0].headers["redelivered"] == "true"
    assert int(got[0].headers["delivery-count"]) >= 2
    assert got[0].headers["message-id"] == delivered.headers["message-id"]
    for frame in got:
        assert frame.headers["subscription"] == sub_id
        assert frame.headers["destination"] == topic
        ack(sub, frame)
    sub.assert_quiet()

    srv = restart(srv)
    sub, _ = raw_client(srv)
    subscribe(sub, topic, sub_id=sub_id, **{flag: "true"})
    sub.assert_quiet()  # everything was acknowledged, and the acks survived
    producer, _ = raw_client(srv)
    send(producer, topic, "still subscribed", **P)
    assert sub.read_message().body == b"still subscribed"


def test_deleted_durable_subscription_stays_deleted_after_sigkill(server_factory, raw_client):
    srv = server_factory()
    topic, cid = f"/topic/{unique('del')}", unique("cid")
    sub, _ = raw_client(srv, headers={"client-id": cid})
    subscribe(sub, topic, sub_id="keep", **{"activemq.subscriptionName": "keep"})
    subscribe(sub, topic, sub_id="drop", **{"activemq.subscriptionName": "drop"})
    subscribe(sub, topic, sub_id="rabbit", durable="true")
    sub.request("UNSUBSCRIBE", {"id": "keep"})  # plain: kept
    sub.request("UNSUBSCRIBE", {"id": "drop", "activemq.subscriptionName": "drop"})
    sub.request("UNSUBSCRIBE", {"id": "rabbit", "durable": "true"})
    sub.close()
    producer, _ = raw_client(srv)
    send(producer, topic, "x", **P)

    srv = restart(srv)
    sub, _ = raw_client(srv, headers={"client-id": cid})
    subscribe(sub, topic, sub_id="k", **{"activemq.subscriptionName": "keep"})
    assert sub.read_message().body == b"x"
    subscribe(sub, topic, sub_id="d", **{"activemq.subscriptionName": "drop"})
    subscribe(sub, topic, sub_id="rabbit", durable="true")
    sub.assert_quiet()  # new, empty subscriptions: the deleted ones had no backlog kept


# ----------------------------------------------------------------------------- destinations


def test_destinations_created_at_run_time_are_recovered(server_factory, raw_client):
    """An empty queue leaves no trace a STOMP client can see, so the recovered state is read
    with the store's own recovery (the server is dead, nothing else holds the journal)."""
    from pairmq.store.store import Store

    srv = server_factory()
    empty, drained, full = (f"/queue/{unique(p)}" for p in ("empty", "drained", "full"))
    client, _ = raw_client(srv)
    subscribe(client, empty, sub_id="e")
    send(client, drained, "gone", **P)
    send(client, full, "kept", **P)
    subscribe(client, drained, sub_id="d")
    assert client.read_message().body == b"gone"
    client.request("UNSUBSCRIBE", {"id": "d"})
    srv.kill()

    replay, _ = Store(srv.data_dir / "journal").recover()
    assert {empty, drained, full} <= set(replay.destinations)
    assert len(replay.queues.get(full, {})) == 1
    assert not replay.queues.get(drained)

    srv = restart(srv)
    client, _ = raw_client(srv)
    subscribe(client, full)
    assert client.read_message().body == b"kept"


# ----------------------------------------------------------------------------- clients, SIGTERM


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_py_client_sees_persistent_messages_and_acks_survive_sigkill(
        server_factory, stomp_client, version):
    srv = server_factory()
    queue = f"/queue/{unique('spy')}"
    producer = stomp_client(srv, version=version)
    for i in range(6):
        producer.send(queue, f"m{i}", persistent="true")

    srv = restart(srv)
    consumer = stomp_client(srv, version=version)
    consumer.subscribe(queue, ack="client-individual" if version != "1.0" else "client")
    got = consumer.wait_messages(6)
    assert [m.body for m in got] == [f"m{i}" for i in range(6)]
    for m in got[:3]:
        consumer.ack(m)

    srv = restart(srv)
    consumer = stomp_client(srv, version=version)
    consumer.subscribe(queue)
    got = consumer.wait_messages(3)
    assert [m.body for m in got] == ["m3", "m4", "m5"]
    assert all(m.headers.get("redelivered") == "true" for m in got)


def test_clean_restart_keeps_queues_durables_and_in_flight_messages(server_factory,
                                                                     raw_client):
    srv = server_factory()
    queue, topic = f"/queue/{unique('term')}", f"/topic/{unique('term')}"
    consumer, _ = raw_client(srv)
    subscribe(consumer, topic, sub_id="dur", durable="true")
    consumer.request("UNSUBSCRIBE", {"id": "dur"})
    producer, _ = raw_client(srv)
    for i in range(4):
        send(producer, queue, f"q{i}", **P)
        send(producer, topic, f"t{i}", **P)
    subscribe(consumer, queue, sub_id="q", ack="client-individual",
              **{"prefetch-count": "2"})
    held = messages(consumer, 2)
    ack(consumer, held[0])
    consumer.read_message()  # q2 takes the freed slot: q1 and q2 are in flight at the stop

    srv = restart(srv, crash=False)
    client, _ = raw_client(srv)
    subscribe(client, queue, sub_id="q", ack="client-individual")
    got = messages(client, 3)
    assert bodies(got) == [b"q1", b"q2", b"q3"]
    assert [f.headers.get("redelivered") for f in got] == ["true", "true", None]
    subscribe(client, topic, sub_id="dur", durable="true")
    assert bodies(messages(client, 4)) == [f"t{i}".encode() for i in range(4)]
    client.assert_quiet()


# ----------------------------------------------------------------------------- disk first


def test_receipts_wait_until_the_record_is_on_disk(server_factory, raw_client,
                                                    loop_mounted_data_dir):
    """With the filesystem frozen (writes block), the RECEIPT of a persistent SEND, of a
    COMMIT and of an ACK of a persistent message does not come; it comes once the disk
    takes writes again. Meanwhile the server serves what needs no disk."""
    mountpoint = loop_mounted_data_dir
    srv = server_factory(name="frozen")
    assert srv.data_dir == mountpoint
    queue, acked, topic = (f"/queue/{unique('frz')}", f"/queue/{unique('frzack')}",
                           f"/topic/{unique('live')}")
    client, _ = raw_client(srv)
    bystander, _ = raw_client(srv)
    bystander.request("SUBSCRIBE", {"destination": topic, "id": "t"})
    send(client, queue, "before", **P)
    send(client, acked, "to ack", **P)
    subscribe(client, acked, sub_id="a", ack="client-individual")
    to_ack = client.read_message()
    client.request("BEGIN", {"transaction": "tx"})
    send(client, queue, "committed", transaction="tx", **P)

    frames = [
        ("ACK", {"id": to_ack.headers["ack"]}, b""),
        ("SEND", {"destination": queue, **P}, b"while frozen"),
        ("COMMIT", {"transaction": "tx"}, b""),
    ]
    for i, (command, headers, body) in enumerate(frames):
        try:
            frozen = run("fsfreeze", "-f", str(mountpoint), timeout=10)
            if frozen.returncode != 0:
                pytest.skip(f"fsfreeze is not permitted here: {frozen.stderr.strip()}")
            client.send_frame(command, {**headers, "receipt": f"r{i}"}, body)
            with pytest.raises(TimeoutError):
                frame = client.read_frame(1.0)  # not on disk: no RECEIPT
                raise AssertionError(f"{command} answered while the disk was frozen: {frame}")
            # The event loop never waits for the disk: what journals nothing goes on, and
            # its RECEIPT comes at once (it waits for no record, least of all another's).
            bystander.send_frame("SEND", {"destination": topic, "receipt": f"b{i}"},
                                 f"served {i}")
            assert bystander.wait_receipt(f"b{i}", timeout=1.0).command == "RECEIPT"
            assert bystander.read_message().body == f"served {i}".encode()
        finally:
            run("fsfreeze", "-u", str(mountpoint))
        assert client.wait_receipt(f"r{i}", timeout=10).command == "RECEIPT"

    # A RECEIPT covers every earlier frame of its connection (STOMP processes a
    # connection's frames in order): an UNSUBSCRIBE, which journals nothing, sent after an
    # ACK that asked for no receipt, is not answered before that ACK's record is on disk.
    send(client, acked, "acked without a receipt", **P)
    unreceipted = client.read_message()
    try:
        frozen = run("fsfreeze", "-f", str(mountpoint), timeout=10)
        assert frozen.returncode == 0, frozen.stderr
        client.send_frame("ACK", {"id": unreceipted.headers["ack"]})
        client.send_frame("UNSUBSCRIBE", {"id": "a", "receipt": "after-ack"})
        with pytest.raises(TimeoutError):
            frame = client.read_frame(1.0)
            raise AssertionError(f"answered before the ACK was on disk: {frame}")
    finally:
        run("fsfreeze", "-u", str(mountpoint))
    assert client.wait_receipt("after-ack", timeout=10).command == "RECEIPT"
    bystander.close()

    srv = restart(srv)
    try:
        consumer, _ = raw_client(srv)
        subscribe(consumer, queue, sub_id="q")
        assert bodies(messages(consumer, 3)) == [b"before", b"while frozen", b"committed"]
        subscribe(consumer, acked, sub_id="a")
        consumer.assert_quiet()
    finally:
        srv.stop()  # before the filesystem is unmounted
