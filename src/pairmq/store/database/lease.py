"""The fenced lease in the database: which server writes the pair's journal, decided by the
database alone.

The lease row holds the holder, an epoch and an expiry in ms of the database's clock
(`clock_timestamp()`, a BIGINT). Nothing here reads a server's wall clock, so a server whose
clock is an hour off (or jumps at a daylight-saving change) takes over neither too early
nor too late.

Why no row is ever written by two servers' epochs at once:

1. Taking the lease is one UPDATE that succeeds only when the row's expiry has passed on the
   database's clock (or the row is already this holder's), and it raises the epoch. Row
   locks serialise it with every other statement on the row.
2. Every write transaction of the journal (store/database/copy.py) first reads the lease
   row `FOR SHARE` and goes on only if it still holds this server's holder and epoch (a
   small group is one INSERT whose rows are joined with that read: no lease row, no row
   written). A successor's taking UPDATE waits for that share lock, so it comes either before the
   transaction's read (which then sees the new epoch and rolls back) or after its COMMIT
   (and the successor reads the journal only after taking the lease, so it sees the rows).
   A server paused or cut off past its lease therefore writes no row once it is taken:
   no clock, no timing assumption, only the database's own locking.
3. Confirmations need, besides the COMMIT, a local proof (store/sharedlock.py's `Proof`): a
   renewal that *started* at s on this server's monotonic clock and succeeded holds the
   lease until s + ttl(1 - drift). A server resumed from SIGSTOP has an expired proof and
   confirms nothing until a renewal succeeds, which it cannot once the lease was taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pairmq.store.database.schema import DB_NOW_MS


@dataclass(frozen=True)
class Granted:
    epoch: int


@dataclass(frozen=True)
class Busy:
    holder: str
    remaining_ms: int  # until the holder's lease expires, on the database's clock


class LeaseStatements:
    """The lease's SQL for one schema; run by whoever holds a connection (asyncpg)."""

    def __init__(self, schema: str) -> None:
        table = f"{schema}.lease"
        self.acquire = (f"UPDATE {table} SET holder = $1, epoch = epoch + 1, "
                        f"expires_ms = {DB_NOW_MS} + $2 WHERE id = 1 AND "
                        f"(expires_ms <= {DB_NOW_MS} OR holder = $1) RETURNING epoch")
        self.busy = f"SELECT holder, expires_ms - {DB_NOW_MS} FROM {table} WHERE id = 1"
        self.renew = (f"UPDATE {table} SET expires_ms = {DB_NOW_MS} + $3 "
                      "WHERE id = 1 AND holder = $1 AND epoch = $2 RETURNING epoch")
        self.release = ("UPDATE " + table + " SET expires_ms = 0 "
                        "WHERE id = 1 AND holder = $1 AND epoch = $2")
        # the first statement of every journal write transaction (point 2 above)
        self.fence = (f"SELECT epoch FROM {table} WHERE id = 1 AND holder = $1 AND epoch = $2 "
                      "FOR SHARE")
        # ... or the first part of a single INSERT statement, its holder and epoch $3, $4:
        # no row (another holder) joins no row, and the INSERT writes none
        self.fence_in_statement = (f"SELECT epoch FROM {table} WHERE id = 1 AND holder = $3 "
                                   "AND epoch = $4 FOR SHARE")


async def try_acquire(conn: Any, sql: LeaseStatements, holder: str, ttl_ms: int
                      ) -> Granted | Busy:
    epoch = await conn.fetchval(sql.acquire, holder, ttl_ms)
    if epoch is not None:
        return Granted(int(epoch))
    row = await conn.fetchrow(sql.busy)
    return Busy(str(row[0]), max(0, int(row[1])))


async def renew(conn: Any, sql: LeaseStatements, holder: str, epoch: int, ttl_ms: int) -> bool:
    """False: the lease is another server's now (nothing more may be written)."""
    return await conn.fetchval(sql.renew, holder, epoch, ttl_ms) is not None


async def release(conn: Any, sql: LeaseStatements, holder: str, epoch: int) -> None:
    await conn.execute(sql.release, holder, epoch)
