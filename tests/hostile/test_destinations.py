"""Junk destinations (issue 20, item 2), on real servers with a canary client beside the
one making them: they are bounded (max_destinations), small while they exist, deleted
once empty and unused (also from the journal: a restart does not bring them back), and
/metrics stays cheap for the server however many there are."""

from __future__ import annotations

import re
import time

from pairmq.client.plain import BlockingConnection, StompError
from pairmq.protocol import Frame, serialize
from tests.serverproc import free_port
from tests.support.admin import admin_request, admin_user_flags, status_when_up
from tests.support.canary import WORST_S, Canary

MiB = 1024 * 1024


def make_queues(srv, count: int, prefix: str = "junk") -> None:
    """SUBSCRIBE to `count` new queue names on one connection, then close it."""
    conn = BlockingConnection(srv.host, srv.port)
    try:
        for first in range(0, count, 1000):
            conn.sock.sendall(b"".join(
                serialize(Frame("SUBSCRIBE", {"destination": f"/queue/{prefix}.{i}",
                                              "id": str(i)}), "1.2")
                for i in range(first, min(count, first + 1000) - 1)))
            last = min(count, first + 1000) - 1
            conn.request(Frame("SUBSCRIBE", {"destination": f"/queue/{prefix}.{last}",
                                             "id": str(last)}))
    finally:
        conn.close()


def test_junk_queues_are_small_then_deleted_for_good(server_factory) -> None:
    srv = server_factory("--auto-delete-delay-ms", "500", name="junk")
    before = srv.rss()
    with Canary(srv) as canary:
        make_queues(srv, 8_000)
        grown = srv.rss() - before
        deadline = time.monotonic() + 30
        while "Deleted empty, unused destinations" not in srv.logs():
            assert time.monotonic() < deadline, "no destination was deleted"
            time.sleep(0.2)
        time.sleep(3)  # the sweep looks at 5,000 a second
    assert grown < 16 * MiB, f"{grown / MiB:.0f} MiB for 8,000 empty queues (70 MiB before)"
    assert canary.lost == [] and canary.worst < WORST_S
    srv.kill()
    again = server_factory("--auto-delete-delay-ms", "500", name="junk", port=srv.port)
    [recovered] = [line for line in again.logs().splitlines() if "Recovered" in line]
    # the canary's queue may stay: it remembers its producer (core/broker/idle.py)
    found = re.search(r"Recovered 0 messages in (\d+) queues( \((\d+) destinations in all)?",
                      recovered)
    assert found is not None, recovered
    assert int(found.group(1)) <= 2 and int(found.group(3) or 0) <= 2, recovered


def test_clients_make_at_most_max_destinations(server_factory) -> None:
    srv = server_factory("--max-destinations", "100")
    make_queues(srv, 99, "some")
    conn = BlockingConnection(srv.host, srv.port)
    try:
        conn.send("/queue/some.99", b"fits: the 100th")
        try:
            conn.send("/queue/one.too.many", b"x")
            raise AssertionError("the 101st destination was made")
        except StompError as e:
            assert "too many destinations: the server holds max_destinations (100); " \
                   "/queue/one.too.many is not made" in str(e)
    finally:
        conn.sock.close()


def test_metrics_of_many_destinations_hold_no_one_up(server_factory) -> None:
    admin = f"127.0.0.1:{free_port()}"
    srv = server_factory("--admin", admin, *admin_user_flags(),
                         "--max-destination-metrics", "1000", "--auto-delete-delay-ms",
                         "600000")
    status_when_up(admin)
    make_queues(srv, 5_000)
    with Canary(srv, interval=0.02) as canary:
        for _ in range(10):
            code, _, body = admin_request(admin, "/metrics")
            assert code == 200
    assert "pairmq_destinations 5001.0" in body or "pairmq_destinations 5002.0" in body, \
        body[:2000]  # the canary's own queue, and maybe a dead-letter one
    assert "pairmq_destination_messages{" not in body, "per-destination series off past 1,000"
    assert canary.lost == [] and canary.worst < WORST_S, canary.worst


def test_a_connection_holds_at_most_its_subscriptions(server_factory) -> None:
    srv = server_factory("--max-subscriptions-per-connection", "5")
    make_queues(srv, 5, "five")  # fits, on one connection
    conn = BlockingConnection(srv.host, srv.port)
    try:
        for i in range(5):
            conn.subscribe(f"/queue/five.{i}", f"s{i}")
        try:
            conn.subscribe("/queue/five.more", "s5")
            raise AssertionError("a sixth subscription was taken")
        except StompError as e:
            assert "too many subscriptions on this connection: " \
                   "max_subscriptions_per_connection (5)" in str(e)
    finally:
        conn.sock.close()
