"""Paging as a mode in the core (core/paged_log.py, core/broker/paging.py, docs/durability.md
"Paging"): past its limit under policy page, an address's new persistent messages go to its paged
log with no object kept; a queue holds a window of them in memory, refilled in order; a
topic's durable subscriptions share one log with a cursor each; the address leaves paging
once drained; a recovery and a backup's follower rebuild the same. The store's part (where
entries lie, reading them back) is played by tests/support/pages.py."""

from __future__ import annotations

from array import array

from pairmq.core import Broker, CoreSettings
from pairmq.core import records as rec
from pairmq.core.broker.paging import PAGE_WINDOW, PAGE_WINDOW_BYTES
from pairmq.core.paged_log import CHUNK, PagedLog
from pairmq.core.settings import AddressFullPolicy
from tests.support.pages import Pages
from tests.support.replay import replayed

NOW = 1_000_000
P = {"persistent": "true"}
BODY = b"x" * 1000
LIMIT = 5000  # 5 messages of about 1,100 bytes: the 5th passes it


def make(**settings) -> Broker:
    settings.setdefault("max_size_bytes", LIMIT)
    broker = Broker(CoreSettings(address_full_policy=AddressFullPolicy.PAGE, **settings))
    for conn in (1, 2, 3):
        broker.open_session(conn, "1.2")
    return broker


def send(broker: Broker, destination: str, count: int, start: int = 0,
         headers: dict[str, str] | None = None) -> None:
    for i in range(start, start + count):
        broker.send(1, destination, {**(headers or P), "n": str(i)}, BODY, NOW)


def received(broker: Broker, conn: int) -> list[str]:
    return [d.entry.message.headers["n"] for d in broker.take_outbox().get(conn, [])]


def test_past_the_limit_messages_keep_no_object_once_on_disk():
    broker, pages = make(), Pages()
    send(broker, "/queue/q", 2000)
    q = broker.queues["/queue/q"]
    log = q.address.log
    assert log is not None and q.count == 5 and len(log.pending) == 1995
    pages.sync(broker)
    assert not log.pending and log.located_end == 1995, "located: the objects are gone"
    assert broker.paged_waiting(q) == 1995
    assert q.address.size > 2000 * 1000, "the destination still counts every byte"
    assert broker.capacity.memory < 10 * 1100, "memory counts only what is in memory"
    assert log.nbytes == 1995 * 28


def test_a_consumer_gets_every_message_in_order_through_windows_of_bounded_size():
    broker, pages = make(), Pages()
    send(broker, "/queue/q", 5000)
    pages.sync(broker)
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=100)
    got: list[str] = []
    q = broker.queues["/queue/q"]
    while True:
        pages.serve(broker, NOW)
        assert q.count <= PAGE_WINDOW + 5, "a window at a time in memory"
        deliveries = broker.take_outbox().get(2, [])
        if not deliveries:
            break
        for d in deliveries:
            got.append(d.entry.message.headers["n"])
            broker.ack(2, d.ack_id, NOW)
    assert got == [str(i) for i in range(5000)]
    assert pages.read == 4995
    assert broker.paged_waiting(q) == 0 and q.address.size == 0


def test_a_window_of_large_messages_stops_at_its_bytes_not_its_count():
    """The store reads a window whole, bodies included: 64 KiB messages come back
    PAGE_WINDOW_BYTES at a time, not PAGE_WINDOW (64 MiB) at once, and still every one in
    order."""
    broker, pages = make(max_size_bytes=200 * 1024), Pages()
    large = b"y" * (64 * 1024)
    for i in range(400):
        broker.send(1, "/queue/q", {**P, "n": str(i)}, large, NOW)
    pages.sync(broker)
    q = broker.queues["/queue/q"]
    log = q.address.log
    assert log is not None and broker.paged_waiting(q) == 400 - q.count
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=1000)
    got = received(broker, 2)
    windows = []
    while wanted := broker.take_page_wanted():
        for wq, wlog, numbers in wanted:
            windows.append(sum(wlog.size_of(n) for n in numbers))
            broker.paged_in(wq, numbers, [pages.record(wlog, n) for n in numbers], NOW)
        broker.take_moved_logs()
        got += received(broker, 2)
    assert len(windows) > 1 and max(windows) < PAGE_WINDOW_BYTES + 70 * 1024, windows
    assert got == [str(i) for i in range(400)]


def test_while_a_queue_has_paged_messages_new_ones_follow_them_and_it_leaves_paging_drained():
    broker, pages = make(), Pages()
    send(broker, "/queue/q", 10)
    q = broker.queues["/queue/q"]
    broker.subscribe(2, "s", "/queue/q", NOW)  # auto ack: takes everything it is given
    pages.serve(broker, NOW)
    assert received(broker, 2) == [str(i) for i in range(10)]
    assert q.address.size == 0 and not q.address.full
    send(broker, "/queue/q", 3, start=10)  # drained and open again: in memory at once
    assert q.address.log is not None and not q.address.log.busy
    assert received(broker, 2) == ["10", "11", "12"]
    assert not q.address.log.pending


def test_a_non_persistent_message_cannot_be_paged_and_comes_out_before_them():
    broker, pages = make(), Pages()
    send(broker, "/queue/q", 8)
    broker.send(1, "/queue/q", {"n": "volatile"}, BODY, NOW)
    broker.subscribe(2, "s", "/queue/q", NOW)
    pages.serve(broker, NOW)
    assert received(broker, 2) == ["0", "1", "2", "3", "4", "volatile", "5", "6", "7"]


def test_durable_subscriptions_share_one_log_each_reading_it_at_its_own_pace():
    broker, pages = make(max_size_bytes=3 * LIMIT), Pages()
    broker.open_session(4, "1.2", client_id="c")
    for name in ("fast", "slow"):
        broker.subscribe(4, name, "/topic/t", NOW, durable_name=name)
        broker.unsubscribe(4, name, NOW)  # kept, no consumer
    send(broker, "/topic/t", 3 * CHUNK)
    pages.sync(broker)
    address = broker.addresses["/topic/t"]
    log = address.log
    assert log is not None and len(log.cursors) == 2, "one log, a cursor per subscription"
    fast, slow = broker.durables["c:fast"], broker.durables["c:slow"]
    assert broker.paged_waiting(fast) == broker.paged_waiting(slow) == 3 * CHUNK - 7
    broker.close_session(4, NOW)
    broker.open_session(5, "1.2", client_id="c")
    broker.subscribe(5, "fast", "/topic/t", NOW, durable_name="fast")
    got: list[str] = []
    while True:  # an auto-ack consumer takes at most its prefetch per turn
        pages.serve(broker, NOW)
        more = received(broker, 5)
        got += more
        if broker.take_capped(5):
            broker.set_writable(5, True, NOW)
        elif not more:
            break
    assert got == [str(i) for i in range(3 * CHUNK)]
    assert broker.paged_waiting(fast) == 0 and broker.paged_waiting(slow) == 3 * CHUNK - 7
    assert log.start == 0, "the slow subscription still needs every entry"
    broker.unsubscribe(5, "fast", NOW, delete_durable=True)
    broker.close_session(5, NOW)
    broker.open_session(6, "1.2", client_id="c")
    broker.unsubscribe(6, None, NOW, delete_durable=True, durable_name="slow")
    assert not log.cursors and address.size == 0, "a deleted subscription's bytes go too"


def test_a_recovery_rebuilds_the_log_and_removals_find_paged_messages_by_order():
    broker, pages = make(), Pages()
    send(broker, "/queue/q", 30)
    pages.sync(broker)
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=10)
    pages.serve(broker, NOW)
    acked = broker.take_outbox()[2][:8]
    for d in acked:
        broker.ack(2, d.ack_id, NOW)
    records = broker.take_records()
    located = {r[1].order: (0, i * 100, 100) for i, r in enumerate(r for r in records
                                                                    if r[0] == rec.ADD)}
    replay = replayed(records, paged_beyond=lambda d: LIMIT, located=located)
    assert replay.logs["/queue/q"].waiting("/queue/q") == 25 - 3
    rebuilt = Broker(CoreSettings(address_full_policy=AddressFullPolicy.PAGE,
                                  max_size_bytes=LIMIT))
    rebuilt.restore(replay)
    q = rebuilt.queues["/queue/q"]
    assert q.count + rebuilt.paged_waiting(q) == 30 - 8
    assert q.address.log is not None and q.address.log.busy


def test_a_removal_by_id_only_that_misses_asks_for_a_replay_without_logs():
    log_replay = replayed([], paged_beyond=lambda d: LIMIT)
    log_replay.logs["/queue/q"] = PagedLog()
    log_replay.remove("/queue/q", "ID:gone", -1)
    assert log_replay.legacy_miss


def test_a_backup_follows_paged_messages_their_acks_and_deliveries():
    active = make()
    send(active, "/queue/q", 20)
    backup = Broker(CoreSettings(address_full_policy=AddressFullPolicy.PAGE,
                                 max_size_bytes=LIMIT))
    backup.start_following()
    records = active.take_records()
    for record in records:
        if record[0] == rec.ADD:
            backup.follow_add(record[1], record[2], 0)
        elif record[0] == rec.DEST:
            backup.follow_destination(record[1])
    log = backup.addresses["/queue/q"].log
    assert log is not None and len(log.pending) == 15, "the backup pages as the active does"
    for message in list(log.pending):
        log.locate(message, 0, 0, 0, 0)
    q = backup.queues["/queue/q"]
    # the active pages in and delivers 5 .. 9; acknowledges 5, 6 and 8; 7 is handed out
    by_n = {r[1].headers["n"]: r[1] for r in records if r[0] == rec.ADD}
    for n in ("5", "6", "8"):
        backup.follow_remove("/queue/q", by_n[n].message_id, by_n[n].order)
    backup.follow_delivered("/queue/q", by_n["7"].message_id, 1, by_n["7"].order)
    backup.take_moved_logs()
    assert log.cursors[q] == 2 and log.skip[q] == {3}, "5, 6 passed; 8 deleted past 7"
    assert backup.paged_waiting(q) == 15 - 3 and log.deliveries == {2: 1}
    backup.end_following()
    for pending in list(log.pending):
        log.locate(pending, 0, 0, 0, 0)
    numbers = log.next_numbers(q, 100)
    assert numbers[:3] == [2, 4, 5], "8 is skipped: acknowledged on the active"


def test_a_log_finds_each_entry_by_its_order_and_nothing_else():
    """`PagedLog.find` (what a start replaying acknowledgements asks, millions of times):
    every entry by its order, in the log's order or not, after the oldest chunks are
    dropped too; None for an order older than the log (its segment let go), between two
    entries, or newer than all."""
    log = PagedLog()
    log.attach("q")
    orders = [10 + 3 * i for i in range(3 * CHUNK + 5)]
    log.extend(1, array("I", range(len(orders))), array("I", [1] * len(orders)),
               array("Q", orders), array("I", [100] * len(orders)))
    assert [log.find(o) for o in orders] == list(range(len(orders)))
    assert [log.find(o) for o in reversed(orders)] == list(reversed(range(len(orders))))
    assert log.find(orders[-1] - CHUNK * 3) == len(orders) - 1 - CHUNK
    assert [log.find(o) for o in (0, 9, 11, orders[CHUNK] + 1, orders[-1] + 1)] == [None] * 5
    log.cursors["q"] = log.released = 2 * CHUNK + 1
    log.drop_passed()
    assert log.find(orders[0]) is None and log.find(orders[CHUNK - 1]) is None
    assert log.find(orders[2 * CHUNK]) == 2 * CHUNK
    assert [log.find(o) for o in orders[2 * CHUNK:]] == list(range(2 * CHUNK, len(orders)))
