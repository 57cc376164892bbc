"""One budget for every connection's frames in a turn of the event loop
(server/guards/turn_budget.py), on a real loop: what one callback spent is spent for the next
in the same turn, and the next turn starts afresh."""

from __future__ import annotations

import asyncio

from pairmq.server.guards.turn_budget import TurnBudget


def test_callbacks_of_one_turn_share_the_budget_and_the_next_turn_has_it_all() -> None:
    seen: list[tuple[str, bool]] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        turn = TurnBudget(0.01)

        def connection(name: str, started: float, now: float) -> None:
            seen.append((name, now > turn.start(started)))  # past the turn's deadline

        # Two reads handled in the same turn: the first spent 15 ms of a 10 ms budget.
        loop.call_soon(connection, "first", 100.0, 100.015)
        loop.call_soon(connection, "second", 100.016, 100.017)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        connection("next turn", 200.0, 200.001)

    asyncio.run(go())
    assert seen == [("first", True), ("second", True), ("next turn", False)]


def test_nothing_is_spent_before_a_turn_starts() -> None:
    async def go() -> float:
        return TurnBudget(0.01).start(1e9)  # the turn's first frames: the whole budget

    assert asyncio.run(go()) == 1e9 + 0.01
