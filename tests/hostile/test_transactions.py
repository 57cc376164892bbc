"""Transactions that never end, and large ones (issue 20, item 3), on a real server with a
canary client beside them: a transaction holds at most max_transaction_bytes and
max_transaction_messages, its messages count in the server's memory until COMMIT, and
the largest COMMIT allowed leaves the canary served."""

from __future__ import annotations

import time

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from pairmq.protocol import Frame, serialize
from tests.serverproc import free_port
from tests.support.admin import admin_status, admin_user_flags, status_when_up
from tests.support.canary import WORST_S, Canary

MB = 1_000_000


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


def test_the_largest_commit_allowed_leaves_others_served(server) -> None:
    conn = BlockingConnection(server.host, server.port)
    try:
        conn.request(Frame("BEGIN", {"transaction": "big"}))
        for first in range(0, 2_000, 500):
            conn.sock.sendall(b"".join(
                serialize(Frame("SEND", {"destination": "/queue/big", "transaction": "big",
                                         "n": str(i)}, b"m" * 100), "1.2")
                for i in range(first, first + 500)))
            conn.request(Frame("SEND", {"destination": "/queue/other"}, b"sync"))
        probe = BlockingConnection(server.host, server.port)
        try:
            probe.request(Frame("BEGIN", {"transaction": "t"}))
            probe.sock.sendall(b"".join(
                serialize(Frame("SEND", {"destination": "/queue/x", "transaction": "t"}, b"p"),
                          "1.2") for _ in range(2_001)))
            with pytest.raises(StompError, match=r"max_transaction_messages \(2000\)"):
                probe.read_frame(10)
        finally:
            probe.sock.close()
        with Canary(server, interval=0.01) as canary:
            time.sleep(0.3)
            conn.request(Frame("COMMIT", {"transaction": "big"}), timeout=30)
            time.sleep(0.3)
    finally:
        conn.close()
    assert canary.lost == [] and canary.worst < WORST_S, \
        f"a COMMIT of 2,000 held the canary {canary.worst * 1000:.0f} ms"
