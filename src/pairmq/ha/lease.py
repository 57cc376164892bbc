"""Lease rules, deterministic: time is an argument (seconds on the caller's monotonic clock).

The witness grants one server at a time the right to confirm writes, for `ms`
from the moment it grants. A server counts its lease from the moment it *sent*
the request (earlier than the grant), shortened by a drift margin, so its own
view always ends before the witness's. The witness grants a different server
only once the current lease has run out on its own clock. So the old holder has
stopped confirming before a new one may start. See docs/ha.md for the argument.
"""

from __future__ import annotations

from dataclasses import dataclass

DRIFT = 0.05  # clocks may run up to 5% apart over one lease


@dataclass
class Grant:
    granted: bool
    holder: str | None
    epoch: int
    remaining_ms: int  # how long the current holder's lease still runs, witness's view
    reason: str = ""


@dataclass
class WitnessLeases:
    """The witness's side: who holds the lease, until when, and the highest epoch seen."""

    holder: str | None = None
    epoch: int = 0
    expires: float = 0.0

    def request(self, name: str, epoch: int, ms: int, now: float, activate: bool) -> Grant:
        """`activate`: the caller wants to become active with `epoch` (a new, higher one)."""
        held = self.holder is not None and now < self.expires
        remaining = max(0, int((self.expires - now) * 1000)) if held else 0
        if epoch < self.epoch:
            return Grant(False, self.holder, self.epoch, remaining,
                         f"epoch {epoch} is older than the pair's epoch {self.epoch}")
        if held and self.holder != name:
            return Grant(False, self.holder, self.epoch, remaining,
                         f"{self.holder} holds the lease for {remaining} ms more")
        if activate:
            if self.holder not in (None, name) and epoch <= self.epoch:
                return Grant(False, self.holder, self.epoch, remaining,
                             f"taking over needs an epoch above {self.epoch}")
        elif self.holder != name:
            return Grant(False, self.holder, self.epoch, remaining,
                         f"{name} does not hold the lease")
        self.holder = name
        self.epoch = max(self.epoch, epoch)
        self.expires = now + ms / 1000
        return Grant(True, name, self.epoch, ms)


@dataclass
class LeaseView:
    """A server's side: until when it may confirm writes on the strength of a lease."""

    valid_until: float = 0.0

    def granted(self, requested_at: float, ms: int) -> None:
        self.valid_until = max(self.valid_until, requested_at + ms / 1000 * (1 - DRIFT))

    def valid(self, now: float) -> bool:
        return now < self.valid_until

    def revoke(self) -> None:
        self.valid_until = 0.0
