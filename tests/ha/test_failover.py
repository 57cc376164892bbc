"""kill -9 under load: the other server carries on, nothing receipted is lost or doubled."""

from __future__ import annotations

import time

from tests.ha.clients import FailoverConsumer, Load, check_exactly_once, parse_address
from tests.ha.pair import NAMES, Pair, wait_for

QUEUE = "/queue/ha-load"


def addresses(pair: Pair) -> list[tuple[str, int]]:
    return [parse_address(pair.stomp_address(n)) for n in NAMES]


def missing_report(missing: set[str], receipted: list[str], load: Load,
                   consumer: FailoverConsumer, pair: Pair) -> str:
    order = {d: i for i, d in enumerate(receipted)}
    ids = sorted(missing, key=lambda d: order[d])
    producer = load.producer
    return (f"{len(missing)} of {len(receipted)} receipted messages never consumed: "
            f"{ids[:5]} ... {ids[-5:]} (receipt #{order[ids[0]]}..#{order[ids[-1]]}); "
            f"producer connected to {producer.connected_to}, failures {producer.failures}, "
            f"resent {producer.resent}; consumer connected to {consumer.connected_to}, "
            f"failures {consumer.failures}, delivered {sum(consumer.delivered.values())}\n"
            f"{pair.describe()}")


def queue_depth(pair: Pair, name: str) -> int | None:
    st = pair.status(name)
    if st is None:
        return None
    return sum(d["messages"] for key, d in st["destinations"].items() if "ha-load" in key)


def test_kill_active_under_load_the_backup_takes_over(pair: Pair) -> None:
    addrs = addresses(pair)
    consumer = FailoverConsumer(addrs, QUEUE).start()
    load = Load(addrs, QUEUE).start()
    try:
        load.wait_receipts(300, 20)
        pair.kill("primary")
        killed = time.monotonic()
        assert pair.wait_active(10, "backup") == "backup"
        takeover = time.monotonic() - killed
        load.wait_receipts(300, 20)
        receipted = load.stop()
        missing = consumer.wait_consumed(set(receipted), 30)
        assert not missing, missing_report(missing, receipted, load, consumer, pair)
        consumer.wait_idle(0.5)
    finally:
        load.stop_event.set()
        consumer.stop()
    check_exactly_once(receipted, consumer)
    producer = load.producer
    assert producer.connected_to[0] == addrs[0]
    assert producer.connected_to[-1] == addrs[1], producer.connected_to
    assert producer.resent > 0 or not producer.failures
    assert consumer.connected_to[-1] == addrs[1]
    assert takeover < 5.0
    assert queue_depth(pair, "backup") == 0
    logs = pair.logs("backup")
    assert "New status of remote server = DEAD" in logs
    assert "Local server switched to STANDALONE" in logs


def test_kill_backup_under_load_the_active_goes_on_alone(pair: Pair) -> None:
    addrs = addresses(pair)
    consumer = FailoverConsumer(addrs, QUEUE).start()
    load = Load(addrs, QUEUE).start()
    try:
        load.wait_receipts(300, 20)
        pair.kill("backup")
        st = pair.wait_state("primary", "STANDALONE", 10)
        assert st["ha"]["synchronized-with-backup"] is False
        load.wait_receipts(300, 15)  # receipts keep coming without the backup
        assert pair.active() == "primary"

        pair.restart("backup")
        pair.wait_state("backup", "PASSIVE", 20)
        wait_for(lambda: (pair.status("primary") or {}).get("ha", {})
                 .get("synchronized-with-backup"), 20, "synchronized-with-backup again")
        assert pair.state("primary") == "ACTIVE"
        load.wait_receipts(300, 15)
        receipted = load.stop()
        missing = consumer.wait_consumed(set(receipted), 30)
        assert not missing, missing_report(missing, receipted, load, consumer, pair)
        consumer.wait_idle(0.5)
        # the backup holds everything the active wrote, acks included
        wait_for(lambda: pair.status("backup")["journal"]["appended_seq"]
                 == pair.status("primary")["journal"]["appended_seq"], 10,
                 "the backup caught up with the active's journal")
        assert pair.status("backup")["ha"]["synchronized-with-live"] is True
    finally:
        load.stop_event.set()
        consumer.stop()
    check_exactly_once(receipted, consumer)
    # the producer never had to leave the active
    assert set(load.producer.connected_to) == {addrs[0]}, load.producer.failures
    logs = pair.logs("primary")
    assert "Old status of remote server = PASSIVE" in logs
    assert "New status of remote server = DEAD" in logs
    # and the resynchronised backup is a real one: it takes over with nothing left behind
    pair.kill("primary")
    pair.wait_active(10, "backup")
    wait_for(lambda: queue_depth(pair, "backup") is not None, 10, "backup status")
    assert queue_depth(pair, "backup") == 0
