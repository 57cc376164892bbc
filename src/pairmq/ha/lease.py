"""Lease rules, deterministic: time is an argument (seconds on the caller's monotonic clock).

The witness grants one server at a time the right to confirm writes, for `ms`
from the moment it grants. A server counts its lease from the moment it *sent*
the request (earlier than the grant), shortened by a drift margin, so its own
view always ends before the witness's. The witness grants a different server
only once the current lease has run out on its own clock. So the old holder has
stopped confirming before a new one may start. See docs/ha.md for the argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    """The witness's side: who holds the lease, until when, the epoch, the in-sync backup.

    `standby` is the backup the holder last declared in sync: only it may take over
    from a holder. A holder whose backup fell behind must say so (renew with no
    standby) before confirming on its own, so a stale backup can never activate.
    """

    holder: str | None = None
    epoch: int = 0
    expires: float = 0.0
    standby: str | None = None
    last_ms: int = 0  # the longest lease granted, to sit out after a witness restart
    orders: dict[str, list[int]] = field(default_factory=dict)  # newest request by server

    def held_by_other(self, name: str, now: float) -> bool:
        return self.holder not in (None, name) and now < self.expires

    def remaining_ms(self, now: float) -> int:
        return max(0, int((self.expires - now) * 1000)) if self.holder else 0

    def renew(self, name: str, epoch: int, ms: int, now: float, standby: str | None) -> Grant:
        if epoch < self.epoch:
            return self._refuse(now, f"epoch {epoch} is older than the pair's epoch {self.epoch}")
        if self.holder != name:
            return self._refuse(now, f"{name} does not hold the lease")
        self.epoch = epoch
        self.standby = standby
        return self._grant(name, ms, now)

    def activate(self, name: str, epoch: int, ms: int, now: float, force: bool = False) -> Grant:
        """`force`: an operator vouches for this server's journal (it need not be the standby)."""
        if epoch <= self.epoch:
            return self._refuse(now, f"taking over needs an epoch above {self.epoch}")
        if self.held_by_other(name, now):
            return self._refuse(now, f"{self.holder} holds the lease for "
                                     f"{self.remaining_ms(now)} ms more")
        if self.holder not in (None, name) and self.standby != name and not force:
            return self._refuse(now, f"{name} was not {self.holder}'s in-sync backup: its "
                                     "journal may miss confirmed messages")
        self.epoch = epoch
        self.standby = None
        return self._grant(name, ms, now)

    def adopt(self, name: str, epoch: int, ms: int, now: float, standby: str | None) -> Grant:
        """A server that serves without this witness knowing it (the pair elected it while
        the witness was unreachable, or the witness lost its memory) asks to hold the lease.
        Granted only if no other server's lease may still run, the epoch is above every one
        granted, and the server last granted, if any, is the asker's in-sync backup (it
        follows the asker's journal: it cannot be serving)."""
        if self.held_by_other(name, now):
            return self._refuse(now, f"{self.holder} holds the lease for "
                                     f"{self.remaining_ms(now)} ms more")
        if self.holder not in (None, name, standby):
            return self._refuse(now, f"{self.holder} was last granted and is not {name}'s "
                                     "in-sync backup")
        if epoch <= self.epoch and self.holder != name:
            return self._refuse(now, f"adopting needs an epoch above {self.epoch}")
        self.epoch = max(self.epoch, epoch)
        self.standby = standby
        return self._grant(name, ms, now)

    def release(self, name: str, now: float, keep_standby: bool) -> Grant:
        """The holder's lease ends now. A hand-over keeps the standby (it takes over next);
        a clean stop without failover withdraws it, so the backup waits for the holder."""
        if self.holder == name:
            self.expires = now
            if not keep_standby:
                self.standby = None
        return Grant(True, self.holder, self.epoch, 0)

    def _grant(self, name: str, ms: int, now: float) -> Grant:
        self.holder = name
        self.expires = now + ms / 1000
        self.last_ms = max(self.last_ms, ms)
        return Grant(True, name, self.epoch, ms)

    def _refuse(self, now: float, reason: str) -> Grant:
        return Grant(False, self.holder, self.epoch, self.remaining_ms(now), reason)


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


def answer(leases: WitnessLeases, request: dict[str, Any], now: float) -> dict[str, Any]:
    """The witness's reply to one request (ops: query, activate, renew, adopt, release), as
    it goes on the wire; the witness process (server/pair/witness_server.py) and the simulator
    (ha/sim/) both answer with it."""
    op = request.get("op")
    name = str(request.get("name"))
    order = request.get("order")
    if isinstance(order, list) and op != "query":
        # A request that arrives after a newer one of the same server (sent on a
        # connection given up on, delivered late) must not undo it: a stale renewal would
        # name a standby the server has since declared out of sync (simulator seed 609).
        last = leases.orders.get(name)
        if last is not None and order <= last:
            return {"granted": False, "holder": leases.holder, "epoch": leases.epoch,
                    "remaining_ms": leases.remaining_ms(now),
                    "reason": f"stale request {order} (after {last})",
                    "standby": leases.standby}
        leases.orders[name] = order
    epoch = int(request.get("epoch", 0))
    ms = int(request.get("ms", 0))
    if op == "renew":
        grant = leases.renew(name, epoch, ms, now, request.get("standby"))
    elif op == "activate":
        grant = leases.activate(name, epoch, ms, now, bool(request.get("force")))
    elif op == "adopt":
        grant = leases.adopt(name, epoch, ms, now, request.get("standby"))
    elif op == "release":
        grant = leases.release(name, now, bool(request.get("keep_standby")))
    elif op == "query":
        grant = Grant(False, leases.holder, leases.epoch, leases.remaining_ms(now))
    else:
        grant = Grant(False, leases.holder, leases.epoch, 0, f"unknown op {op!r}")
    return {"granted": grant.granted, "holder": grant.holder, "epoch": grant.epoch,
            "remaining_ms": grant.remaining_ms, "reason": grant.reason,
            "standby": leases.standby}
