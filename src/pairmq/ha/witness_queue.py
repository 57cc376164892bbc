"""The witness requests of one server process: one out at a time, in order.

A renewal never revives a lease given back (it is dropped when a hand-over or a
step-down begins, and built only when it goes out); each request carries an order
number (the process's boot, then a counter), so the witness ignores a late, older one
(simulator seed 609).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pairmq.ha.events import AskWitness
from pairmq.ha.messages import WitnessPurpose

RENEW = WitnessPurpose.RENEW


class WitnessQueue:
    """The witness requests of one server process: at most one out, the others waiting
    in order. A renewal is built when it goes out (its standby is the one of that
    instant), and only while it cannot revive a lease given back."""

    def __init__(self, identity: str, boot: int) -> None:
        self._identity = identity
        self._boot = boot  # grows with every start: orders requests across restarts
        self._waiting: deque[tuple[WitnessPurpose, dict[str, Any]]] = deque()
        self._sent = 0
        self.asking: WitnessPurpose | None = None  # the request out

    def ask(self, purpose: WitnessPurpose, fields: dict[str, Any]) -> None:
        if purpose is RENEW and any(p is RENEW for p, _ in self._waiting):
            return  # one renewal waiting is enough
        self._waiting.append((purpose, fields))

    def drop_renewals(self) -> None:
        """A hand-over or a step-down began: no renewal may go out after it."""
        self._waiting = deque(q for q in self._waiting if q[0] is not RENEW)

    def clear(self) -> None:
        self._waiting.clear()

    def answered(self, purpose: WitnessPurpose) -> bool:
        """The reply is to the request out (else it is late, for a request given up)."""
        if purpose is not self.asking:
            return False
        self.asking = None
        return True

    def next(self, renewal: dict[str, Any] | None, epoch: int, ms: int) -> AskWitness | None:
        """The next request to send, if none is out. `renewal`: a renewal's fields now
        (None: renewals are dropped, this server must not renew)."""
        while self.asking is None and self._waiting:
            purpose, fields = self._waiting.popleft()
            if purpose is RENEW:
                if renewal is None:
                    continue
                fields = renewal
            self.asking = purpose
            self._sent += 1
            return AskWitness(purpose, {"name": self._identity,
                                        "order": [self._boot, self._sent],
                                        "epoch": epoch, "ms": ms, **fields})
        return None
