"""Pair scenarios several HA test files start from."""

from __future__ import annotations

import time

from tests.ha.clients import send_some
from tests.ha.pair import Pair

QUEUE = "/queue/ha-restart"


def both_down_with_newest(pair: Pair, newest: str,
                          queue: str = QUEUE) -> tuple[list[str], list[str]]:
    """A formed pair; messages `old` on both; the older server dies; messages `new` only on
    `newest`, which then dies too. Returns (old, new) dup-ids."""
    older = pair.other(newest)
    old = send_some(pair.client_address("primary"), queue, "old", 10)
    pair.kill(older)
    pair.wait_active(10, newest)
    pair.wait_state(newest, "STANDALONE", 10)
    new = send_some(pair.client_address(newest), queue, "new", 10)
    pair.kill(newest)
    return old, new


def assert_not_serving_for(pair: Pair, name: str, seconds: float) -> None:
    """`name` reports no serving state at any time during `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = pair.state(name)
        assert state not in ("ACTIVE", "STANDALONE"), pair.describe()
        time.sleep(0.1)
