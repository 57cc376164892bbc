"""The serving role's driver of COMMITs in slices (server/role/commit_slices.py), against a scripted
host: one slice per turn of the loop, sized to what the last slices took, never more
than AHEAD slices journaled and not confirmed; the connection told when its COMMIT ends.
The real role is exercised by tests/integration/test_sliced_commit.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pairmq.core.commit_ledger import CommitPhase, CommitRun, CommitStep
from pairmq.server.role.commit_slices import AHEAD, SLICE_S, CommitDriver, DriverState
from pairmq.server.role.confirmations import Ticket


class Host:
    """A COMMIT of `sends` routed at `per_send_s` each; records confirmed on demand."""

    def __init__(self, sends: int, per_send_s: float) -> None:
        self.left = sends
        self.per_send_s = per_send_s
        self.seq = 0
        self.confirmed_seq = 0
        self.sizes: list[int] = []
        self.waiters: list[tuple[Ticket, Callable[[], None]]] = []
        self.finished: list[tuple[CommitRun, Ticket | None]] = []

    def commits_to_drive(self) -> bool:
        return self.left > 0

    def step_commit_slice(self, stage: int, route: int) -> tuple[CommitStep, Ticket | None]:
        n = min(route, self.left)
        self.sizes.append(route)
        time.sleep(n * self.per_send_s)
        self.left -= n
        self.seq += 1
        run = CommitRun(1, [], conn_id=7, phase=CommitPhase.DONE)
        return CommitStep([run] if not self.left else [], 0, n), Ticket(self.seq)

    def confirmed(self, ticket: Ticket) -> bool:
        return ticket.seq is not None and ticket.seq <= self.confirmed_seq

    def when_confirmed(self, ticket: Ticket, callback: Callable[[], None]) -> None:
        self.waiters.append((ticket, callback))

    def confirm_all(self) -> None:
        self.confirmed_seq = self.seq
        waiters, self.waiters = self.waiters, []
        for _, callback in waiters:
            callback()

    def commit_finished(self, run: CommitRun, ticket: Ticket | None) -> None:
        self.finished.append((run, ticket))


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_slices_wait_for_confirmation_and_fit_the_turn() -> None:
    async def main() -> None:
        host = Host(sends=3000, per_send_s=60e-6)
        driver = CommitDriver(host)
        driver.wake()
        await turns(10)
        assert len(host.sizes) == AHEAD and driver.state is DriverState.WAITING, \
            "no further ahead of the confirmations than AHEAD slices"
        while host.left:
            host.confirm_all()
            await turns(3)
        host.confirm_all()
        await turns(3)
        assert driver.state is DriverState.IDLE
        assert host.sizes[0] == int(SLICE_S / 30e-6), "first sized by the assumed cost"
        assert host.sizes[-1] < 0.8 * host.sizes[0], \
            f"then by what slices took (twice the cost: smaller): {host.sizes}"
        ((run, ticket),) = host.finished
        assert run.conn_id == 7 and ticket is not None and ticket.seq == host.seq

    asyncio.run(main())


def test_one_slice_per_turn_of_the_loop() -> None:
    async def main() -> None:
        host = Host(sends=10_000, per_send_s=0)
        driver = CommitDriver(host)
        driver.wake()
        driver.wake()  # scheduled once
        host.confirmed_seq = 10**9  # everything confirmed at once
        await turns(1)
        assert len(host.sizes) == 1
        await turns(1)
        assert len(host.sizes) == 2

    asyncio.run(main())
