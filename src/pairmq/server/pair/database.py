"""[store] url: the journal kept in PostgreSQL, as the server drives it.

`DatabaseJournal` is the thin driver around store/database/: it connects, takes and renews
the fenced lease (a server alone waits for it at start; a shared-store pair's driver takes
it through server/pair/database_pair.py's `DatabaseLock`), restores the local copy of the
journal from the database, and while this server serves, copies every appended record
(store/database/copy.py), deletes the rows the journal no longer needs and applies
full_policy when the database stays away. store/database/lease.py has the safety argument.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from pairmq.server.config import ServerConfig
from pairmq.store.database import lease
from pairmq.store.database.copy import JournalCopy, describe
from pairmq.store.database.restore import Behind, LocalCopy, Restored, restore
from pairmq.store.database.resume import write_committed
from pairmq.store.database.schema import (
    SCHEMA_VERSION,
    create_statements,
    redacted,
    schema_name,
    version_problem,
)
from pairmq.store.sharedlock import JOURNAL_NAME, NO_PROOF, Proof, fresh_proof
from pairmq.store.store import Store

log = logging.getLogger("pairmq.store")

PASSWORD_ENV = "PAIRMQ_STORE_PASSWORD"
CONNECT_TIMEOUT_S = 5.0
HORIZON_EVERY_S = 1.0
DELETE_BATCH = 5000  # rows deleted per statement: short transactions, never the loop held
THROTTLE_BYTES, RESUME_BYTES = 64 << 20, 16 << 20  # records waiting for the database
OUTAGE_CHECK_S = 0.25
REFILL_BYTES = 256 << 20  # a backup's local copy past this and twice its fill: made anew
NOTE_COMMITTED_S = 0.2  # how often the last committed seq is written down while serving


class LeaseState(StrEnum):
    NOT_TAKEN = "not taken"
    WAITING = "waiting"  # another server holds it (`held_by`)
    HELD = "held"
    LOST = "lost"  # another server took it: nothing more is written or confirmed
    RELEASED = "released"


class StartupRefused(Exception):
    """The database cannot be used by this server, and waiting will not change it."""


class DatabaseHost(Protocol):
    @property
    def store(self) -> Store: ...

    def update_confirmed(self) -> None: ...

    def throttle(self, paused: bool) -> None: ...



def password_of(config: ServerConfig) -> str | None:
    """[store] password_file, else PAIRMQ_STORE_PASSWORD, else None (the URL's, if any)."""
    if config.password_file:
        return Path(config.password_file).read_text().strip()
    return os.environ.get(PASSWORD_ENV) or None


class DatabaseJournal:
    """The database holding this server's journal: its lease, the restore of the local copy,
    and, while this server serves, the copy of what it appends. A server alone drives the
    lease itself (`take`, then `start`); a shared-store pair's driver drives it through
    `DatabaseLock`, and the server restores and copies at each takeover."""

    def __init__(self, config: ServerConfig, host: DatabaseHost,
                 on_lost: Callable[[str], None]) -> None:
        self.url = config.url
        self.where = redacted(config.url)
        self.password = password_of(config)
        self.schema = schema_name(config.group or config.name)
        self.ttl_ms = config.lease_timeout_ms
        self.segment_bytes = config.segment_bytes
        self.journal_dir = Path(config.data_dir) / JOURNAL_NAME  # the local copy
        self.host = host
        self.on_lost = on_lost
        self.holder = f"{config.name} (pid {os.getpid()} on {socket.gethostname()}, " \
                      f"{secrets.token_hex(4)})"
        self.sql = lease.LeaseStatements(self.schema)
        self.epoch = 0
        self.proof: Proof = NO_PROOF
        self.restored: Restored | None = None  # the local copy the server serves from
        self.local: LocalCopy | None = None  # a shared-store backup's, pulled forward
        self._tail_conn: Any = None
        self.copy: JournalCopy | None = None
        self.deleted_below = 0  # rows below this seq are deleted
        self._horizon = (0, 0)  # (a local horizon seen, the appended seq when it was seen)
        self._prepared = False
        self._lease_conn: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._throttled = False
        self._refusing = False  # new persistent messages refused: the database is away
        self._note_committed_at = 0.0
        self._noting: asyncio.Future[None] | None = None  # writing it down, in a thread
        self.lease_state = LeaseState.NOT_TAKEN
        self.held_by = ""  # WAITING: who holds it, as the database said

    async def _connect(self, **limits: int) -> Any:
        """A connection; `limits` are PostgreSQL's own time limits for its session (ms)."""
        import asyncpg  # only servers with [store] url load the driver
        settings = {"application_name": "pairmq", **{k: str(v) for k, v in limits.items()}}
        return await asyncpg.connect(self.url, password=self.password,
                                     timeout=CONNECT_TIMEOUT_S, command_timeout=None,
                                     server_settings=settings)

    async def _copy_connection(self) -> Any:
        """The copy's: a transaction of a server that stopped mid-way (paused, cut off)
        holds the lease row's share lock, which the next holder's UPDATE waits for. The
        database ends such a session by itself, so a takeover waits at most this long
        after the lease expired (a group's round trips take milliseconds)."""
        ttl = self.ttl_ms
        return await self._connect(idle_in_transaction_session_timeout=max(100, ttl // 4),
                                   statement_timeout=ttl)

    async def _lease_connection(self) -> Any:
        if self._lease_conn is None:
            # an attempt that waits on the row (a holder's group in flight) gives up in time
            # to be tried again, rather than hold the driver's queue of role changes; and a
            # server paused between a renewal's statement and its end holds no row for long
            ttl = self.ttl_ms
            self._lease_conn = await self._connect(
                lock_timeout=max(100, ttl // 2), statement_timeout=ttl,
                idle_in_transaction_session_timeout=max(100, ttl // 4))
        if not self._prepared:
            await self._prepare_schema(self._lease_conn)
            self._prepared = True
        return self._lease_conn

    async def _prepare_schema(self, conn: Any) -> None:
        async with conn.transaction():
            # one server at a time makes the schema (two at once would race on CREATE)
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.schema)
            for statement in create_statements(self.schema):
                await conn.execute(statement)
            found = [r[0] for r in await conn.fetch(
                f"SELECT version FROM {self.schema}.pairmq_schema")]
            problem = version_problem(found, self.schema)
            if problem:
                raise StartupRefused(f"database {self.where}: {problem}")
            if not found:
                await conn.execute(f"INSERT INTO {self.schema}.pairmq_schema VALUES ($1)",
                                   SCHEMA_VERSION)

    # ------------------------------------------------------------ the lease

    async def try_acquire(self) -> lease.Granted | lease.Busy:
        """One attempt (raises what the database raised: the caller retries)."""
        started = time.monotonic()
        try:
            conn = await self._lease_connection()
            outcome = await lease.try_acquire(conn, self.sql, self.holder, self.ttl_ms)
        except Exception:
            await self._drop_lease_connection()
            raise
        if isinstance(outcome, lease.Granted):
            self.epoch = outcome.epoch
            self.proof = fresh_proof(started, self.ttl_ms / 1000)
            self.lease_state = LeaseState.HELD
            log.info("Database lease taken (schema %s, epoch %d, %d ms on the database's "
                     "clock)", self.schema, self.epoch, self.ttl_ms)
        else:
            self.lease_state, self.held_by = LeaseState.WAITING, outcome.holder
        return outcome

    async def renew(self) -> Proof:
        """Renew the lease; the proof it gives (NO_PROOF with a reason when it failed)."""
        started = time.monotonic()
        try:
            conn = await self._lease_connection()
            held = await lease.renew(conn, self.sql, self.holder, self.epoch, self.ttl_ms)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the database went away: the proof lapses by itself
            await self._drop_lease_connection()
            return Proof(0.0, f"the database lease could not be renewed: {describe(e)}")
        if not held:
            self.proof = NO_PROOF
            self.lease_state = LeaseState.LOST
            return Proof(0.0, "another server holds the database lease now")
        self.proof = fresh_proof(started, self.ttl_ms / 1000)
        return self.proof

    async def release(self) -> None:
        """Give the lease up (the other server need not wait for it to expire)."""
        if self.lease_state is not LeaseState.HELD:
            return
        self.proof = NO_PROOF
        self.lease_state = LeaseState.RELEASED
        try:
            conn = await self._lease_connection()
            await lease.release(conn, self.sql, self.holder, self.epoch)
            log.info("Database lease released")
        except Exception as e:  # it expires by itself
            log.warning("Database lease not released (%s): it expires in %.1f s",
                        describe(e), self.ttl_ms / 1000)
            await self._drop_lease_connection()

    def may_confirm(self) -> bool:
        return self.proof.valid(time.monotonic())

    # ------------------------------------------------------------ a server alone

    async def take(self, journal_dir: Path) -> Restored:
        """A server alone, at start: take the lease (waiting while the database cannot be
        reached or another server holds it), then restore the local copy."""
        said = ""
        while True:
            try:
                outcome = await self.try_acquire()
            except StartupRefused:
                raise
            except Exception as e:
                refusal = _refusal(e)
                if refusal:
                    raise StartupRefused(f"database {self.where}: {refusal}") from None
                problem = f"cannot be reached ({describe(e)})"
                if problem != said:
                    log.warning("Database %s %s: retrying", self.where, problem)
                    said = problem
                await asyncio.sleep(1.0)
                continue
            if isinstance(outcome, lease.Granted):
                # renewed from now on: a long restore must not let it lapse (another
                # server waiting would take it, and this one would find out only later)
                self._tasks.append(asyncio.get_running_loop().create_task(
                    self._keep_lease(), name="database lease"))
                break
            if outcome.holder != said:
                log.warning("Database lease held by %s: waiting for it (%.1f s left unless "
                            "renewed)", outcome.holder, outcome.remaining_ms / 1000)
                said = outcome.holder
            await asyncio.sleep(min(max(outcome.remaining_ms / 1000, 0.05), self.ttl_ms / 4000))
        return await self.restore_into(journal_dir)

    def start(self) -> None:
        """A server alone begins serving (its lease renewed since `take`): copy."""
        self.start_copy()

    async def _keep_lease(self) -> None:
        said = ""
        while True:
            await asyncio.sleep(self.ttl_ms / 4000)
            was_valid = self.may_confirm()
            proof = await self.renew()
            if self.lease_state is LeaseState.LOST:
                log.error("Database lease lost: another server holds it now (epoch above "
                          "%d); this server writes and confirms nothing more", self.epoch)
                self._lost("another server took the database lease")
                return
            if proof.reason:
                if proof.reason != said:
                    log.warning("%s: receipts stop when it lapses, %.1f s after the last "
                                "renewal", proof.reason, self.ttl_ms / 1000)
                    said = proof.reason
                continue
            if said:
                log.info("Database lease renewed again")
                said = ""
            if not was_valid:
                self.host.update_confirmed()

    # ------------------------------------------------------------ restore and copy

    async def restore_into(self, journal_dir: Path) -> Restored:
        """The local copy of the journal made anew from the database (lease held)."""
        started = time.monotonic()
        conn = await self._connect()
        try:
            restored = await restore(conn, self.schema, journal_dir, self.segment_bytes)
        finally:
            await conn.close()
        self.local = None
        self._restored(restored)
        kept = f"the local journal kept up to seq {restored.kept} ({restored.compared} of " \
            "its records compared), then " if restored.kept else ""
        log.info("Journal restored from the database %s (schema %s): %s%d records, %.1f MiB, "
                 "up to seq %d, in %.2f s", self.where, self.schema, kept, restored.records,
                 restored.bytes / 1048576, restored.last_seq, time.monotonic() - started)
        return restored

    def _restored(self, restored: Restored) -> None:
        self.restored = restored
        self.deleted_below = restored.first_seq
        self._horizon = (0, 0)

    async def pull(self, journal_dir: Path, limit_bytes: int) -> tuple[int, bool]:
        """A shared-store backup: bring the local copy forward by about `limit_bytes` of
        the rows the active committed. Returns (bytes appended, whether the copy was made
        anew: whatever read the old one must start again)."""
        try:
            return await self._pull(journal_dir, limit_bytes)
        except Exception:
            tail, self._tail_conn = self._tail_conn, None
            if tail is not None:
                tail.terminate()
            raise

    async def _pull(self, journal_dir: Path, limit_bytes: int) -> tuple[int, bool]:
        conn = self._tail_conn
        if conn is None:
            conn = self._tail_conn = await self._connect()
        local = self.local
        if local is None:  # first: what the directory holds kept as far as it is the
            self.local = local = LocalCopy(journal_dir, self.segment_bytes)  # database's
            if await local.resume(conn, self.schema) is None:
                await local.fill(conn, self.schema)
            return local.bytes, True
        if local.bytes > max(REFILL_BYTES, 2 * local.filled_bytes):
            # the copy grew well past what the journal holds (the rows the active deleted
            # are still here): made anew from one snapshot
            self.local = local = LocalCopy(journal_dir, self.segment_bytes)
            await local.fill(conn, self.schema)
            return local.bytes, True
        try:
            return await local.pull(conn, self.schema, limit_bytes), False
        except Behind as e:
            log.info("The local copy of the database's journal is made anew: %s", e)
            self.local = None
            return 0, True

    async def catch_up(self) -> bool:
        """Taking over (lease held): the local copy brought up to date. False: there is no
        usable one (the caller restores in full)."""
        local = self.local
        if local is None:
            return False
        started = time.monotonic()
        try:
            conn = self._tail_conn or await self._connect()
            self._tail_conn = conn
            while await local.pull(conn, self.schema, 64 << 20):
                pass
        except Exception as e:  # Behind, or the tail's connection broke: restore in full
            log.info("The journal read ahead cannot be used (%s): restoring it in full",
                     describe(e))
            self.local = None
            tail, self._tail_conn = self._tail_conn, None
            if tail is not None:
                tail.terminate()
            return False
        await local.seal()
        self._restored(local.restored)
        log.info("Journal read ahead from the database %s (schema %s): %d records up to "
                 "seq %d, the tail read in %.2f s", self.where, self.schema, local.records,
                 local.last_seq, time.monotonic() - started)
        return True

    def forget_local_copy(self) -> None:
        """Serving ended: the local copy holds this server's own writes, some of which the
        database may lack; a backup's copy is made anew from the database."""
        self.local = None

    def start_copy(self) -> None:
        """Serving begins (before the first record is appended): copy every record, and
        delete the rows the journal no longer needs."""
        restored = self.restored
        assert restored is not None and self.copy is None
        self.copy = JournalCopy(self._copy_connection, self.schema, self.holder, self.epoch,
                                restored.last_seq, self._committed, self._fenced)
        self.copy.start()
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self._delete_dead_rows(), name="database horizon"),
                        loop.create_task(self._watch_outage(), name="database outage")]

    async def stop_copy(self, drain_timeout: float) -> None:
        """Serving ends: what was appended reaches the database (within the timeout)."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        copy, self.copy = self.copy, None
        if copy is None:
            return
        if drain_timeout > 0 and not await copy.drained(drain_timeout):
            log.error("%d records did not reach the database within %.0f s of stopping to "
                      "serve (none of them was confirmed)", copy.waiting, drain_timeout)
        await copy.close()
        if self._noting is not None:
            await self._noting
        await asyncio.get_running_loop().run_in_executor(
            None, write_committed, self.journal_dir, copy.committed_seq)
        if self._throttled:
            self._throttle(False)

    def append(self, seq: int, record: bytes) -> None:
        copy = self.copy
        if copy is not None:
            copy.append(seq, record)
            if not self._throttled and copy.pending_bytes > THROTTLE_BYTES:
                self._throttle(True)

    @property
    def committed_seq(self) -> int:
        return self.copy.committed_seq if self.copy is not None else 0

    def _committed(self, seq: int) -> None:
        now = time.monotonic()
        if now >= self._note_committed_at and (self._noting is None or self._noting.done()):
            # a later start keeps the journal up to here; in a thread (a rename waits for
            # the disk: 180 ms on a loaded one), one at a time
            self._note_committed_at = now + NOTE_COMMITTED_S
            self._noting = asyncio.get_running_loop().run_in_executor(
                None, write_committed, self.journal_dir, seq)
        copy = self.copy
        if self._throttled and copy is not None and copy.pending_bytes < RESUME_BYTES:
            self._throttle(False)
        if self._refusing:
            self._check_outage()
        self.host.update_confirmed()

    def _throttle(self, paused: bool) -> None:
        self._throttled = paused
        if paused:
            log.warning("More than %d MiB of records wait for the database: clients are no "
                        "longer read until it catches up", THROTTLE_BYTES >> 20)
        self.host.throttle(paused)

    def _fenced(self) -> None:
        self._lost("another server took the database lease")

    def _lost(self, why: str) -> None:
        self.proof = NO_PROOF
        self.lease_state = LeaseState.LOST
        self.on_lost(why)

    async def _watch_outage(self) -> None:
        """Producers wait while the database is away for up to the lease's length (a
        restart takes a fraction of a second); past it, new persistent messages are
        refused or held per [store] full_policy, as on a full disk, until it is back."""
        try:
            while True:
                await asyncio.sleep(OUTAGE_CHECK_S)
                self._check_outage()
        finally:
            if self._refusing:
                self._refusing = False
                self.host.store.refuse_new(None)

    def _check_outage(self) -> None:
        """Also called at every commit: the first group in after an outage ends the refusal
        at once (a producer told to retry is not refused again)."""
        copy = self.copy
        down_since = copy.down_since if copy is not None else None
        down = down_since is not None and time.monotonic() - down_since > self.ttl_ms / 1000
        if down == self._refusing:
            return
        self._refusing = down
        self.host.store.refuse_new(f"the database does not take the journal ({copy.problem})"
                                   if down and copy is not None else None)

    async def _delete_dead_rows(self) -> None:
        """Rows below the journal's oldest segment are dead; delete them in short batches
        once every record appended before that segment went is in the database (the
        records compaction moved forward must be there before their old rows go)."""
        conn: Any = None
        try:
            while True:
                await asyncio.sleep(HORIZON_EVERY_S)
                store = self.host.store
                seen, needed = self._horizon
                oldest = store.oldest_seq
                if oldest > seen:
                    self._horizon = seen, needed = oldest, store.appended_seq
                if seen <= self.deleted_below or self.committed_seq < needed:
                    continue
                try:
                    if conn is None:
                        conn = await self._connect()
                    while self.deleted_below < seen:
                        upto = min(seen, self.deleted_below + DELETE_BATCH)
                        await conn.execute(
                            f"DELETE FROM {self.schema}.journal WHERE seq < $1", upto)
                        self.deleted_below = upto
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # tried again next time
                    log.debug("Deleting dead journal rows failed: %s", describe(e))
                    if conn is not None:
                        conn.terminate()
                    conn = None
        finally:
            if conn is not None:
                conn.terminate()

    async def _drop_lease_connection(self) -> None:
        conn, self._lease_conn = self._lease_conn, None
        if conn is not None:
            conn.terminate()

    async def close(self, drain_timeout: float) -> None:
        """Stopping: the records appended reach the database, then the lease is released."""
        await self.stop_copy(drain_timeout)
        await self.release()
        await self._drop_lease_connection()
        tail, self._tail_conn = self._tail_conn, None
        if tail is not None:
            tail.terminate()

    def status(self) -> dict[str, Any]:
        copy = self.copy
        return {
            "url": self.where, "schema": self.schema, "lease": self.lease_state.value,
            "held_by": self.held_by or None,
            "epoch": self.epoch, "holder": self.holder,
            "lease_valid": self.may_confirm(),
            "copy": copy.state.value if copy is not None else "idle",
            "problem": copy.problem if copy is not None else "",
            "committed_seq": self.committed_seq,
            "waiting_records": copy.waiting if copy is not None else 0,
            "waiting_bytes": copy.pending_bytes if copy is not None else 0,
            "groups": copy.groups if copy is not None else 0,
            "deleted_below": self.deleted_below,
        }


def _refusal(error: Exception) -> str | None:
    """What in `error` waiting will not mend (a wrong password, no such database)."""
    import asyncpg
    if isinstance(error, asyncpg.InvalidPasswordError | asyncpg.InvalidCatalogNameError
                  | asyncpg.InvalidAuthorizationSpecificationError):
        return describe(error)
    return None
