"""Failed logins slow down their address only (server/guards/failed_logins.py), decided with
given times."""

from __future__ import annotations

from pairmq.server.guards import failed_logins as logins
from pairmq.server.guards.failed_logins import LoginThrottle


def test_delays_double_up_to_the_cap_and_a_good_login_forgets() -> None:
    throttle = LoginThrottle(max_delay_s=1.0)
    assert throttle.admit("10.0.0.1", 0.0) == 0.0
    delays = [throttle.failed("10.0.0.1", float(i * 10)) for i in range(6)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    now = 50.0  # the 6th failure was at 50: the next attempt waits 1 s
    assert throttle.admit("10.0.0.1", now) == 1.0
    assert throttle.admit("10.0.0.2", now) == 0.0  # another address: at once
    assert throttle.admit("10.0.0.1", now + 1.0) == 0.0
    throttle.succeeded("10.0.0.1")
    assert throttle.admit("10.0.0.1", now + 1.0) == 0.0
    assert throttle.failed("10.0.0.1", now + 2) == 0.1  # counted afresh


def test_parallel_attempts_take_one_turn_per_delay() -> None:
    """A guesser with many connections: each admitted attempt takes the host's turn, so
    the others wait a delay more, one after another, not all at the same instant."""
    throttle = LoginThrottle(max_delay_s=0.5)
    throttle.failed("h", 0.0)  # delay 0.1: the next attempt at 0.1
    waits = [throttle.admit("h", 0.1) for _ in range(3)]
    assert waits[0] == 0.0 and all(w > 0 for w in waits[1:])
    assert throttle.admit("h", 0.1 + waits[1]) == 0.0


def test_failures_are_forgotten_after_a_while_and_memory_is_bounded(monkeypatch) -> None:
    throttle = LoginThrottle(max_delay_s=5.0)
    throttle.failed("h", 0.0)
    throttle.failed("h", 0.0)
    assert throttle.admit("h", logins.FORGET_AFTER_S + 1) == 0.0
    assert len(throttle) == 0
    monkeypatch.setattr(logins, "MAX_HOSTS", 100)
    for i in range(500):
        throttle.failed(f"10.0.{i // 250}.{i % 250}", 1.0)
    assert len(throttle) == 100
    assert LoginThrottle(max_delay_s=0).failed("h", 0.0) == 0.0  # turned off
