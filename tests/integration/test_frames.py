"""RECEIPT for every frame, ERROR with message and receipt-id, MESSAGE headers."""

from __future__ import annotations

import time

import pytest

from tests.integration.rawstomp import unique


def test_every_client_frame_with_receipt_gets_a_receipt(server, raw_client):
    client, _ = raw_client(server)
    queue = f"/queue/{unique('rc')}"
    client.request("SUBSCRIBE", {"destination": queue, "id": "s1", "ack": "client-individual"})
    client.request("SEND", {"destination": queue}, "one")
    client.request("SEND", {"destination": queue}, "two")
    first = client.read_message()
    second = client.read_message()
    client.request("ACK", {"id": first.headers["ack"]})
    client.request("NACK", {"id": second.headers["ack"]})
    redelivered = client.read_message()
    assert redelivered.text == "two"
    client.request("ACK", {"id": redelivered.headers["ack"]})
    client.request("BEGIN", {"transaction": "t1"})
    client.request("COMMIT", {"transaction": "t1"})
    client.request("BEGIN", {"transaction": "t2"})
    client.request("ABORT", {"transaction": "t2"})
    client.request("UNSUBSCRIBE", {"id": "s1"})
    client.send_frame("DISCONNECT", {"receipt": "last"})
    frames = client.read_until_closed(5)
    assert [(f.command, f.headers.get("receipt-id")) for f in frames] == [("RECEIPT", "last")]


def test_receipt_comes_after_the_frame_took_effect(server, raw_client):
    consumer, _ = raw_client(server)
    producer, _ = raw_client(server)
    queue = f"/queue/{unique('eff')}"
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "1"})
    # Once the SUBSCRIBE is receipted, a message sent afterwards must reach it.
    producer.request("SEND", {"destination": queue}, "after-subscribe")
    assert consumer.read_message().text == "after-subscribe"
    consumer.request("UNSUBSCRIBE", {"id": "1"})
    producer.request("SEND", {"destination": queue}, "after-unsubscribe")
    other, _ = raw_client(server)
    other.request("SUBSCRIBE", {"destination": queue, "id": "2"})
    assert other.read_message().text == "after-unsubscribe"
    with pytest.raises(TimeoutError):
        consumer.read_frame(timeout=0.3)


def assert_error_then_close(client, receipt: str | None, *needles: str) -> None:
    frames = client.read_until_closed(5)
    assert frames, "expected an ERROR before the close"
    error = frames[-1]
    assert error.command == "ERROR", frames
    message = error.headers.get("message", "")
    assert message, "every ERROR has a message header"
    for needle in needles:
        assert needle in message + error.text, (needle, error)
    if receipt is not None:
        assert error.headers.get("receipt-id") == receipt, error
    else:
        assert "receipt-id" not in error.headers


def test_error_carries_message_and_receipt_id(server, raw_client):
    client, _ = raw_client(server)
    client.send_frame("SEND", {"destination": "/nowhere/x", "receipt": "r-42"}, "lost")
    assert_error_then_close(client, "r-42", "/nowhere/x")


def test_error_without_receipt_has_no_receipt_id(server, raw_client):
    client, _ = raw_client(server)
    client.send_frame("SUBSCRIBE", {"destination": "/bogus/dest", "id": "1"})
    assert_error_then_close(client, None, "/bogus/dest")


def test_errors_do_not_affect_other_connections(server, raw_client):
    bystander, _ = raw_client(server)
    queue = f"/queue/{unique('by')}"
    bystander.request("SUBSCRIBE", {"destination": queue, "id": "1"})
    culprit, _ = raw_client(server)
    culprit.send_frame("FROBNICATE", {"receipt": "u1"})
    assert_error_then_close(culprit, "u1")
    bystander.request("SEND", {"destination": queue}, "fine")
    assert bystander.read_message().text == "fine"


@pytest.mark.parametrize(
    ("command", "headers"),
    [
        ("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "ack": "sometimes"}),
        ("SUBSCRIBE", {"destination": "/queue/q"}),  # id is required from 1.1 on
        ("SEND", {"destination": "/queue/q", "priority": "10"}),
        ("SEND", {"destination": "/queue/q", "priority": "high"}),
        ("ACK", {"id": "never-given"}),
        ("NACK", {"id": "never-given"}),
        ("COMMIT", {"transaction": "unknown-tx"}),
        ("ABORT", {"transaction": "unknown-tx"}),
        ("SEND", {"destination": "/queue/q", "transaction": "unknown-tx"}),
    ],
    ids=[
        "bad-ack-mode",
        "subscribe-without-id",
        "priority-10",
        "priority-word",
        "ack-unknown",
        "nack-unknown",
        "commit-unknown",
        "abort-unknown",
        "send-unknown-tx",
    ],
)
def test_invalid_frames_get_error_with_receipt_id(server, raw_client, command, headers):
    client, _ = raw_client(server)
    rid = unique("bad")
    client.send_frame(command, {**headers, "receipt": rid}, "x" if command == "SEND" else "")
    assert_error_then_close(client, rid)


def test_duplicate_subscription_id_and_transaction_get_errors(server, raw_client):
    client, _ = raw_client(server)
    client.request("SUBSCRIBE", {"destination": "/queue/a", "id": "same"})
    client.send_frame("SUBSCRIBE", {"destination": "/queue/b", "id": "same", "receipt": "dup"})
    assert_error_then_close(client, "dup")
    client, _ = raw_client(server)
    client.request("BEGIN", {"transaction": "tx"})
    client.send_frame("BEGIN", {"transaction": "tx", "receipt": "dup-tx"})
    assert_error_then_close(client, "dup-tx")


def test_ack_twice_gets_error(server, raw_client):
    client, _ = raw_client(server)
    queue = f"/queue/{unique('twice')}"
    client.request("SUBSCRIBE", {"destination": queue, "id": "1", "ack": "client-individual"})
    client.request("SEND", {"destination": queue}, "m")
    message = client.read_message()
    client.request("ACK", {"id": message.headers["ack"]})
    client.send_frame("ACK", {"id": message.headers["ack"], "receipt": "again"})
    assert_error_then_close(client, "again")


def test_message_headers(server, raw_client):
    consumer, _ = raw_client(server)
    producer, _ = raw_client(server)
    queue = f"/queue/{unique('hdr')}"
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "sub-7", "ack": "client"})
    before = int(time.time() * 1000)
    producer.request(
        "SEND",
        {
            "destination": queue,
            "message-id": "client-chosen",
            "content-type": "text/plain",
            "x-app": "value",
            "transaction-like": "kept",
        },
        "body text",
    )
    after = int(time.time() * 1000)
    message = consumer.read_message()
    h = message.headers
    assert message.text == "body text"
    assert h["destination"] == queue
    assert h["subscription"] == "sub-7"
    assert h["message-id"] and h["message-id"] != "client-chosen", "server assigns message-id"
    assert before - 1000 <= int(h["timestamp"]) <= after + 1000
    assert h["delivery-count"] == "1"
    assert "redelivered" not in h or h["redelivered"] != "true"
    assert h.get("ack"), "a client-ack MESSAGE carries ack"
    assert h["content-length"] == str(len(b"body text"))
    assert h["x-app"] == "value"
    assert h["content-type"] == "text/plain"
    assert h["transaction-like"] == "kept"
    assert "receipt" not in h
    names = [k for k, _ in message.header_list]
    assert len(names) == len(set(names)), f"repeated headers in MESSAGE: {names}"


def test_transport_headers_are_not_forwarded(server, raw_client):
    consumer, _ = raw_client(server)
    producer, _ = raw_client(server)
    queue = f"/queue/{unique('tp')}"
    consumer.request("SUBSCRIBE", {"destination": queue, "id": "1"})
    producer.request("BEGIN", {"transaction": "tx1"})
    producer.send_frame(
        "SEND",
        {"destination": queue, "transaction": "tx1", "content-length": "3"},
        b"abc",
        content_length=False,
    )
    producer.request("COMMIT", {"transaction": "tx1"})
    message = consumer.read_message()
    assert message.body == b"abc"
    assert "transaction" not in message.headers
    assert "receipt" not in message.headers
    assert message.headers["content-length"] == "3"


def test_message_ids_are_unique(server, raw_client):
    client, _ = raw_client(server)
    queue = f"/queue/{unique('ids')}"
    client.request("SUBSCRIBE", {"destination": queue, "id": "1"})
    for i in range(20):
        client.send_frame("SEND", {"destination": queue}, str(i))
    ids = [client.read_message().headers["message-id"] for _ in range(20)]
    assert len(set(ids)) == 20


def test_binary_body_with_nul_and_escaped_headers(server, raw_client):
    client, _ = raw_client(server)
    queue = f"/queue/{unique('bin')}"
    client.request("SUBSCRIBE", {"destination": queue, "id": "1"})
    body = b"\x00\x01binary\x00\xff end"
    client.request("SEND", {"destination": queue, "x-odd": "a:b\nc\\d\re"}, body)
    message = client.read_message()
    assert message.body == body
    assert message.headers["x-odd"] == "a:b\nc\\d\re"


def test_1_0_subscription_defaults_to_destination(server, raw_client):
    client, connected = raw_client(server, version="1.0")
    assert connected.headers.get("version") == "1.0"
    queue = f"/queue/{unique('ten')}"
    client.request("SUBSCRIBE", {"destination": queue})
    client.request("SEND", {"destination": queue}, "old client")
    message = client.read_message()
    assert message.text == "old client"
    assert message.headers.get("subscription", queue) == queue


def test_disconnect_receipt_then_close(server, stomp_client):
    client = stomp_client(server)
    client.conn.disconnect(receipt="see-you")
    client.listener.wait_for(lambda: "see-you" in client.listener.receipts, 5, "receipt")
    client.listener.wait_for(lambda: client.listener.disconnected, 5, "close")
