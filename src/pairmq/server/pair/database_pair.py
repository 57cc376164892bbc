"""The journal in the database as the pair sees it: the lease as a shared-store pair's lock
(`DatabaseLock`), and a pair policy whose receipts also wait for the database's COMMIT
under a lease this server can prove it holds (`DatabaseBacked`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pairmq.ha.states import State
from pairmq.server.pair.database import DatabaseJournal
from pairmq.server.pair.policy import NoPair, PairPolicy
from pairmq.server.pair.store_locks import Acquired, Refused
from pairmq.store.database import lease
from pairmq.store.database.copy import describe
from pairmq.store.sharedlock import Proof, fresh_proof


class DatabaseLock:
    """The database lease as a shared-store pair's lock (server/pair/store_locks.py)."""

    def __init__(self, database: DatabaseJournal) -> None:
        self.database = database

    async def try_acquire(self) -> Acquired | Refused:
        started = time.monotonic()
        try:
            outcome = await self.database.try_acquire()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return Refused(f"nobody known (the database cannot be used: {describe(e)})")
        if isinstance(outcome, lease.Busy):  # tried again as it expires (a backup's wait)
            return Refused(outcome.holder, time.monotonic() + outcome.remaining_ms / 1000)
        # granted only once the previous holder's lease expired on the database's clock,
        # which its renewals set after their proofs started: no proof of it runs now
        return Acquired(fresh_proof(started, self.database.ttl_ms / 1000), time.monotonic())

    async def verify(self) -> Proof:
        return await self.database.renew()

    async def release(self) -> None:
        await self.database.release()

    def status(self) -> dict[str, Any]:
        return self.database.status()


class DatabaseBacked:
    """A pair policy whose confirmations also wait for the database (PairPolicy)."""

    def __init__(self, inner: PairPolicy, database: DatabaseJournal) -> None:
        self.inner = inner
        self.database = database

    @property
    def state(self) -> State:
        return self.inner.state

    def active_address(self, tls: bool = False) -> str | None:
        return self.inner.active_address(tls)

    def handing_over_to(self, tls: bool = False) -> str | None:
        return self.inner.handing_over_to(tls)

    def topology(self, own: str, tls: bool = False) -> str | None:
        return self.inner.topology(own, tls)

    def confirmable(self, local: int, current: int) -> int:
        database = self.database
        if not database.may_confirm():
            return current
        return max(current, min(self.inner.confirmable(local, current),
                                database.committed_seq))

    def on_append(self, seq: int, record: bytes) -> None:
        self.database.append(seq, record)
        self.inner.on_append(seq, record)

    def mirror_synced(self, seq: int) -> None:
        self.inner.mirror_synced(seq)

    def journal_stalled(self, waited: float | None) -> None:
        self.inner.journal_stalled(waited)

    async def start(self) -> None:
        if isinstance(self.inner, NoPair):  # a pair's driver takes the lease itself
            self.database.start()
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    def status(self) -> dict[str, Any] | None:
        return self.inner.status()

    def force(self) -> str | None:
        return self.inner.force()

