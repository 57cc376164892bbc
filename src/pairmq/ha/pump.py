"""The loop that feeds a pair machine and carries out what it asks, written once.

Both policies' drivers (server/pair/replication.py, server/pair/shared_store.py) and the
simulator's server (ha/sim/server.py) hand their machine one input at a time and carry out
the effects it returns, in order. Carrying out an effect may produce an input of its own
(a peer lost while a message is sent, a timer that fires at once in the simulator): that input waits
until every effect of the current one is carried out, so a machine never sees an input
in the middle of another's effects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

Input = TypeVar("Input")
Effect = TypeVar("Effect")


class EffectPump(Generic[Input, Effect]):
    def __init__(self, step: Callable[[Input], list[Effect]],
                 carry_out: Callable[[Effect], None],
                 after: Callable[[], None] | None = None) -> None:
        self._step = step  # the machine's reaction to one input (time is the caller's)
        self._carry_out = carry_out
        self._after = after  # once the inputs are all taken: timers, confirmations...
        self._pending: deque[Input] = deque()
        self._applying = False

    def feed(self, event: Input) -> None:
        """Hand one input to the machine, now or after the effects being carried out."""
        self._pending.append(event)
        if not self._applying:
            self.apply([])

    def apply(self, effects: list[Effect]) -> None:
        """Carry out effects the machine returned outside `feed` (a tick, a check), then
        every input that arrived meanwhile."""
        if self._applying:
            raise RuntimeError("effects applied re-entrantly")
        self._applying = True
        try:
            while True:
                for effect in effects:
                    self._carry_out(effect)
                if not self._pending:
                    break
                effects = self._step(self._pending.popleft())
        finally:
            self._applying = False
        if self._after is not None:
            self._after()
