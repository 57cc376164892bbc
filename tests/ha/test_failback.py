"""After a failover, the restarted primary takes its place back (allow_failback) or not."""

from __future__ import annotations

import time

from tests.ha.pair import Pair
from tests.ha.under_load import UnderLoad, queue_depth


def run_failover_and_return(pair: Pair, expect_active: str) -> UnderLoad:
    """Load and consumer running: kill -9 the primary, restart it, wait for the pair to form
    with `expect_active` active; the load is stopped and everything consumed."""
    with UnderLoad(pair) as run:
        run.load.wait_receipts(200, 20)
        pair.kill("primary")
        pair.wait_active(10, "backup")
        run.load.wait_receipts(200, 20)
        pair.restart("primary")
        pair.wait_formed(15, active=expect_active)
        run.load.wait_receipts(200, 20)
        # and it stays that way
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert pair.state(expect_active) == "ACTIVE", pair.describe()
            assert pair.state(pair.other(expect_active)) == "PASSIVE", pair.describe()
            time.sleep(0.1)
        run.drain()
    assert queue_depth(pair, expect_active) == 0
    return run


def test_failback_the_primary_takes_over_again(pair: Pair) -> None:
    run = run_failover_and_return(pair, expect_active="primary")
    addrs = pair.client_addresses()
    # One move for each failover: to the backup at the kill, back at the failback. The
    # server handing over refuses CONNECTs meanwhile, naming the primary (issue 21: a
    # client used to come back to it, and move a second time when it stepped down).
    for client in (run.load.producer, run.consumer):
        assert client.connected_to == [addrs[0], addrs[1], addrs[0]], (
            client.connected_to, client.failures)
        assert [e.kind for e in client.events] == ["FAILOVER", "FAILOVER"], client.failures
    assert "Handing over to primary" in pair.logs("backup")
    assert pair.status("backup")["ha"]["synchronized-with-live"] is True
    assert pair.status("primary")["ha"]["synchronized-with-backup"] is True


def test_without_failback_the_roles_simply_reverse(pair_factory) -> None:
    pair = pair_factory(flags=["--no-allow-failback"])
    pair.start(parallel=True)
    pair.wait_formed()
    run = run_failover_and_return(pair, expect_active="backup")
    addrs = pair.client_addresses()
    assert run.load.producer.connected_to[-1] == addrs[1]
    assert "Handing over" not in pair.logs("backup")
    assert pair.status("primary")["ha"]["synchronized-with-live"] is True
    assert pair.status("backup")["ha"]["synchronized-with-backup"] is True
