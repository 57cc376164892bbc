"""A backup joining late, while the active holds 100,000 persistent messages and load goes on."""

from __future__ import annotations

import time

import pytest

from tests.ha.clients import Load, bulk_send, drain
from tests.support.waiting import wait_until

BULK = "/queue/ha-bulk"
LOAD = "/queue/ha-late-load"
COUNT = 100_000


@pytest.mark.long
@pytest.mark.timeout(240)
def test_late_backup_syncs_100k_and_a_failover_loses_nothing(pair_factory) -> None:
    # the server's default intervals: a busy active is not mistaken for a dead one
    pair = pair_factory(heartbeat_ms=500, activation_ms=2000)
    pair.start(order=["primary"])
    pair.wait_state("primary", "STANDALONE", 10)
    primary, backup = (pair.client_address(n) for n in ("primary", "backup"))

    started = time.monotonic()
    bulk = bulk_send(primary, BULK, COUNT, batch=1000)
    built = time.monotonic() - started
    assert len(bulk) == COUNT

    load = Load([primary, backup], LOAD).start()
    try:
        load.wait_receipts(100, 20)
        pair.start_server("backup")
        pair.wait_state("backup", "PASSIVE", 90)
        wait_until(lambda: pair.status("primary")["ha"]["synchronized-with-backup"],
                   "the active sees its backup in sync", 10)
        assert pair.state("primary") == "ACTIVE"
        load.wait_receipts(100, 20)  # the load went on during the synchronisation

        pair.kill("primary")
        pair.wait_active(30, "backup")
        load.wait_receipts(100, 30)
        receipted = load.stop()
    finally:
        load.stop_event.set()
    assert load.producer.connected_to[-1] == backup

    got = drain(backup, BULK, idle=2.0, timeout=120)
    assert len(got) == COUNT, f"{COUNT - len(set(bulk) & set(got))} of the 100,000 lost " \
                              f"(built in {built:.1f} s)\n{pair.describe()}"
    assert set(got) == set(bulk)
    assert set(got.values()) == {1}
    loaded = drain(backup, LOAD)
    missing = set(receipted) - set(loaded)
    assert not missing, f"{len(missing)} receipted messages of the load lost"
    assert set(loaded.values()) == {1}, {d: n for d, n in loaded.items() if n > 1}
