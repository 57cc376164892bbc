"""Frames that would reach other clients as something else (issue 20, items 4 and 5), on a
real server with a canary client beside the attacker: a NUL in a header, a header name a
STOMP 1.0 subscriber would read as another header, and messages the server could store
but never deliver within its own limits (so they would go to the dead-letter queue,
taking an innocent one along)."""

from __future__ import annotations

import socket
import time

import pytest

import pairmq.client
from pairmq.client.plain import BlockingConnection, StompError
from pairmq.protocol import Frame
from pairmq.protocol.batch import encode_send_records
from tests.support.canary import WORST_S, Canary

CONNECT = b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00"


def raw_send(srv, data: bytes) -> bytes:
    """Connect, send `data`, and return all the server answered until it closed."""
    with socket.create_connection((srv.host, srv.port), timeout=5) as sock:
        sock.sendall(CONNECT + data)
        answer = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return answer
            answer += chunk
    raise AssertionError(f"the server did not close the connection; it said {answer!r}")


@pytest.mark.machine
def test_a_nul_in_a_header_is_refused_and_forges_nothing(server, stomp_client) -> None:
    consumer = stomp_client(server)
    consumer.subscribe("/queue/pay", id="1")
    forged = (b"SEND\ndestination:/queue/pay\nreceipt:r\nx:innocent\x00MESSAGE\n"
              b"subscription:1\nmessage-id:forged\ndestination:/queue/pay\namount:1000000\n\n"
              b"forged\x00")
    with Canary(server) as canary:
        answer = raw_send(server, forged)
    assert b"ERROR" in answer and b"NUL (octet 0)" in answer, answer
    stomp_client(server).send("/queue/pay", "real")
    assert consumer.wait_body("real").body == "real"
    assert [m.body for m in consumer.messages] == ["real"], "nothing forged, nothing else"
    assert canary.lost == [] and canary.worst < WORST_S


def test_a_colon_in_a_header_name_never_reaches_a_stomp_10_subscriber(server, stomp_client
                                                                      ) -> None:
    old = stomp_client(server, version="1.0")
    old.subscribe("/queue/legacy", id="1")
    raw_send(server, b"SEND\ndestination:/queue/legacy\nna\\cme:v\nkept:yes\n\nbody\x00"
             b"DISCONNECT\n\n\x00")
    message = old.wait_body("body")
    assert message.headers.get("kept") == "yes"
    assert "na" not in message.headers and "na:me" not in message.headers
    assert "left out of its delivery to a STOMP 1.0 subscriber" in server.logs()
    new = stomp_client(server, version="1.2")  # a 1.1 or 1.2 subscriber gets it, escaped
    new.subscribe("/queue/legacy2", id="1")
    raw_send(server, b"SEND\ndestination:/queue/legacy2\nna\\cme:v\n\nb2\x00DISCONNECT\n\n\x00")
    assert new.wait_body("b2").headers.get("na:me") == "v"


def test_a_send_with_more_headers_than_a_message_can_carry_is_refused(server) -> None:
    many = {f"h{i}": "v" for i in range(995)}  # within max_headers (1000) as a frame
    conn = BlockingConnection(server.host, server.port)
    try:
        with pytest.raises(StompError, match=r"too many headers in a message: 995 kept with "
                                             r"it, at most 990 \(max_headers 1000"):
            conn.send("/queue/wide", b"x", many)
    finally:
        conn.sock.close()
    with pairmq.client.connect(f"{server.host}:{server.port}") as client:
        client.send("/queue/wide", b"fits", {f"h{i}": "v" for i in range(980)})
        sub = client.subscribe("/queue/wide", ack="client")
        message = sub.receive(5)
        assert message is not None and message.body == b"fits", \
            "a message near the limit is taken, and its own client reads it"


def test_a_batch_record_is_held_to_the_same_limits_and_spares_the_others(server) -> None:
    url = f"{server.host}:{server.port}"
    wide = {f"h{i}": "v" for i in range(300_000)}
    body = encode_send_records([({"n": "1"}, b"innocent"), (wide, b"wide")])
    conn = BlockingConnection(server.host, server.port)
    try:
        with pytest.raises(StompError, match=r"too many headers in message 2 of the batched "
                                             r"SEND: 300000"):
            conn.request(Frame("SEND", {"destination": "/queue/batched", "pairmq-batch": "2"},
                               body))
    finally:
        conn.sock.close()
    line = encode_send_records([({"x": "y" * 20_000}, b"long")])
    conn = BlockingConnection(server.host, server.port)
    try:
        with pytest.raises(StompError, match="header line too long in message 1 of the "
                                             "batched SEND"):
            conn.request(Frame("SEND", {"destination": "/queue/batched", "pairmq-batch": "1"},
                               line))
    finally:
        conn.sock.close()
    with pairmq.client.connect(url) as client:
        sub = client.subscribe("/queue/batched")
        assert sub.receive(1) is None, "the refused batch stored nothing, the innocent too"
        sub_dlq = client.subscribe("/queue/DLQ.batched")
        assert sub_dlq.receive(0.5) is None, "and nothing went to the dead-letter queue"
