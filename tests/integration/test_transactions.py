"""BEGIN/COMMIT/ABORT: SENDs, ACKs and NACKs of a transaction take effect together at COMMIT;
ABORT and a disconnect undo them."""

from __future__ import annotations

import pytest

from pairmq.client.plain import BlockingConnection
from pairmq.protocol import Frame, serialize
from tests.integration.clients import fill
from tests.integration.rawstomp import unique
from tests.serverproc import free_port
from tests.support.admin import admin_request, admin_status, admin_user_flags, status_when_up


def test_sends_are_delivered_only_at_commit(server, stomp_client):
    queue = f"/queue/{unique('txs')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    producer = stomp_client(server)
    producer.begin("t1")
    for i in range(3):
        producer.send(queue, f"tx{i}", transaction="t1")
    producer.send(queue, "outside")
    consumer.wait_body("outside")
    producer.sync()
    consumer.sync()
    assert consumer.bodies() == ["outside"], "nothing of a transaction is delivered before COMMIT"
    producer.commit("t1")
    consumer.wait_messages(4)
    assert consumer.bodies() == ["outside", "tx0", "tx1", "tx2"]


def test_sends_to_several_destinations_commit_together(server, stomp_client):
    queue, topic = f"/queue/{unique('a')}", f"/topic/{unique('b')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    consumer.subscribe(topic)
    producer = stomp_client(server)
    producer.begin("t")
    producer.send(queue, "to queue", transaction="t")
    producer.send(topic, "to topic", transaction="t")
    producer.sync()
    consumer.sync()
    assert consumer.bodies() == []
    producer.commit("t")
    consumer.wait_messages(2)
    assert sorted(consumer.bodies()) == ["to queue", "to topic"]


def test_abort_discards_sends(server, stomp_client):
    queue = f"/queue/{unique('txa')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    producer = stomp_client(server)
    producer.begin("t1")
    producer.send(queue, "never", transaction="t1")
    producer.send(queue, "never either", transaction="t1")
    producer.abort("t1")
    producer.send(queue, "after")
    consumer.wait_body("after")
    assert consumer.bodies() == ["after"]
    # The transaction id is gone: committing it now is an error.
    producer.conn.commit("t1", headers={"receipt": "late-commit"})
    error = producer.wait_error()
    assert error.headers.get("receipt-id") == "late-commit"
    consumer.sync()
    assert consumer.bodies() == ["after"]


@pytest.mark.parametrize("how", ["drop", "disconnect"])
def test_disconnect_with_open_transaction_discards_sends(server, stomp_client, how):
    queue = f"/queue/{unique('txd')}"
    producer = stomp_client(server)
    producer.begin("t1")
    producer.send(queue, "uncommitted", transaction="t1")
    producer.drop() if how == "drop" else producer.disconnect()
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    assert consumer.bodies_up_to_marker(queue) == ["after"]


def test_interleaved_transactions_are_independent(server, stomp_client):
    queue = f"/queue/{unique('txi')}"
    consumer = stomp_client(server)
    consumer.subscribe(queue)
    producer = stomp_client(server)
    producer.begin("a")
    producer.begin("b")
    producer.send(queue, "a1", transaction="a")
    producer.send(queue, "b1", transaction="b")
    producer.send(queue, "a2", transaction="a")
    producer.commit("b")
    consumer.wait_body("b1")
    producer.abort("a")
    producer.send(queue, "end")
    consumer.wait_body("end")
    assert consumer.bodies() == ["b1", "end"]


def test_ack_takes_effect_at_commit(server, stomp_client):
    queue = f"/queue/{unique('txack')}"
    fill(server, stomp_client, queue, 2)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    m0, m1 = consumer.wait_messages(2)
    consumer.begin("t")
    consumer.ack(m0, transaction="t")
    consumer.ack(m1, transaction="t")
    consumer.commit("t")
    consumer.drop()
    check = stomp_client(server)
    check.subscribe(queue)
    assert check.bodies_up_to_marker(queue) == ["after"], "acks committed: nothing comes back"


@pytest.mark.parametrize("how", ["drop", "disconnect"])
def test_uncommitted_ack_is_undone_by_disconnect(server, stomp_client, how):
    queue = f"/queue/{unique('txud')}"
    fill(server, stomp_client, queue, 2)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    m0, m1 = consumer.wait_messages(2)
    consumer.ack(m0)  # outside the transaction: final
    consumer.begin("t")
    consumer.ack(m1, transaction="t")
    consumer.drop() if how == "drop" else consumer.disconnect()
    check = stomp_client(server)
    check.subscribe(queue, ack="client-individual")
    (again,) = check.wait_messages(1)
    assert again.body == "m1"
    assert again.headers["redelivered"] == "true"
    check.sync()
    assert check.bodies() == ["m1"]


def test_abort_returns_acked_messages_marked_redelivered(server, stomp_client):
    queue = f"/queue/{unique('txab')}"
    fill(server, stomp_client, queue, 2)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    m0, m1 = consumer.wait_messages(2)
    consumer.begin("t")
    consumer.ack(m0, transaction="t")
    consumer.ack(m1, transaction="t")
    consumer.abort("t")
    again = consumer.wait_messages(4)[2:]
    assert [m.body for m in again] == ["m0", "m1"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    assert all(m.headers["delivery-count"] == "2" for m in again)
    for m in again:
        consumer.ack(m)
    consumer.drop()
    check = stomp_client(server)
    check.subscribe(queue)
    assert check.bodies_up_to_marker(queue) == ["after"]


def test_nack_takes_effect_at_commit(server, stomp_client):
    queue = f"/queue/{unique('txn')}"
    fill(server, stomp_client, queue, 1)
    consumer = stomp_client(server)
    consumer.subscribe(queue, ack="client-individual")
    (m0,) = consumer.wait_messages(1)
    consumer.begin("t")
    consumer.nack(m0, transaction="t")
    consumer.sync()
    assert len(consumer.messages) == 1, "a NACK in a transaction waits for COMMIT"
    consumer.commit("t")
    again = consumer.wait_messages(2)[1]
    assert again.body == "m0"
    assert again.headers["redelivered"] == "true"


def test_consume_transform_produce_is_atomic(server, stomp_client):
    source, target = f"/queue/{unique('in')}", f"/queue/{unique('out')}"
    fill(server, stomp_client, source, 1)
    worker = stomp_client(server)
    worker.subscribe(source, ack="client-individual")
    (job,) = worker.wait_messages(1)
    worker.begin("t")
    worker.send(target, job.body.upper(), transaction="t")
    worker.ack(job, transaction="t")
    worker.drop()  # crash before COMMIT: neither the result nor the ack happened
    retry = stomp_client(server)
    retry.subscribe(source, ack="client-individual")
    (job,) = retry.wait_messages(1)
    assert job.headers["redelivered"] == "true"
    retry.begin("t")
    retry.send(target, job.body.upper(), transaction="t")
    retry.ack(job, transaction="t")
    retry.commit("t")
    sink = stomp_client(server)
    sink.subscribe(target)
    sink.wait_body("M0")
    sink.send(target, "end")
    sink.wait_body("end")
    assert sink.bodies() == ["M0", "end"], "exactly one result"


def test_a_large_commit_is_applied_in_slices_reported_and_answered_in_order(server_factory):
    """A COMMIT of 30,000 (core/broker/committing.py): GET /status and /metrics report it while
    it is applied; a frame the connection sent after it is answered after it; every
    message is there once, in order."""
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--admin", admin, *admin_user_flags())
    status_when_up(admin)
    queue, count = f"/queue/{unique('big')}", 30_000
    conn = BlockingConnection(srv.host, srv.port)
    try:
        conn.request(Frame("BEGIN", {"transaction": "t"}))
        for first in range(0, count, 5_000):
            conn.sock.sendall(b"".join(serialize(Frame(
                "SEND", {"destination": queue, "transaction": "t", "persistent": "true",
                         "n": str(i)}, b"m" * 100), "1.2") for i in range(first, first + 5_000)))
            conn.request(Frame("SEND", {"destination": f"/queue/{unique('sync')}"}, b"s"))
        conn.sock.sendall(serialize(Frame("COMMIT", {"transaction": "t", "receipt": "c"}),
                                    "1.2") + serialize(Frame("SEND", {
                                        "destination": queue, "n": "after", "persistent": "true",
                                        "receipt": "after"}, b"after"), "1.2"))
        seen = []
        while (status := admin_status(admin)) is not None and not seen:
            if status["commits"]["under_way"]:
                seen.append(status["commits"])
        assert seen and 0 < seen[0]["messages_to_route"] <= count, \
            "GET /status reports the COMMIT under way"
        receipts = [conn.read_frame(30).headers.get("receipt-id") for _ in range(2)]
        assert receipts == ["c", "after"], "the frame after the COMMIT waits for it"
        status = admin_status(admin)
        assert status is not None and status["commits"] == {
            "under_way": 0, "staging": 0, "messages_to_route": 0}
        _, _, metrics = admin_request(admin, "/metrics")
        assert "pairmq_commits_under_way 0.0" in metrics
        early = conn.request(Frame("SUBSCRIBE", {"destination": queue, "id": "1",
                                                 "ack": "auto"}))
        got = [f.headers["n"] for f in early if f.command == "MESSAGE"]
        while len(got) < count + 1:
            frame = conn.read_frame(30)
            if frame.command == "MESSAGE":
                got.append(frame.headers["n"])
        assert got == [str(i) for i in range(count)] + ["after"]
    finally:
        conn.close()
