"""The journal's copy in the database: every record the local journal appends goes into the
`journal` table in group commits, each one transaction fenced by the lease.

One transaction is in flight at a time; the records appended meanwhile form the next group
(the file journal's group commit, with COMMIT for fdatasync). A record counts as copied
(`committed_seq`) only once its COMMIT returned. When the database goes away (restarted,
unreachable, refusing a group: a full disk, the connection limit) the records wait here, in
order, and the copy reconnects by itself; the rows a lost connection may have committed are
found by the highest `seq` the table holds, so none is written twice. A fenced transaction
(the lease is another server's) ends the copy for good: FENCED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from pairmq.store.database.lease import LeaseStatements

log = logging.getLogger("pairmq.store")

GROUP_BYTES = 4 << 20  # at most this much in one transaction
ONE_STATEMENT_BYTES = 256 << 10  # smaller groups go in one INSERT, larger ones by COPY
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 0.5


class CopyState(StrEnum):
    CONNECTING = "connecting"  # the first connection is being made
    COPYING = "copying"  # connected: groups go in as they come
    DOWN = "down"  # the database cannot be reached or refused a group: retrying
    FENCED = "fenced"  # another server holds the lease: nothing more is written
    CLOSED = "closed"


class Fenced(Exception):
    """The lease row no longer names this server and epoch."""


class JournalCopy:
    """Copies appended records into the database (driven by its own task on the loop)."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], schema: str, holder: str,
                 epoch: int, committed_seq: int, on_committed: Callable[[int], None],
                 on_fenced: Callable[[], None]) -> None:
        self._connect = connect
        self._table = f"{schema}.journal"
        self._schema = schema
        self._sql = LeaseStatements(schema)
        self._insert = (f"WITH fence AS ({self._sql.fence_in_statement}) "
                        f"INSERT INTO {schema}.journal (seq, data) SELECT r.seq, r.data "
                        "FROM unnest($1::bigint[], $2::bytea[]) AS r(seq, data), fence")
        self.holder = holder
        self.epoch = epoch
        self.committed_seq = committed_seq
        self._on_committed = on_committed
        self._on_fenced = on_fenced
        self._pending: deque[tuple[int, bytes]] = deque()
        self.pending_bytes = 0
        self.state = CopyState.CONNECTING
        self.problem = ""  # why the copy is DOWN (or FENCED), as said in the log
        self.down_since: float | None = None  # monotonic
        self.groups = 0
        self._wake = asyncio.Event()
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ the loop's side

    def append(self, seq: int, record: bytes) -> None:
        self._pending.append((seq, record))
        self.pending_bytes += len(record)
        self._wake.set()

    @property
    def waiting(self) -> int:
        """Records appended and not yet committed."""
        return len(self._pending)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="database copy")

    async def drained(self, timeout: float) -> bool:
        """Wait until every appended record is committed (False: not within `timeout`)."""
        deadline = time.monotonic() + timeout
        while self._pending and self.state not in (CopyState.FENCED, CopyState.CLOSED):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return not self._pending

    async def close(self) -> None:
        self.state = CopyState.CLOSED
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._drop_connection()

    # ------------------------------------------------------------ the copying task

    async def _run(self) -> None:
        retry = RETRY_FIRST_S
        while self.state not in (CopyState.FENCED, CopyState.CLOSED):
            try:
                if self._conn is None:
                    await self._reconnect()
                if not self._pending:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._copy_group()
                retry = RETRY_FIRST_S
            except Fenced:
                self._fenced()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # asyncpg's, OSError, a closed connection
                self._down(e)
                await self._drop_connection()
                await asyncio.sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)

    async def _reconnect(self) -> None:
        conn = await self._connect()
        # What a lost connection committed is in the table: never write it twice. Read
        # under the fence: rows past ours would be a successor's, not what we committed.
        ours, highest = await conn.fetchrow(
            f"SELECT ({self._sql.fence}), (SELECT max(seq) FROM {self._table})",
            self.holder, self.epoch)
        if ours is None:
            conn.terminate()
            raise Fenced
        highest = highest or 0
        self._conn = conn
        while self._pending and self._pending[0][0] <= highest:
            _, record = self._pending.popleft()
            self.pending_bytes -= len(record)
        if highest > self.committed_seq:
            self._committed(highest)
        if self.state is CopyState.CONNECTING or not self._pending:
            self._up()  # else DOWN until a group goes in (the database may refuse it again)

    def _up(self) -> None:
        if self.state is CopyState.DOWN:
            assert self.down_since is not None
            log.info("The database takes the journal again after %.1f s: %d records "
                     "waiting are copied now", time.monotonic() - self.down_since,
                     len(self._pending))
        self.state, self.problem, self.down_since = CopyState.COPYING, "", None

    async def _copy_group(self) -> None:
        group: list[tuple[int, bytes]] = []
        size = 0
        for item in self._pending:
            group.append(item)
            size += len(item[1])
            if size >= GROUP_BYTES:
                break
        conn = self._conn
        if size < ONE_STATEMENT_BYTES:
            # the fence and the rows in one statement (its own transaction): one round trip
            # instead of five, a third of the CPU per group (benchmarks/pg_drivers.py)
            status = await conn.execute(self._insert, [seq for seq, _ in group],
                                        [record for _, record in group], self.holder,
                                        self.epoch)
            if status != f"INSERT 0 {len(group)}":
                raise Fenced
        else:  # large groups: COPY (a big array would be encoded in one go on the loop)
            async with conn.transaction():
                if await conn.fetchval(self._sql.fence, self.holder, self.epoch) is None:
                    raise Fenced
                await conn.copy_records_to_table("journal", schema_name=self._schema,
                                                 records=group, columns=("seq", "data"))
        for _ in group:
            self._pending.popleft()
        self.pending_bytes -= size
        self.groups += 1
        if self.state is not CopyState.COPYING:
            self._up()
        self._committed(group[-1][0])

    def _committed(self, seq: int) -> None:
        self.committed_seq = seq
        self._on_committed(seq)

    def _down(self, error: Exception) -> None:
        problem = describe(error)
        if self.state is not CopyState.DOWN or problem != self.problem:
            log.warning("The database does not take the journal (%s): nothing more is "
                        "confirmed until it does; %d records wait, retrying", problem,
                        len(self._pending))
        if self.state is not CopyState.DOWN:
            self.down_since = time.monotonic()
        self.state, self.problem = CopyState.DOWN, problem

    def _fenced(self) -> None:
        self.state = CopyState.FENCED
        self.problem = "another server took the database lease"
        log.error("The journal's write was refused by the database: another server holds "
                  "the lease now (epoch above %d); this server writes and confirms nothing "
                  "more", self.epoch)
        self._on_fenced()

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()


def describe(error: BaseException) -> str:
    """The database's own words (its SQLSTATE too), or the connection's error."""
    state = getattr(error, "sqlstate", None)
    text = str(error).strip() or type(error).__name__
    return f"{text} (SQLSTATE {state})" if state else text
