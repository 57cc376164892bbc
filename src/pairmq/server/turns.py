"""One budget for the frames of every connection in a turn of the event loop (issue 18).

Each connection applied its frames for at most 10 ms a turn, but a turn of the loop runs
the reads of every connection that has data, one after the other, then the backlogs that
waited: with a producer and a consumer busy, that was two and more budgets, plus what the
frames caused (deliveries, journal records), and turns of 50-100 ms remained in a drain.
Now the first connection to apply frames in a turn starts the turn's clock; every one
after it in the same turn sees how much is left. Each still applies at least one frame a
call, so none starves: what waits is applied at the next turn, in the order it waited.

A turn ends where the loop runs what was scheduled with `call_soon` during it: the clock
is reset by a callback scheduled when it starts, which runs first among them.
"""

from __future__ import annotations

import asyncio


class TurnBudget:
    """How long frames may still be applied in this turn of the loop (times are given)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._started: float | None = None  # when this turn's first frames were applied

    def start(self, now: float) -> None:
        """Frames are about to be applied: the first of a turn starts its clock."""
        if self._started is None:
            self._started = now
            asyncio.get_running_loop().call_soon(self._next_turn)

    def spent(self, now: float) -> bool:
        return self._started is not None and now - self._started > self.budget_s

    def _next_turn(self) -> None:
        self._started = None
