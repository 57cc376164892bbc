"""A clean stop (SIGTERM) of the active: the backup takes over only with failover_on_shutdown."""

from __future__ import annotations

import time

import pytest

from pairmq.client.plain import BlockingConnection, StompError
from tests.ha.clients import drain, send_some
from tests.ha.pair import HOST, Pair
from tests.ha.under_load import QUEUE, UnderLoad

POLICIES = ["replication", "shared-store"]
# what the stopping active and the backup that takes over log, per policy
HAND_OVER_LOGS = {"replication": ("Handing over to backup", "handed over"),
                  "shared-store": ("shutting down (failover_on_shutdown = true)",
                                   "acquired the lock of the shared store")}


def formed(pair_factory, policy: str, flags: list[str]) -> Pair:
    pair = pair_factory(policy=policy, flags=flags)
    pair.start(parallel=True)
    pair.wait_formed()
    return pair


@pytest.mark.parametrize("policy", POLICIES)
def test_sigterm_of_the_active_leaves_the_backup_not_serving(pair_factory, policy: str
                                                              ) -> None:
    pair = formed(pair_factory, policy, [])
    sent = send_some(pair.client_address("primary"), QUEUE, "before", 20)
    assert pair.stop("primary") == 0
    pair.wait_state("backup", "WAITING", 10)
    deadline = time.monotonic() + 2.0  # five activation intervals
    while time.monotonic() < deadline:
        assert pair.state("backup") == "WAITING", pair.describe()
        time.sleep(0.1)
    with pytest.raises(StompError) as refused:
        BlockingConnection(HOST, pair.stomp_port["backup"], timeout=5)
    assert "WAITING" in refused.value.frame.headers.get("message", "")
    assert "failover_on_shutdown is off" in pair.logs("backup")
    assert "pairmq server primary stopped" in pair.logs("primary")
    # the primary comes back and serves its messages again, the backup in sync
    pair.restart("primary")
    pair.wait_formed(15)
    got = drain(pair.client_address("primary"), QUEUE)
    assert sorted(got) == sorted(sent) and set(got.values()) == {1}


@pytest.mark.parametrize("policy", POLICIES)
def test_sigterm_with_failover_on_shutdown_hands_over_to_the_backup(pair_factory, policy: str
                                                                     ) -> None:
    pair = formed(pair_factory, policy, ["--failover-on-shutdown"])
    addrs = pair.client_addresses()
    with UnderLoad(pair) as run:
        run.load.wait_receipts(200, 20)
        started = time.monotonic()
        assert pair.stop("primary") == 0
        pair.wait_active(10, "backup")
        assert time.monotonic() - started < 10
        run.load.wait_receipts(200, 20)
        run.drain()
    assert run.load.producer.connected_to[-1] == addrs[1]
    said_by_primary, said_by_backup = HAND_OVER_LOGS[policy]
    assert said_by_primary in pair.logs("primary")
    assert said_by_backup in pair.logs("backup")
