"""The serving role's driver of the COMMITs applied in slices (core/broker/committing.py).

One slice per turn of the event loop, as long as `SLICE_S` of work (its journal records
included), with sizes learnt from what the last slices took: a slice of 1,000 routed
messages took 25-30 ms, three times the frames' budget of a turn (TURN_BUDGET_S), and a
draining consumer beside it made turns long enough that a pair's lease, renewed every
few turns, ran out. And no more than `AHEAD` slices journaled but not confirmed (on disk
and, in a pair, on the backup): another client's record waits behind at most that much
of a COMMIT, not behind all of it while the backup catches up.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Final, Protocol

from pairmq.core.commit_ledger import CommitRun, CommitStep
from pairmq.server.guards.turn_budget import SliceSize
from pairmq.server.role.confirmations import Ticket

SLICE_S: Final = 0.01  # work per slice, as TURN_BUDGET_S for frames
AHEAD: Final = 2  # slices journaled and not confirmed yet, at most


class DriverState(StrEnum):
    IDLE = "idle"  # nothing scheduled: no COMMIT under way, or not serving
    SCHEDULED = "scheduled"  # the next slice runs at the next turn of the loop
    WAITING = "waiting"  # AHEAD slices wait for confirmation: the next waits for the oldest


class CommitHost(Protocol):
    """What the driver needs of its role (server/role/role.py)."""

    def commits_to_drive(self) -> bool: ...

    def step_commit_slice(self, stage: int, route: int) -> tuple[CommitStep, Ticket | None]: ...

    def confirmed(self, ticket: Ticket) -> bool: ...

    def when_confirmed(self, ticket: Ticket, callback: Callable[[], None]) -> None: ...

    def commit_finished(self, run: CommitRun, ticket: Ticket | None) -> None: ...


class CommitDriver:
    def __init__(self, host: CommitHost) -> None:
        self.state = DriverState.IDLE
        self._host = host
        self._ahead: collections.deque[Ticket] = collections.deque()
        self._stage = SliceSize(SLICE_S, floor=100, per_item_s=5e-6)
        self._route = SliceSize(SLICE_S, floor=50, per_item_s=30e-6)

    def wake(self) -> None:
        """There may be a COMMIT to advance: schedule its next slice, unless one is
        scheduled already or waits for a confirmation."""
        if self.state is DriverState.IDLE and self._host.commits_to_drive():
            self.state = DriverState.SCHEDULED
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        self.state = DriverState.IDLE
        host = self._host
        if not host.commits_to_drive():
            return
        ahead = self._ahead
        while ahead and host.confirmed(ahead[0]):
            ahead.popleft()
        if len(ahead) >= AHEAD:
            self.state = DriverState.WAITING
            host.when_confirmed(ahead[0], self._confirmed)
            return
        started = time.perf_counter()
        step, ticket = host.step_commit_slice(self._stage.size(), self._route.size())
        took = time.perf_counter() - started
        if step.staged:
            self._stage.took(step.staged, took)
        elif step.routed:
            self._route.took(step.routed, took)
        if ticket is not None:
            ahead.append(ticket)
        for run in step.finished:
            host.commit_finished(run, ticket)
        self.wake()

    def _confirmed(self) -> None:
        if self.state is DriverState.WAITING:
            self.state = DriverState.IDLE
            self.wake()
