#!/usr/bin/env python3
"""Which PostgreSQL driver for the journal's copy in PostgreSQL: asyncpg or psycopg 3, measured.

Run from the repository root:

    .venv/bin/python benchmarks/pg_drivers.py                        # 20000 x 1 KiB, 3 rounds
    .venv/bin/python benchmarks/pg_drivers.py --size 256 --rounds 1 --json /tmp/pg-256.json
    .venv/bin/python benchmarks/pg_drivers.py --url postgresql://u:pw@host:5432/db
    .venv/bin/python benchmarks/pg_drivers.py --rounds 0 --restart-test   # the restart test alone
    .venv/bin/python benchmarks/pg_drivers.py --variants all --size 16384

By default the script starts its own throwaway PostgreSQL 15 (--bindir): initdb in a
temporary directory owned by the postgres user (initdb and postgres refuse root, so as
root they run through `runuser -u postgres --`), a superuser with a password
(scram-sha-256), listening on 127.0.0.1 on a free port, fsync and synchronous_commit
left on. --url uses an existing server instead: the script creates, and drops at the
end, the tables pairmq_bench_journal and pairmq_bench_lease there.

The journal's shape: records (seq BIGINT PRIMARY KEY, data BYTEA) written in groups, one
transaction per group that (a) checks the lease row inside the transaction (--lease
select: `SELECT epoch ... FOR SHARE` compared with the expected epoch; --lease update:
`UPDATE ... WHERE epoch = $1` counting its rows) and (b) inserts the group, then COMMIT.
One transaction in flight at a time; what is appended meanwhile forms the next group.

The variants (--variants, comma-separated, or all): asyncpg-copy (copy_records_to_table,
binary COPY), asyncpg-executemany (INSERT), asyncpg-unnest (one INSERT ... SELECT FROM
unnest($1::bigint[], $2::bytea[])), psycopg-copy (cursor.copy, FORMAT BINARY, set_types),
psycopg-pipeline (BEGIN, lease, executemany and COMMIT in conn.pipeline()), psycopg-unnest;
and, only when named: psycopg-executemany (no explicit pipeline), asyncpg-unnest-1stmt and
psycopg-unnest-1stmt (the lease check in a CTE of the unnest INSERT, which is then its own
transaction: one round trip per group, no BEGIN or COMMIT; a lost lease inserts 0 rows).

Every variant runs, once per round, with the variants' order rotated from round to
round (the machine's noise spread over all of them), and the table shows medians:

- full speed: a producer coroutine appends --records records at full speed into the
  in-memory queue; it holds at most --window records not yet committed (flow control:
  without it the producer is done in a few milliseconds and the "groups" are one
  record then everything), and a group takes at most --max-group records and
  --max-group-bytes bytes. records/s and commits/s from the first append to the last
  commit, the mean group size, this process's CPU seconds (time.process_time: producer,
  writer, driver) per record, the server backend's CPU per record (when its process is
  on this machine), and the event loop's worst lag (a 2 ms ticker: what the driver
  costs the loop in one go, which the broker's clients would wait).
- one in flight: the producer waits for each record's commit (--latency-records of
  them): latency of each commit, p50 and p99, and CPU per commit.

--restart-test then runs `pg_ctl restart -m immediate` under load, once per variant,
and once with the connection idle, and reports what each driver raised (class, its
bases, SQLSTATE, the phase of the transaction), what the old connection says
afterwards, and whether every acknowledged record survived (only with the script's
own server).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import platform
import pwd
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import psycopg

try:
    import psutil
except ImportError:  # the server's CPU column stays empty
    psutil = None

JOURNAL = "pairmq_bench_journal"
LEASE = "pairmq_bench_lease"
EPOCH = 7
Record = tuple[int, bytes]


# ---------------------------------------------------------------- the throwaway server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """PostgreSQL in a temporary directory, run as the postgres user when we are root."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.tmp = Path(tempfile.mkdtemp(prefix="pairmq-pgdrivers-"))
        self.data = self.tmp / "data"
        self.log = self.tmp / "postgres.log"
        self.port = free_port()
        self.user = "bench"
        self.password = secrets.token_hex(12)
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.stopped = False

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> list[str]:
        return [*self.as_pg, str(self.bindir / "pg_ctl"), "-D", str(self.data),
                "-l", str(self.log), "-w", "-t", "60", *args]

    def restart_command(self) -> list[str]:
        return self._pg_ctl("-m", "immediate", "restart")

    def _run(self, cmd: list[str]) -> None:
        done = subprocess.run(cmd, cwd=self.tmp, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd[:6])}... exited {done.returncode}:\n"
                               f"{done.stdout}{done.stderr}{log}")

    def start(self) -> None:
        atexit.register(self.stop)  # also on SIGTERM (main() makes it a SystemExit)
        pwfile = self.tmp / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if self.as_pg:
            pg = pwd.getpwnam("postgres")
            for path in (self.tmp, pwfile):
                os.chown(path, pg.pw_uid, pg.pw_gid)
        self._run([*self.as_pg, str(self.bindir / "initdb"), "-D", str(self.data),
                   f"--username={self.user}", f"--pwfile={pwfile}", "--auth=scram-sha-256",
                   "--encoding=UTF8", "--locale=C"])
        pwfile.unlink()
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} "
                   f"-c unix_socket_directories={self.tmp} -c fsync=on -c synchronous_commit=on")
        self._run(self._pg_ctl("-o", options, "start"))

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        with contextlib.suppress(Exception):
            subprocess.run(self._pg_ctl("-m", "fast", "stop"), cwd=self.tmp,
                           capture_output=True, timeout=60)
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------- the sinks: one per variant


class LeaseLost(Exception):
    pass


class Sink:
    """One connection; commit(group) is the journal's one transaction per group."""

    name = ""
    driver = ""
    phase = "idle"  # where the transaction is, for the restart test
    backend_pid = 0

    def __init__(self, url: str, lease: str) -> None:
        self.url = url
        self.lease = lease

    async def connect(self) -> None:
        raise NotImplementedError

    async def commit(self, group: list[Record]) -> None:
        raise NotImplementedError

    async def ping(self) -> None:
        raise NotImplementedError

    def is_closed(self) -> bool:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class AsyncpgSink(Sink):
    driver = "asyncpg"
    conn: asyncpg.Connection

    async def connect(self) -> None:
        self.conn = await asyncpg.connect(self.url)
        self.backend_pid = self.conn.get_server_pid()

    async def commit(self, group: list[Record]) -> None:
        conn = self.conn
        self.phase = "begin"
        async with conn.transaction():
            self.phase = "lease"
            if self.lease == "select":
                epoch = await conn.fetchval(f"SELECT epoch FROM {LEASE} WHERE id = 1 FOR SHARE")
                if epoch != EPOCH:
                    raise LeaseLost(epoch)
            else:
                status = await conn.execute(
                    f"UPDATE {LEASE} SET last_seq = $2 WHERE id = 1 AND epoch = $1",
                    EPOCH, group[-1][0])
                if status != "UPDATE 1":
                    raise LeaseLost(status)
            self.phase = "insert"
            await self.insert(group)
            self.phase = "commit"
        self.phase = "idle"

    async def insert(self, group: list[Record]) -> None:
        raise NotImplementedError

    async def ping(self) -> None:
        await self.conn.fetchval("SELECT 1")

    def is_closed(self) -> bool:
        return self.conn.is_closed()

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.conn.close(), 5)
        except Exception:
            self.conn.terminate()


class AsyncpgCopy(AsyncpgSink):
    name = "asyncpg copy_records_to_table"

    async def insert(self, group: list[Record]) -> None:
        await self.conn.copy_records_to_table(JOURNAL, records=group, columns=("seq", "data"))


class AsyncpgExecutemany(AsyncpgSink):
    name = "asyncpg executemany"

    async def insert(self, group: list[Record]) -> None:
        await self.conn.executemany(f"INSERT INTO {JOURNAL} (seq, data) VALUES ($1, $2)", group)


class AsyncpgUnnest(AsyncpgSink):
    name = "asyncpg unnest"

    async def insert(self, group: list[Record]) -> None:
        await self.conn.execute(
            f"INSERT INTO {JOURNAL} (seq, data) SELECT * FROM unnest($1::bigint[], $2::bytea[])",
            [r[0] for r in group], [r[1] for r in group])


def one_statement(lease: str, ph: dict[str, str]) -> str:
    """The lease check and the INSERT in one statement, that is its own transaction: no
    BEGIN, no COMMIT, one round trip. A lost lease inserts nothing (counted: INSERT 0 0)."""
    epoch, last, seqs, datas = ph["epoch"], ph["last"], ph["seqs"], ph["datas"]
    if lease == "select":
        check = f"SELECT epoch FROM {LEASE} WHERE id = 1 AND epoch = {epoch} FOR SHARE"
    else:
        check = (f"UPDATE {LEASE} SET last_seq = {last} WHERE id = 1 AND epoch = {epoch} "
                 "RETURNING epoch")
    return (f"WITH lease AS ({check}) INSERT INTO {JOURNAL} (seq, data) "
            f"SELECT u.seq, u.data FROM lease, unnest({seqs}::bigint[], {datas}::bytea[]) "
            "AS u(seq, data)")


ASYNCPG_PH = {"seqs": "$1", "datas": "$2", "epoch": "$3", "last": "$4"}
PSYCOPG_PH = {"seqs": "%(seqs)b", "datas": "%(datas)b", "epoch": "%(epoch)s",
              "last": "%(last)s"}


class AsyncpgUnnestOneStatement(AsyncpgSink):
    name = "asyncpg unnest, lease in the same statement"

    async def commit(self, group: list[Record]) -> None:
        args: list[Any] = [[r[0] for r in group], [r[1] for r in group], EPOCH]
        if self.lease == "update":
            args.append(group[-1][0])
        self.phase = "statement"
        status = await self.conn.execute(one_statement(self.lease, ASYNCPG_PH), *args)
        if status != f"INSERT 0 {len(group)}":
            raise LeaseLost(status)
        self.phase = "idle"


class PsycopgSink(Sink):
    driver = "psycopg"
    conn: psycopg.AsyncConnection[Any]

    async def connect(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        self.backend_pid = self.conn.info.backend_pid

    async def commit(self, group: list[Record]) -> None:
        conn = self.conn
        self.phase = "begin"
        async with conn.transaction():
            self.phase = "lease"
            if self.lease == "select":
                cur = await conn.execute(f"SELECT epoch FROM {LEASE} WHERE id = 1 FOR SHARE")
                row = await cur.fetchone()
                if row is None or row[0] != EPOCH:
                    raise LeaseLost(row)
            else:
                cur = await conn.execute(
                    f"UPDATE {LEASE} SET last_seq = %s WHERE id = 1 AND epoch = %s",
                    (group[-1][0], EPOCH))
                if cur.rowcount != 1:
                    raise LeaseLost(cur.rowcount)
            self.phase = "insert"
            await self.insert(group)
            self.phase = "commit"
        self.phase = "idle"

    async def insert(self, group: list[Record]) -> None:
        raise NotImplementedError

    async def ping(self) -> None:
        await self.conn.execute("SELECT 1")

    def is_closed(self) -> bool:
        return bool(self.conn.closed)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.conn.close(), 5)


class PsycopgCopy(PsycopgSink):
    name = "psycopg COPY binary"

    async def insert(self, group: list[Record]) -> None:
        async with self.conn.cursor() as cur, cur.copy(
                f"COPY {JOURNAL} (seq, data) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "bytea"])
            for row in group:
                await copy.write_row(row)


class PsycopgUnnest(PsycopgSink):
    name = "psycopg unnest"

    async def insert(self, group: list[Record]) -> None:
        await self.conn.execute(
            f"INSERT INTO {JOURNAL} (seq, data) SELECT * FROM unnest(%b::bigint[], %b::bytea[])",
            ([r[0] for r in group], [r[1] for r in group]))


class PsycopgExecutemany(PsycopgSink):
    """executemany alone (psycopg pipelines its INSERTs itself, the rest is not): not a default."""

    name = "psycopg executemany"

    async def insert(self, group: list[Record]) -> None:
        async with self.conn.cursor() as cur:
            await cur.executemany(f"INSERT INTO {JOURNAL} (seq, data) VALUES (%b, %b)", group)


class PsycopgPipeline(PsycopgSink):
    """BEGIN, the lease, the INSERTs and COMMIT in one pipeline: two round trips per group
    (the lease's answer is read, with a flush request, after the INSERTs are sent)."""

    name = "psycopg pipeline executemany"

    async def commit(self, group: list[Record]) -> None:
        conn = self.conn
        self.phase = "begin"
        async with conn.pipeline(), conn.transaction():
            self.phase = "lease"
            if self.lease == "select":
                lease = await conn.execute(f"SELECT epoch FROM {LEASE} WHERE id = 1 FOR SHARE")
            else:  # a row count is only known once the pipeline is synced: RETURNING instead
                lease = await conn.execute(
                    f"UPDATE {LEASE} SET last_seq = %s WHERE id = 1 AND epoch = %s "
                    "RETURNING epoch", (group[-1][0], EPOCH))
            self.phase = "insert"
            async with conn.cursor() as cur:
                await cur.executemany(f"INSERT INTO {JOURNAL} (seq, data) VALUES (%b, %b)",
                                      group)
            self.phase = "lease"
            row = await lease.fetchone()
            if row is None or row[0] != EPOCH:
                raise LeaseLost(row)
            self.phase = "commit"
        self.phase = "idle"


class PsycopgUnnestOneStatement(PsycopgSink):
    name = "psycopg unnest, lease in the same statement"

    async def commit(self, group: list[Record]) -> None:
        args = {"seqs": [r[0] for r in group], "datas": [r[1] for r in group],
                "epoch": EPOCH, "last": group[-1][0]}
        self.phase = "statement"
        cur = await self.conn.execute(one_statement(self.lease, PSYCOPG_PH), args)
        if cur.rowcount != len(group):
            raise LeaseLost(cur.rowcount)
        self.phase = "idle"


VARIANTS: dict[str, type[Sink]] = {
    "asyncpg-copy": AsyncpgCopy,
    "asyncpg-executemany": AsyncpgExecutemany,
    "asyncpg-unnest": AsyncpgUnnest,
    "psycopg-copy": PsycopgCopy,
    "psycopg-pipeline": PsycopgPipeline,
    "psycopg-unnest": PsycopgUnnest,
    "psycopg-executemany": PsycopgExecutemany,
    "asyncpg-unnest-1stmt": AsyncpgUnnestOneStatement,
    "psycopg-unnest-1stmt": PsycopgUnnestOneStatement,
}
EXTRA_VARIANTS = ("psycopg-executemany", "asyncpg-unnest-1stmt", "psycopg-unnest-1stmt")
DEFAULT_VARIANTS = [v for v in VARIANTS if v not in EXTRA_VARIANTS]


# ---------------------------------------------------------------- group commit


class GroupCommitter:
    """The journal's writer: one transaction in flight, what queues meanwhile is the next group."""

    def __init__(self, sink: Sink, window: int, max_group: int, max_group_bytes: int) -> None:
        self.sink = sink
        self.window = window
        self.max_group = max_group
        self.max_group_bytes = max_group_bytes
        self.pending: deque[Record] = deque()
        self.waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.outstanding = 0  # appended, not yet committed
        self.wakeup = asyncio.Event()
        self.space = asyncio.Event()
        self.closing = False
        self.error: BaseException | None = None
        self.error_at = 0.0
        self.in_flight: tuple[int, int] | None = None  # first and last seq of the open group
        self.committed_seq = 0  # records 1..committed_seq acknowledged (seqs are contiguous)
        self.commits = 0
        self.records = 0

    async def append(self, seq: int, data: bytes, wait: bool = False) -> None:
        while self.outstanding >= self.window:
            if self.error is not None:
                raise self.error
            self.space.clear()
            await self.space.wait()
        if self.error is not None:
            raise self.error
        self.pending.append((seq, data))
        self.outstanding += 1
        self.wakeup.set()
        if wait:
            done = asyncio.get_running_loop().create_future()
            self.waiters.append((seq, done))
            await done

    def close(self) -> None:
        self.closing = True
        self.wakeup.set()

    def _take(self) -> list[Record]:
        group: list[Record] = []
        size = 0
        pending = self.pending
        while pending and len(group) < self.max_group:
            record = pending[0]
            if group and size + len(record[1]) > self.max_group_bytes:
                break
            group.append(pending.popleft())
            size += len(record[1])
        return group

    async def run(self) -> None:
        try:
            while True:
                if not self.pending:
                    if self.closing:
                        return
                    self.wakeup.clear()
                    await self.wakeup.wait()
                    continue
                group = self._take()
                self.in_flight = (group[0][0], group[-1][0])
                await self.sink.commit(group)
                self.in_flight = None
                self.commits += 1
                self.records += len(group)
                self.outstanding -= len(group)
                self.committed_seq = group[-1][0]
                self.space.set()
                while self.waiters and self.waiters[0][0] <= self.committed_seq:
                    done = self.waiters.popleft()[1]
                    if not done.done():
                        done.set_result(None)
        except BaseException as e:
            self.error, self.error_at = e, time.perf_counter()
            for _, done in self.waiters:
                if not done.done():
                    done.set_exception(e)
            self.space.set()
            raise


class LagMonitor:
    """A ticker every `interval`: how late it wakes is how long something held the loop."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.lags: list[float] = []
        self.task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.lags.append(time.perf_counter() - started - self.interval)

    def start(self) -> None:
        self.task = asyncio.create_task(self._tick())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


def backend_cpu(pid: int, local: bool) -> float | None:
    if not local or psutil is None or not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if not proc.name().startswith("postgres"):
            return None
        t = proc.cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return None


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# ---------------------------------------------------------------- one run


async def prepare(admin: asyncpg.Connection) -> None:
    await admin.execute(f"""
        DROP TABLE IF EXISTS {JOURNAL};
        DROP TABLE IF EXISTS {LEASE};
        CREATE TABLE {JOURNAL} (seq BIGINT PRIMARY KEY, data BYTEA NOT NULL);
        CREATE TABLE {LEASE} (id INT PRIMARY KEY, epoch BIGINT NOT NULL, holder TEXT NOT NULL,
                              last_seq BIGINT NOT NULL DEFAULT 0);
        INSERT INTO {LEASE} (id, epoch, holder) VALUES (1, {EPOCH}, 'bench');
    """)


async def fresh_table(url: str, checkpoint: bool) -> None:
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(f"TRUNCATE {JOURNAL}")
        await admin.execute(f"UPDATE {LEASE} SET last_seq = 0")
        if checkpoint:
            with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
                await admin.execute("CHECKPOINT")
    finally:
        await admin.close()


async def run_variant(cls: type[Sink], args: argparse.Namespace, url: str, local: bool,
                      records: list[Record], latency_records: list[Record]) -> dict[str, Any]:
    await fresh_table(url, checkpoint=True)
    sink = cls(url, args.lease)
    await sink.connect()
    try:
        for k in range(3):  # statements prepared, types looked up: not measured
            await sink.commit([(-1 - 64 * k - i, records[i][1]) for i in range(64)])

        # full speed
        committer = GroupCommitter(sink, args.window, args.max_group, args.max_group_bytes)
        lag = LagMonitor()
        lag.start()
        await asyncio.sleep(0.01)
        server0 = backend_cpu(sink.backend_pid, local)
        cpu0, t0 = time.process_time(), time.perf_counter()
        writer = asyncio.create_task(committer.run())
        every = args.yield_every
        for i, (seq, data) in enumerate(records):
            await committer.append(seq, data)
            if i % every == every - 1:
                await asyncio.sleep(0)
        committer.close()
        await writer
        t1, cpu1 = time.perf_counter(), time.process_time()
        server1 = backend_cpu(sink.backend_pid, local)
        await lag.stop()
        n, seconds = len(records), t1 - t0
        full = {
            "records_per_s": n / seconds,
            "seconds": seconds,
            "commits": committer.commits,
            "commits_per_s": committer.commits / seconds,
            "mean_group": n / committer.commits,
            "cpu_us_per_record": (cpu1 - cpu0) / n * 1e6,
            "server_cpu_us_per_record": (None if server0 is None or server1 is None
                                         else (server1 - server0) / n * 1e6),
            "loop_lag_max_ms": max(lag.lags, default=0.0) * 1e3,
            "loop_lag_p99_ms": percentile(lag.lags, 99) * 1e3,
        }

        # one record in flight
        committer = GroupCommitter(sink, 1, 1, args.max_group_bytes)
        writer = asyncio.create_task(committer.run())
        latencies: list[float] = []
        server0 = backend_cpu(sink.backend_pid, local)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for seq, data in latency_records:
            started = time.perf_counter()
            await committer.append(seq, data, wait=True)
            latencies.append(time.perf_counter() - started)
        t1, cpu1 = time.perf_counter(), time.process_time()
        server1 = backend_cpu(sink.backend_pid, local)
        committer.close()
        await writer
        m = len(latency_records)
        one = {
            "commits_per_s": m / (t1 - t0),
            "latency_p50_us": percentile(latencies, 50) * 1e6,
            "latency_p99_us": percentile(latencies, 99) * 1e6,
            "cpu_us_per_commit": (cpu1 - cpu0) / m * 1e6,
            "server_cpu_us_per_commit": (None if server0 is None or server1 is None
                                         else (server1 - server0) / m * 1e6),
        }
    finally:
        await sink.close()
    return {"full_speed": full, "one_in_flight": one}


# ---------------------------------------------------------------- the restart test


def describe(e: BaseException | None, depth: int = 0) -> dict[str, Any] | None:
    if e is None:
        return None
    kind = type(e)
    out: dict[str, Any] = {
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "bases": [f"{b.__module__}.{b.__qualname__}" for b in kind.__mro__[1:]
                  if b not in (BaseException, Exception, object)],
        "sqlstate": getattr(e, "sqlstate", None),
        "message": str(e).strip().replace("\n", " | ")[:240],
    }
    inner = e.__cause__ or e.__context__
    if inner is not None and depth < 2:
        out["context"] = describe(inner, depth + 1)
    return out


async def connect_retry(url: str, seconds: float = 60) -> asyncpg.Connection:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await asyncpg.connect(url, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def restart(server: Server) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *server.restart_command(), cwd=server.tmp,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    if await proc.wait() != 0:
        raise RuntimeError("pg_ctl restart failed: " + server.log.read_text()[-2000:])
    return time.perf_counter() - started


async def after_failure(sink: Sink) -> dict[str, Any]:
    out: dict[str, Any] = {"closed_after_error": sink.is_closed()}
    try:
        await asyncio.wait_for(sink.ping(), 10)
        out["old_connection_next_query"] = "worked"
    except Exception as e:
        out["old_connection_next_query"] = describe(e)
    return out


async def restart_under_load(cls: type[Sink], args: argparse.Namespace,
                             server: Server, payload: bytes) -> dict[str, Any]:
    await fresh_table(server.url, checkpoint=False)
    sink = cls(server.url, args.lease)
    await sink.connect()
    committer = GroupCommitter(sink, args.window, args.max_group, args.max_group_bytes)
    writer = asyncio.create_task(committer.run())

    async def produce() -> None:
        seq = 0
        while True:
            seq += 1
            await committer.append(seq, payload)
            if seq % args.yield_every == 0:
                await asyncio.sleep(0)

    producer = asyncio.create_task(produce())
    await asyncio.sleep(args.restart_after)
    started = time.perf_counter()
    restart_task = asyncio.create_task(restart(server))
    done, _ = await asyncio.wait({writer}, timeout=60)
    producer.cancel()
    with contextlib.suppress(BaseException):
        await producer
    out: dict[str, Any] = {"variant": cls.__name__, "scenario": "under load"}
    if not done:
        out["raised"] = "nothing within 60 s: the writer hangs"
        writer.cancel()
    else:
        out["raised"] = describe(writer.exception())
        out["phase"] = sink.phase
        out["error_after_s"] = round(committer.error_at - started, 3)
    out["restart_s"] = round(await restart_task, 2)
    out.update(await after_failure(sink))
    await sink.close()
    admin = await connect_retry(server.url)
    try:
        acked = committer.committed_seq
        present = await admin.fetchval(f"SELECT count(*) FROM {JOURNAL} WHERE seq <= $1", acked)
        out["acknowledged"] = acked
        out["acknowledged_present"] = present
        if committer.in_flight is not None:
            first, last = committer.in_flight
            n = await admin.fetchval(
                f"SELECT count(*) FROM {JOURNAL} WHERE seq BETWEEN $1 AND $2", first, last)
            out["in_doubt_group"] = f"{last - first + 1} records, {n} present after the restart"
    finally:
        await admin.close()
    return out


async def restart_idle(cls: type[Sink], args: argparse.Namespace,
                       server: Server, payload: bytes) -> dict[str, Any]:
    await fresh_table(server.url, checkpoint=False)
    sink = cls(server.url, args.lease)
    await sink.connect()
    await sink.commit([(1, payload)])
    await restart(server)
    out: dict[str, Any] = {"variant": cls.__name__, "scenario": "idle"}
    try:
        await asyncio.wait_for(sink.commit([(2, payload)]), 30)
        out["raised"] = "nothing: the next group committed"
    except Exception as e:
        out["raised"], out["phase"] = describe(e), sink.phase
    out.update(await after_failure(sink))
    await sink.close()
    return out


# ---------------------------------------------------------------- the report


def median(runs: list[dict[str, Any]], part: str, key: str) -> float | None:
    values = [r[part][key] for r in runs if r[part][key] is not None]
    return statistics.median(values) if values else None


def spread(runs: list[dict[str, Any]], part: str, key: str) -> float | None:
    values = [r[part][key] for r in runs]
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    names = list(results)
    best = max(median(results[v], "full_speed", "records_per_s") or 0 for v in names)
    rows = [["variant", "rec/s", "±", "x best", "group", "commit/s", "cpu µs/rec",
             "srv µs/rec", "lag max ms", "|", "1-by-1 commit/s", "p50 µs", "p99 µs",
             "cpu µs/commit", "srv µs/commit"]]
    for v in names:
        runs = results[v]
        rps = median(runs, "full_speed", "records_per_s")
        sp = spread(runs, "full_speed", "records_per_s")
        rows.append([
            v, fmt(rps), "-" if sp is None else f"{sp * 100:.0f}%",
            fmt((rps or 0) / best if best else None, 2),
            fmt(median(runs, "full_speed", "mean_group"), 1),
            fmt(median(runs, "full_speed", "commits_per_s")),
            fmt(median(runs, "full_speed", "cpu_us_per_record"), 1),
            fmt(median(runs, "full_speed", "server_cpu_us_per_record"), 1),
            fmt(median(runs, "full_speed", "loop_lag_max_ms"), 1),
            "|", fmt(median(runs, "one_in_flight", "commits_per_s")),
            fmt(median(runs, "one_in_flight", "latency_p50_us")),
            fmt(median(runs, "one_in_flight", "latency_p99_us")),
            fmt(median(runs, "one_in_flight", "cpu_us_per_commit")),
            fmt(median(runs, "one_in_flight", "server_cpu_us_per_commit")),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:],
                                                                       strict=True)]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def restart_lines(found: list[dict[str, Any]]) -> str:
    lines = []
    for r in found:
        raised = r["raised"]
        if isinstance(raised, dict):
            chain, d = [], raised
            while d:
                chain.append(f"{d['type']}"
                             + (f" [{d['sqlstate']}]" if d.get("sqlstate") else "")
                             + f": {d['message'][:100]}")
                d = d.get("context")
            text = "\n      from ".join(chain)
        else:
            text = str(raised)
        nxt = r["old_connection_next_query"]
        nxt_text = nxt if isinstance(nxt, str) else f"{nxt['type']}: {nxt['message'][:80]}"
        lines.append(f"{r['variant']} ({r['scenario']}, phase {r.get('phase', '-')}): {text}")
        lines.append(f"    closed: {r['closed_after_error']}; old connection's next query: "
                     f"{nxt_text}")
        if "acknowledged" in r:
            lines.append(f"    acknowledged {r['acknowledged']}, present "
                         f"{r['acknowledged_present']}; in-doubt group: "
                         f"{r.get('in_doubt_group', 'none')}; error after "
                         f"{r.get('error_after_s')} s, restart took {r['restart_s']} s")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    server: Server | None = None
    if args.url:
        url = args.url
        local = urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1", None)
    else:
        server = Server(Path(args.bindir))
        server.start()
        url, local = server.url, True
    try:
        admin = await asyncpg.connect(url)
        try:
            await prepare(admin)
            settings = {k: await admin.fetchval(f"SHOW {k}") for k in
                        ("server_version", "fsync", "synchronous_commit", "wal_sync_method",
                         "shared_buffers", "max_wal_size")}
        finally:
            await admin.close()
        pool = [os.urandom(args.size) for _ in range(min(256, args.records))]
        records = [(i, pool[i % len(pool)]) for i in range(1, args.records + 1)]
        latency_records = [(i, pool[i % len(pool)]) for i in
                           range(args.records + 1, args.records + args.latency_records + 1)]
        variants = (list(VARIANTS) if args.variants == "all" else
                    args.variants.split(",") if args.variants else DEFAULT_VARIANTS)
        for v in variants:
            if v not in VARIANTS:
                raise SystemExit(f"unknown variant {v!r}: {', '.join(VARIANTS)}")
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        print(f"# {' '.join(sys.argv)}", flush=True)
        print(f"# PostgreSQL {settings['server_version']} (fsync={settings['fsync']}, "
              f"synchronous_commit={settings['synchronous_commit']}, "
              f"wal_sync_method={settings['wal_sync_method']}), python "
              f"{platform.python_version()}, asyncpg {asyncpg.__version__}, psycopg "
              f"{psycopg.__version__} ({psycopg.pq.__impl__}), loop "
              f"{type(asyncio.get_running_loop()).__module__}, {os.cpu_count()} CPUs",
              flush=True)
        print(f"# {args.records} x {args.size} B at full speed (window {args.window}, "
              f"group <= {args.max_group} records and {args.max_group_bytes} B), "
              f"{args.latency_records} one in flight, lease check: {args.lease}", flush=True)
        if args.rounds and args.warmup:
            # not measured: the first run after initdb also creates the WAL segments the
            # later ones recycle, and the machine's caches and clocks warm up
            await run_variant(VARIANTS[variants[0]], args, url, local, records,
                              latency_records[:200])
            print(f"warm-up run ({variants[0]}) done", flush=True)
        for rnd in range(args.rounds):
            order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
            for v in order:
                got = await run_variant(VARIANTS[v], args, url, local, records, latency_records)
                results[v].append(got)
                f, o = got["full_speed"], got["one_in_flight"]
                print(f"round {rnd + 1} {v:22} {f['records_per_s']:9,.0f} rec/s  "
                      f"group {f['mean_group']:6.1f}  cpu {f['cpu_us_per_record']:5.1f} µs/rec"
                      f"  lag {f['loop_lag_max_ms']:5.1f} ms | 1 in flight "
                      f"{o['commits_per_s']:6,.0f}/s p50 {o['latency_p50_us']:5.0f} µs",
                      flush=True)
        if args.rounds:
            print()
            print(table(results))
        restarts: list[dict[str, Any]] = []
        if args.restart_test:
            if server is None:
                print("\n--restart-test needs the script's own server (no --url)")
            else:
                for v in variants:
                    restarts.append(await restart_under_load(VARIANTS[v], args, server,
                                                             pool[0]))
                    restarts.append(await restart_idle(VARIANTS[v], args, server, pool[0]))
                print("\npg_ctl restart -m immediate:")
                print(restart_lines(restarts))
        if args.url:
            admin = await asyncpg.connect(url)
            try:
                await admin.execute(f"DROP TABLE IF EXISTS {JOURNAL}, {LEASE}")
            finally:
                await admin.close()
        return {
            "command": sys.argv, "settings": settings, "args": vars(args),
            "versions": {"python": platform.python_version(), "asyncpg": asyncpg.__version__,
                         "psycopg": psycopg.__version__, "psycopg_impl": psycopg.pq.__impl__},
            "runs": results,
            "medians": {v: {part: {k: median(runs, part, k) for k in runs[0][part]}
                            for part in runs[0]} for v, runs in results.items() if runs},
            "restart_test": restarts,
        }
    finally:
        if server is not None:
            server.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", help="an existing PostgreSQL (default: start a throwaway one)")
    p.add_argument("--bindir", default="/usr/lib/postgresql/15/bin")
    p.add_argument("--records", type=int, default=20000, help="records per full-speed run")
    p.add_argument("--size", type=int, default=1024, help="bytes per record")
    p.add_argument("--latency-records", type=int, default=2000,
                   help="records (= commits) per one-in-flight run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, choices=(0, 1), default=1,
                   help="one unmeasured run before the rounds")
    p.add_argument("--window", type=int, default=1024,
                   help="records appended and not yet committed, at most (flow control)")
    p.add_argument("--max-group", type=int, default=256, help="records per group, at most")
    p.add_argument("--max-group-bytes", type=int, default=4 << 20,
                   help="bytes per group, at most (one record at least)")
    p.add_argument("--yield-every", type=int, default=64,
                   help="the producer yields to the loop every N appends")
    p.add_argument("--lease", choices=("select", "update"), default="select")
    p.add_argument("--variants", help=f"comma-separated, of: {', '.join(VARIANTS)}, or all "
                                      f"(default: all but {', '.join(EXTRA_VARIANTS)})")
    p.add_argument("--restart-test", action="store_true",
                   help="pg_ctl restart -m immediate under load and idle, per variant")
    p.add_argument("--restart-after", type=float, default=0.5,
                   help="seconds of load before the restart")
    p.add_argument("--json", type=Path, help="write the runs, medians and restart results here")
    p.add_argument("--no-uvloop", action="store_true")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runner: Callable[[Any], Any] = asyncio.run
    if not args.no_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            runner = uvloop.run
    report = runner(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
