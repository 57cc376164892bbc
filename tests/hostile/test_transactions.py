"""Transactions that never end, and large ones (issue 20, item 3), on a real server with a
canary client beside them: a transaction holds at most max_transaction_bytes and
max_transaction_messages (100,000 by default), its messages count in the server's memory
until COMMIT, and the largest COMMIT allowed, applied in slices over many turns, leaves
the canary served."""

from __future__ import annotations

import time

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from pairmq.protocol import Frame, serialize
from tests.serverproc import free_port
from tests.support.admin import admin_status, admin_user_flags, status_when_up
from tests.support.canary import WORST_S, Canary
from tests.support.commits import all_or_none, drain, stage

MB = 1_000_000


@pytest.mark.machine
def test_a_transaction_that_never_commits_is_bounded_and_counted(server_factory) -> None:
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--admin", admin, *admin_user_flags())
    status = status_when_up(admin)
    before_memory, before_rss = status["capacity"]["memory_bytes"], srv.rss()
    conn = BlockingConnection(srv.host, srv.port)
    with Canary(srv) as canary:
        conn.request(Frame("BEGIN", {"transaction": "t"}))
        for _ in range(8):  # 64 MB: within the default 64 MiB
            conn.send("/queue/never", b"z" * (8 * MB), {"transaction": "t"})
        status = admin_status(admin)
        assert status is not None
        assert status["capacity"]["memory_bytes"] - before_memory >= 64 * MB, \
            "the staged messages count in the server's memory"
        with pytest.raises(StompError, match=r"transaction 't' would hold more than "
                                             r"max_transaction_bytes \(67108864\) bytes"):
            conn.send("/queue/never", b"z" * (8 * MB), {"transaction": "t"})
    conn.sock.close()
    deadline = time.monotonic() + 5
    while (status := admin_status(admin)) is None \
            or status["capacity"]["memory_bytes"] != before_memory:
        assert time.monotonic() < deadline, "the aborted transaction's bytes stay counted"
        time.sleep(0.1)
    assert srv.rss() - before_rss < 200 * MB
    assert canary.lost == [] and canary.worst < WORST_S


LARGEST = 100_000  # the default max_transaction_messages


@pytest.mark.machine
def test_the_largest_commit_allowed_leaves_others_served(server_factory) -> None:
    """A COMMIT of the most SENDs a transaction may hold by default (100-byte bodies) is
    applied in slices over many turns: a canary beside it is served every round, and
    every message is then in the queue, once, in order."""
    srv = server_factory()  # the default limits
    conn = BlockingConnection(srv.host, srv.port)
    try:
        stage(conn, "big", "/queue/big", LARGEST)  # pipelined, a receipt every 5,000
        with Canary(srv, interval=0.01) as canary:
            time.sleep(0.3)
            started = time.monotonic()
            conn.request(Frame("COMMIT", {"transaction": "big"}), timeout=120)
            took = time.monotonic() - started
            time.sleep(0.3)
    finally:
        conn.close()
    print(f"COMMIT of {LARGEST:,} in {took:.2f} s; the canary's worst round "
          f"{canary.worst * 1000:.0f} ms of {len(canary.rounds)}")
    assert canary.lost == [] and canary.worst < WORST_S, \
        f"a COMMIT of {LARGEST:,} ({took:.2f} s) held the canary {canary.worst * 1000:.0f} ms"
    assert all_or_none(drain(srv.address, "/queue/big", expect=LARGEST, idle=0.5),
                       LARGEST) == "all"


def test_one_send_past_max_transaction_messages_is_refused(server_factory) -> None:
    """The limit, on a server configured with a small one (the default's probe would
    stage 100,001 SENDs)."""
    srv = server_factory("--max-transaction-messages", "2000")
    probe = BlockingConnection(srv.host, srv.port)
    try:
        probe.request(Frame("BEGIN", {"transaction": "t"}))
        probe.sock.sendall(b"".join(
            serialize(Frame("SEND", {"destination": "/queue/x", "transaction": "t"}, b"p"),
                      "1.2") for _ in range(2_001)))
        with pytest.raises(StompError, match=r"transaction 't' would hold more than "
                                             r"max_transaction_messages \(2000\)"):
            probe.read_frame(10)
    finally:
        probe.sock.close()


def test_acknowledgements_in_a_transaction_are_bounded_too(server_factory) -> None:
    """A transacted consumer's ACKs give its credit back at once: they count in
    max_transaction_messages, and the one past it gets an ERROR naming the limit."""
    srv = server_factory("--max-transaction-messages", "20")
    producer = BlockingConnection(srv.host, srv.port)
    consumer = BlockingConnection(srv.host, srv.port)
    try:
        for i in range(30):
            producer.send("/queue/acked", b"%d" % i, {"persistent": "true"})
        consumer.request(Frame("BEGIN", {"transaction": "t"}))
        early = consumer.request(Frame("SUBSCRIBE", {"destination": "/queue/acked", "id": "s",
                                                     "ack": "client-individual",
                                                     "prefetch-count": "5"}))
        pending = [f for f in early if f.command == "MESSAGE"]
        acked = 0
        with pytest.raises(StompError, match=r"transaction 't' holds max_transaction_messages "
                                             r"\(20\) messages, sent or acknowledged"):
            while True:  # each ACK receipted: the one refused gets the ERROR
                frame = pending.pop(0) if pending else consumer.read_frame(10)
                if frame.command == "MESSAGE":
                    pending.extend(f for f in consumer.request(Frame(
                        "ACK", {"id": frame.headers["ack"], "transaction": "t"}))
                        if f.command == "MESSAGE")
                    acked += 1
        assert acked == 20, "twenty taken, the next refused"
        consumer.sock.close()
        # the transaction is discarded with its connection: every message is back
        again = BlockingConnection(srv.host, srv.port)
        got = [f for f in again.request(Frame("SUBSCRIBE", {"destination": "/queue/acked",
                                                           "id": "a"}))
               if f.command == "MESSAGE"]
        while len(got) < 30:
            got.append(again.read_frame(10))
        assert sorted(int(f.body) for f in got) == list(range(30))
        again.close()
    finally:
        producer.close()
        consumer.sock.close()
