"""The time the server gives its broker: core/ reads no clock, every command takes `now`
in milliseconds since the epoch, and this is where the server reads it."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
