"""kill -9 under load: the other server carries on, nothing receipted is lost or doubled."""

from __future__ import annotations

import time

from tests.ha.pair import Pair
from tests.ha.under_load import UnderLoad, queue_depth
from tests.support.waiting import wait_until


def test_kill_active_under_load_the_backup_takes_over(pair: Pair) -> None:
    addrs = pair.client_addresses()
    with UnderLoad(pair) as run:
        run.load.wait_receipts(300, 20)
        pair.kill("primary")
        killed = time.monotonic()
        assert pair.wait_active(10, "backup") == "backup"
        takeover = time.monotonic() - killed
        run.load.wait_receipts(300, 20)
        run.drain()
    producer = run.load.producer
    assert producer.connected_to[0] == addrs[0]
    assert producer.connected_to[-1] == addrs[1], producer.connected_to
    assert producer.resent > 0 or not producer.failures
    assert run.consumer.connected_to[-1] == addrs[1]
    assert takeover < 5.0
    assert queue_depth(pair, "backup") == 0
    logs = pair.logs("backup")
    assert "New status of remote server = DEAD" in logs
    assert "Local server switched to STANDALONE" in logs


def test_kill_backup_under_load_the_active_goes_on_alone(pair: Pair) -> None:
    addrs = pair.client_addresses()
    with UnderLoad(pair) as run:
        run.load.wait_receipts(300, 20)
        pair.kill("backup")
        st = pair.wait_state("primary", "STANDALONE", 10)
        assert st["ha"]["synchronized-with-backup"] is False
        run.load.wait_receipts(300, 15)  # receipts keep coming without the backup
        assert pair.active() == "primary"

        pair.restart("backup")
        pair.wait_state("backup", "PASSIVE", 20)
        wait_until(lambda: (pair.status("primary") or {}).get("ha", {})
                   .get("synchronized-with-backup"), "synchronized-with-backup again", 20)
        assert pair.state("primary") == "ACTIVE"
        run.load.wait_receipts(300, 15)
        run.drain()
        # the backup holds everything the active wrote, acks included
        wait_until(lambda: pair.status("backup")["journal"]["appended_seq"]
                   == pair.status("primary")["journal"]["appended_seq"],
                   "the backup caught up with the active's journal", 10)
        assert pair.status("backup")["ha"]["synchronized-with-live"] is True
    # the producer never had to leave the active
    assert set(run.load.producer.connected_to) == {addrs[0]}, run.load.producer.failures
    logs = pair.logs("primary")
    assert "Old status of remote server = PASSIVE" in logs
    assert "New status of remote server = DEAD" in logs
    # and the resynchronised backup is a real one: it takes over with nothing left behind
    pair.kill("primary")
    pair.wait_active(10, "backup")
    wait_until(lambda: queue_depth(pair, "backup") is not None, "backup status", 10)
    assert queue_depth(pair, "backup") == 0
