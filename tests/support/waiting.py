"""Waiting in tests: every wait is bounded, and says what it waited for when it gives up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

WAIT = 10.0  # the bound for anything a server should do promptly


def wait_until(predicate: Callable[[], T], what: str, timeout: float = WAIT,
               interval: float = 0.02) -> T:
    """Poll `predicate` until it returns something truthy, and return that; TimeoutError
    naming `what` after `timeout` seconds (a caller may catch it to say more)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
