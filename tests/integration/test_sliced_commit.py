"""A COMMIT of a large transaction is applied in slices over many turns of the server
(core/broker/committing.py), with a commit marker in the journal: real server processes, real
SIGKILLs, and a client that goes away in the middle.

- a receipted COMMIT of 20,000 persistent SENDs: consumed (with stomp.py) once each, in
  order, and a SEND written after the COMMIT comes after all of them;
- kill -9 of a standalone server at several moments of a COMMIT of 50,000, restart on
  the same data directory: the queue holds none or all of them, never a part, never one
  twice; all of them if the COMMIT's RECEIPT came;
- the same in a replicated pair: kill -9 of the active, the backup takes over;
- a client closing its socket right after its COMMIT (or a moment later): all or none,
  and the server serves on.

The transactions here are larger than the old default max_transaction_messages (2,000):
every server is given the limit explicitly (100,000, the default since the sliced COMMIT).
"""

from __future__ import annotations

import time

import pytest

from pairmq.client.plain import BlockingConnection
from tests.ha.pair import Pair
from tests.integration.clients import Client
from tests.support.admin import admin_status, managed_server
from tests.support.canary import Canary
from tests.support.commits import (
    Replies,
    all_or_none,
    body,
    close_abruptly,
    depth,
    drain,
    send_commit,
    stage,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LIMIT = ("--max-transaction-messages", "100000")
QUEUE = "/queue/sliced"
CRASH_N = 50_000  # a sliced COMMIT of 50,000 takes a second or more: kills land inside it

# Outcomes seen at 0356e66 (the sliced COMMIT, slices of 1,000; 2 cores; slices of 10 ms
# paced by confirmations since make them slower), kill delay after the COMMIT was
# written -> what the restarted server, or the backup that took over, held:
#   standalone: 0, 0.1, 0.15 s -> none (killed while staging, before TX_END);
#               0.3 .. 0.75 s -> all, no RECEIPT (after TX_END: the restart routed the rest);
#               0.75 .. 3 s -> all, RECEIPT came (a COMMIT of 50,000 takes about 1 s)
#   pair:       0, 0.2 s -> none; 0.5 s -> all without RECEIPT (or none); 1 s, 4 s -> all
#   a client gone 0 or 0.2 s after its COMMIT: all (the COMMIT had been read)
# Before the change (3ef1788: one turn, its records written together), standalone: none up
# to about 0.6 s, all with the RECEIPT after; in a pair the active lost its lease during
# the one-turn COMMIT of 50,000 (held 0.7 s) and refused its clients.


def test_a_large_commit_is_consumed_once_in_order_with_stomp_py(server_factory) -> None:
    count = 20_000
    srv = server_factory(*LIMIT)
    producer = Client(srv.address)
    producer.connect()
    consumer = Client(srv.address)
    try:
        producer.begin("big")
        for n in range(count):
            producer.send(QUEUE, body(n), receipt=False, transaction="big", persistent="true",
                          n=n)
        # the COMMIT and, without waiting for its RECEIPT, a SEND of the same connection:
        # that one waits until the COMMIT is done, so it is queued after all of them
        started = time.monotonic()
        producer.conn.commit("big", headers={"receipt": "commit"})
        producer.conn.send(QUEUE, body(count), headers={
            "persistent": "true", "n": str(count), "receipt": "after"})
        producer.wait_receipt("commit", 60)
        took = time.monotonic() - started
        producer.wait_receipt("after", 60)
        receipts = producer.listener.receipts
        assert receipts.index("commit") < receipts.index("after"), receipts

        consumer.connect()
        consumer.subscribe(QUEUE, ack="auto")
        messages = consumer.wait_messages(count + 1, timeout=60)
        time.sleep(0.3)
        assert len(consumer.messages) == count + 1, "more messages than were sent"
    finally:
        producer.close()
        consumer.close()
    ns = [int(m.headers["n"]) for m in messages]
    assert all_or_none(ns[:count], count) == "all"
    assert ns[count:] == [count], f"the SEND after the COMMIT came at {ns.index(count)}"
    assert all(m.body == body(n).decode() for n, m in zip(ns, messages, strict=True))
    print(f"COMMIT of {count:,} receipted in {took:.2f} s")


def crash_once(server_factory, delay: float, name: str = "crashed") -> tuple[str, bool, str]:
    """Stage CRASH_N, write the COMMIT, SIGKILL the server `delay` s later, restart it on
    the same data directory: (what it held: "all" or "none", whether the RECEIPT came
    before the kill, the replies' ending). The restarted server is stopped after."""
    srv, _ = managed_server(server_factory, *LIMIT, name=name)
    conn = BlockingConnection(srv.host, srv.port, timeout=30)
    stage(conn, "big", QUEUE, CRASH_N)
    replies = Replies(conn)
    receipt = send_commit(conn, "big")
    if delay:
        time.sleep(delay)
    srv.kill()
    replies.join()  # what the server wrote before it died is read: a RECEIPT among it counts
    receipted = receipt in replies.receipts
    conn.sock.close()
    assert replies.error is None, f"before the kill: {replies.error}"
    restarted, admin = managed_server(server_factory, *LIMIT, name=name)
    assert restarted.data_dir == srv.data_dir
    # consumed at once, while the server may still route the rest of a decided COMMIT
    ns = drain(restarted.address, QUEUE)
    status = admin_status(admin)
    assert status is not None and status["commits"]["under_way"] == 0, status
    held = all_or_none(ns, CRASH_N)
    if receipted:
        assert held == "all", "the COMMIT was receipted, then its messages were lost"
    assert depth(status, QUEUE) == 0
    restarted.stop()
    return held, receipted, replies.ended or ""


@pytest.mark.parametrize("delay", [
    0.0,  # the COMMIT written, the server killed at once: it may not even have read it
    0.3,  # in the middle of the COMMIT (of 1 s or more)
    pytest.param(0.1, marks=pytest.mark.long),
    pytest.param(1.0, marks=pytest.mark.long),
    pytest.param(3.0, marks=pytest.mark.long),  # done, most likely receipted
])
def test_kill_9_during_a_large_commit_keeps_all_or_none(server_factory, delay: float) -> None:
    held, receipted, ended = crash_once(server_factory, delay)
    print(f"kill {delay} s after the COMMIT: {held} of {CRASH_N:,} held after the restart, "
          f"RECEIPT {'came' if receipted else 'did not come'} ({ended})")


@pytest.mark.long
def test_kill_9_at_many_moments_of_a_commit_keeps_all_or_none(server_factory) -> None:
    """A sweep: a kill every 0.15 s of the COMMIT's length, each on a fresh server; at
    least one leaves none and one leaves all (the sweep crosses the commit marker)."""
    outcomes = []
    for step in range(12):
        outcomes.append(crash_once(server_factory, step * 0.15, f"crashed{step}")[:2])
    print("kill delays 0, 0.15 .. 1.65 s ->", outcomes)
    assert {held for held, _ in outcomes} == {"none", "all"}, outcomes


def pair_crash(pair: Pair, delay: float) -> tuple[str, bool]:
    pair.start(parallel=True)
    pair.wait_formed()
    wait_until(lambda: (pair.status("primary") or {}).get("ha", {})
               .get("synchronized-with-backup"), "the backup in sync", 20)
    conn = pair.connect("primary", timeout=30)
    stage(conn, "big", QUEUE, CRASH_N)
    replies = Replies(conn)
    receipt = send_commit(conn, "big")
    if delay:
        time.sleep(delay)
    pair.kill("primary")
    replies.join()
    receipted = receipt in replies.receipts
    # an ERROR before the kill: the active stopped serving during the COMMIT (it lost the
    # witness's lease and the backup's promise: its loop held past the pair's heartbeats)
    assert replies.error is None, f"before the kill: {replies.error}"
    assert pair.wait_active(15, "backup") == "backup"
    host, port = pair.stomp_address("backup").rsplit(":", 1)
    ns = drain((host, int(port)), QUEUE)  # while it may still route the rest
    status = pair.status("backup")
    assert status is not None and status["commits"]["under_way"] == 0, status
    held = all_or_none(ns, CRASH_N)
    if receipted:
        assert held == "all", "the COMMIT was receipted by the active, the backup lost it"
    return held, receipted


@pytest.mark.parametrize("delay", [
    0.5,  # in the middle of the COMMIT
    pytest.param(0.0, marks=pytest.mark.long),
    pytest.param(0.2, marks=pytest.mark.long),
    pytest.param(1.0, marks=pytest.mark.long),
    pytest.param(4.0, marks=pytest.mark.long),  # done and receipted
])
def test_kill_9_of_the_active_during_a_large_commit_the_backup_holds_all_or_none(
        pair_factory, delay: float) -> None:
    pair = pair_factory(flags=LIMIT)
    held, receipted = pair_crash(pair, delay)
    print(f"active killed {delay} s after the COMMIT: the backup holds {held} of "
          f"{CRASH_N:,}, RECEIPT {'came' if receipted else 'did not come'}")


@pytest.mark.parametrize("delay", [0.0, 0.2])
def test_a_client_gone_right_after_its_commit_leaves_all_or_none(server_factory,
                                                                 delay: float) -> None:
    count = 30_000
    srv, admin = managed_server(server_factory, *LIMIT)
    conn = BlockingConnection(srv.host, srv.port, timeout=30)
    stage(conn, "big", QUEUE, count)
    with Canary(srv, interval=0.02) as canary:
        send_commit(conn, "big")
        if delay:
            time.sleep(delay)
        close_abruptly(conn)
        # the COMMIT goes on, or was dropped: either way the queue settles, at 0 or all
        readings: list[int | None] = []

        def settled() -> bool:
            status = admin_status(admin)
            readings.append(None if status is None or status["commits"]["under_way"]
                            else depth(status, QUEUE))
            recent = readings[-6:]  # no COMMIT under way, the same depth for 1.5 s
            return len(recent) == 6 and len(set(recent)) == 1 and recent[0] is not None

        wait_until(settled, f"{QUEUE} settled", 30, interval=0.3)
    assert srv.alive()
    assert canary.lost == [], f"the canary lost rounds {canary.lost[:10]}"
    held = all_or_none(drain(srv.address, QUEUE, expect=readings[-1], idle=0.5), count)
    print(f"client gone {delay} s after its COMMIT: {held} of {count:,}")
    # and the server serves the next producer
    again = BlockingConnection(srv.host, srv.port)
    try:
        again.send(QUEUE, body(7), {"n": "7"})
    finally:
        again.close()
    assert drain(srv.address, QUEUE, expect=1, idle=0.2) == [7]
