"""A PASSIVE backup follows the active's records into its own broker, so a takeover replays
nothing: what it serves after a kill -9 of the active is what recovery from its journal
gives (checked by restarting it), and it serves as soon with 100,000 messages retained
as with none (docs/ha.md, "Taking over")."""

from __future__ import annotations

import time

import pytest

from tests.ha.pair import Pair
from tests.integration.rawstomp import connect as raw_connect
from tests.support.bulk import produce
from tests.support.mixed_state import BODY, assert_served_as_built, build_mixed_state, read_all

P = {"persistent": "true"}


def test_after_a_kill_the_backup_serves_what_recovery_of_its_journal_gives(pair_factory
                                                                            ) -> None:
    pair = pair_factory(flags=["--paging-bytes", "20000"])
    pair.start(parallel=True)
    pair.wait_formed()
    expected, unacked, clients = build_mixed_state(pair.client_address("primary"))
    held = pair.status("backup")["destinations"]
    assert held["/queue/a"]["messages"] == 25, held  # followed, unacked ones included
    assert held["/queue/a"]["paged_bytes"] > 10 * BODY, held  # bodies left in its journal

    pair.kill("primary")
    pair.wait_active(15, "backup")
    for client in clients:
        client.close()
    served = read_all(pair.client_address("backup"))
    assert_served_as_built(served, expected, unacked)

    pair.kill("backup")  # what it served must be what its journal says
    pair.start_server("backup")
    pair.wait_state("backup", "STANDALONE", 15)
    again = read_all(pair.client_address("backup"))
    assert again == [(d, x, i, b, count + 1) for d, x, i, b, count in served]


def first_confirmed_send(server: tuple[str, int], give_up: float) -> float:
    """Seconds until the server confirms a persistent SEND (polled every 5 ms)."""
    started = time.monotonic()
    while time.monotonic() - started < give_up:
        try:
            client, _ = raw_connect(server, timeout=2)
            try:
                client.request("SEND", {"destination": "/queue/probe", **P}, b"probe",
                               timeout=2)
                return time.monotonic() - started
            finally:
                client.close()
        except (OSError, AssertionError, TimeoutError):
            time.sleep(0.005)
    raise AssertionError(f"the backup confirmed no SEND within {give_up} s")


def takeover_seconds(pair: Pair) -> float:
    pair.kill("primary")
    return first_confirmed_send(pair.client_address("backup"), 30)


@pytest.mark.long  # CI time; benchmarks/failover.py --retained measures it
@pytest.mark.slow
def test_takeover_time_does_not_grow_with_the_messages_retained(pair_factory) -> None:
    empty = pair_factory()
    empty.start(parallel=True)
    empty.wait_formed()
    with_none = takeover_seconds(empty)
    empty.close()

    full = pair_factory()
    full.start(parallel=True)
    full.wait_formed()
    produce(full.client_address("primary"), "/queue/retained", 0, 100_000)
    with_100k = takeover_seconds(full)
    activation = full.activation_ms / 1000
    print(f"takeover: {with_none:.2f} s with no message retained, {with_100k:.2f} s with "
          "100,000")
    assert with_100k < activation + 1.0, (
        f"took {with_100k:.2f} s with 100,000 messages retained ({with_none:.2f} s with "
        f"none; activation interval {activation} s)")
    assert with_100k < with_none + 0.75, (with_100k, with_none)
