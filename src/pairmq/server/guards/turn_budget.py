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


class _PerTurn:
    """A clock started by the first use in a turn of the loop, and reset when the turn
    ends (a callback scheduled when it starts, which runs first among the turn's)."""

    def __init__(self) -> None:
        self._started: float | None = None  # when this turn's clock started
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's, once known

    def _begin(self, now: float) -> None:
        self._started = now
        loop = self._loop
        if loop is None or loop.is_closed():
            # found once: asyncio.get_running_loop() costs a getpid() system call in
            # Python 3.11, and a clock starts every turn
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._started = None


class TurnBudget(_PerTurn):
    """How long frames may still be applied in this turn of the loop (times are given)."""

    def __init__(self, budget_s: float) -> None:
        super().__init__()
        self.budget_s = budget_s

    def start(self, now: float) -> float:
        """Frames are about to be applied: the first of a turn starts its clock. Returns
        when the turn's budget is spent (on the same clock as `now`)."""
        started = self._started
        if started is None:
            self._begin(now)
            started = now
        return started + self.budget_s



class ReadBudget(_PerTurn):
    """How many paged messages or stream records may still be read back from the journal
    in this turn of the loop, by time (issue 18).

    The role reads them back when it flushes, and it flushes after every connection's read:
    with two stream readers ACKing in the same turn, a limit of 1,024 records per flush let
    a turn read and send 2,048 (turns of 50-55 ms in benchmarks/turns.py --stream). A limit
    per turn in records instead (1,024) kept turns short but sent one reader's batch a turn,
    and the read rate fell by a fifth. So the budget is time: a turn may read back while,
    at the cost per record the last reads took, the reads stay within `budget_s`; the first
    read of a turn is always allowed at least `floor` records, so every turn makes
    progress. Times are given; the clock renews each turn as TurnBudget's does."""

    def __init__(self, budget_s: float, floor: int, per_record_s: float = 25e-6) -> None:
        super().__init__()
        self.budget_s = budget_s
        self.floor = floor
        self.per_record_s = per_record_s  # the last reads' cost per record, smoothed
        self.fresh = False  # the last room() started the turn's clock

    def room(self, now: float) -> int:
        """Records that may be read back now; the first call of a turn starts its clock."""
        started = self._started
        self.fresh = started is None
        if started is None:
            self._begin(now)
            return max(self.floor, int(self.budget_s / self.per_record_s))
        return max(0, int((self.budget_s - (now - started)) / self.per_record_s))

    def took(self, records: int, seconds: float) -> None:
        """`records` were read back (and handed on) in `seconds`."""
        if records:
            self.per_record_s = (self.per_record_s + seconds / records) / 2


class SliceSize:
    """How many items of one kind fit in `budget_s` of a turn, at what the last slices took
    each (smoothed as ReadBudget's cost is); at least `floor`, so every slice progresses."""

    def __init__(self, budget_s: float, floor: int, per_item_s: float) -> None:
        self.budget_s = budget_s
        self.floor = floor
        self.per_item_s = per_item_s

    def size(self) -> int:
        return max(self.floor, int(self.budget_s / self.per_item_s))

    def took(self, items: int, seconds: float) -> None:
        if items:
            self.per_item_s = (self.per_item_s + seconds / items) / 2

