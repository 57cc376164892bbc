"""The deployments benchmarks/failover.py measures: a pair with its journal on each server
(replication), on a shared directory (shared-store), or in PostgreSQL (database), each
built from a template journal and formed anew for every run."""

from __future__ import annotations

import datetime
import itertools
import re
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

import psycopg
from tests.support.etcd import EtcdCluster
from tests.support.postgres import PostgresError, PostgresServer, quote_ident

from benchmarks.ha_replication import BenchError, Pair, ha_state
from benchmarks.persistent import run_load

QUEUE = "/queue/failover.retained"


class Deployment(Protocol):
    """One way of running a pair, as the benchmark needs it."""

    def prepare(self, retained: int, size: int) -> None:
        """Build the template: `retained` messages in QUEUE, every server stopped."""

    def start_run(self, workdir: Path) -> None:
        """A pair on a copy of the template, formed (one serving, the other ready)."""

    def ready(self, status: dict[str, Any] | None) -> bool:
        """The taker, per its /status, would take over at once if the active died now."""

    def kill_active(self) -> None: ...

    def taker(self) -> tuple[str, int]:
        """STOMP host and port of the server that takes over."""

    def status_of_taker(self) -> dict[str, Any] | None: ...

    def stop(self) -> list[str]: ...

    def log_problems(self) -> list[str]: ...

    def timeline(self) -> dict[str, Any]:
        """What the taker's log says of the takeover just measured (may be empty)."""

    def close(self) -> None:
        """The benchmark is done with this deployment (its template)."""


class TwoServers:
    """Two servers started with `policy`: "replication" (each its own journal, the backup
    follows the active's records; a witness) or "shared-store" (one journal in a shared
    directory, a lock; the backup replays the journal when it takes over)."""

    def __init__(self, template: Path, heartbeat_ms: int, activation_ms: int,
                 policy: str, etcd: EtcdCluster | None = None,
                 kill_etcd_leader: bool = False) -> None:
        self.template = template
        self.heartbeat_ms = heartbeat_ms
        self.activation_ms = activation_ms
        self.policy = policy
        self.etcd = etcd  # the arbiter, instead of a witness process (--arbiter etcd)
        self.kill_etcd_leader = kill_etcd_leader
        self.killed_member: int | None = None
        self.pair: Pair | None = None

    def _pair(self, workdir: Path, activation_ms: int = 0) -> Pair:
        # every run is a new pair: its own group, so no lease record of an earlier run
        self.pair = Pair(workdir, heartbeat_ms=self.heartbeat_ms,
                         activation_ms=activation_ms or self.activation_ms, policy=self.policy,
                         etcd=self.etcd.url if self.etcd else "",
                         group=f"bench-{uuid.uuid4().hex[:12]}")
        return self.pair

    def prepare(self, retained: int, size: int) -> None:
        # Loading a million messages as fast as two producers can, on a shared 2-core
        # machine, makes garbage collections of the growing heap last up to a second or
        # more (docs/benchmarks.md): with the default 2 s interval a lease or lock proof
        # can then lapse mid-load. The template is prepared with a 10 s interval; every
        # measured run uses the setting's intervals.
        pair = self._pair(self.template, activation_ms=max(self.activation_ms, 10_000))
        load_then_stop(pair, retained, size, ready_timeout=120, stop_timeout=10)
        for log in self.template.glob("*.log"):
            log.unlink()

    def start_run(self, workdir: Path) -> None:
        for data in [*self.template.glob("data-*"), self.template / "shared"]:
            if data.exists():
                shutil.copytree(data, workdir / data.name)
        self._pair(workdir).start_pair(timeout=180)

    def _current(self) -> Pair:
        assert self.pair is not None
        return self.pair

    def ready(self, status: dict[str, Any] | None) -> bool:
        return self._current().ready_to_take_over(status)

    def kill_active(self) -> None:
        if self.etcd is not None and self.kill_etcd_leader:
            self.killed_member = self.etcd.wait_leader()
            self.etcd.kill(self.killed_member)  # the etcd leader at the same moment
        self._current().servers["primary"].proc.send_signal(signal.SIGKILL)

    def taker(self) -> tuple[str, int]:
        backup = self._current().servers["backup"]
        return backup.host, backup.port

    def status_of_taker(self) -> dict[str, Any] | None:
        return self._current().status("backup")

    def stop(self) -> list[str]:
        problems = self._current().stop()  # what is still running (the killed one is reaped)
        if self.etcd is not None and self.killed_member is not None:
            self.etcd.restart(self.killed_member)
            self.etcd.wait_healthy()
            self.killed_member = None
        return problems

    def log_problems(self) -> list[str]:
        return self._current().log_problems()

    def timeline(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


# The backup's log lines that mark the steps of a database takeover, and the record keys
# of their times after the kill (the first line of each after it).
TAKEOVER_STEPS = (
    ("peer_lost_s", re.compile(r"Lost the HA channel")),
    ("lease_taken_s", re.compile(r"Database lease taken")),
    ("tail_read_s", re.compile(r"Journal read ahead from the database|"
                               r"Journal restored from the database")),
    ("recovered_s", re.compile(r"Recovered \d+ messages")),
    ("serving_s", re.compile(r"Local server switched to (ACTIVE|STANDALONE)")),
)
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
# "Journal read ahead from the database ...: N records up to seq S, the tail read in X s":
# N is what the local copy holds in all; X the pull of the tail and the copy's fsync
TAIL_READ = re.compile(r"(\d+) records up to seq (\d+), the tail read in ([\d.]+) s")
RECOVERY = re.compile(r"from (\d+) records in (\d+) segments in ([\d.]+) s")
READ_AHEAD = re.compile(r"\((\d+) of the records read ahead, before\)")


def takeover_timeline(log: Path, killed_at: float) -> dict[str, Any]:
    """Seconds from the kill (wall clock, `killed_at`) to each of TAKEOVER_STEPS in the
    backup's log (ms resolution), and what its tail-read and recovery lines report."""
    found: dict[str, Any] = {}
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        stamp = LOG_TIME.match(line)
        if stamp is None:
            continue
        at = datetime.datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S").timestamp() \
            + int(stamp[2]) / 1000
        if at < killed_at - 0.001:
            continue
        for key, pattern in TAKEOVER_STEPS:
            if key not in found and pattern.search(line):
                found[key] = round(at - killed_at, 3)
                if key == "tail_read_s":
                    tail = TAIL_READ.search(line)
                    found["tail_read"] = ({"copy_records": int(tail[1]),
                                           "up_to": int(tail[2]), "took_s": float(tail[3])}
                                          if tail else "restored in full: " + line[24:200])
                elif key == "recovered_s":
                    rec, ahead = RECOVERY.search(line), READ_AHEAD.search(line)
                    if rec:
                        found["recovery"] = {"records": int(rec[1]), "segments": int(rec[2]),
                                             "took_s": float(rec[3]),
                                             "read_ahead": int(ahead[1]) if ahead else 0}
    return found


class DatabasePair(TwoServers):
    """A shared-store pair on PostgreSQL (--policy database): the journal and the lock (a
    lease of the activation interval, at least 500 ms, on the database's clock) in the schema
    pairmq_<GROUP> of one database per run, each a copy of the template database. Each
    server's data dir holds only a local copy, made anew from the database every run."""

    GROUP = "failover"  # the same schema in the template and every copy of it
    MIN_LEASE_MS = 500  # [store] lease_timeout_ms refuses less

    _cases = itertools.count(1)

    def __init__(self, template: Path, heartbeat_ms: int, activation_ms: int, *,
                 postgres: PostgresServer) -> None:
        super().__init__(template, heartbeat_ms, activation_ms, "shared-store")
        self.postgres = postgres
        case = next(self._cases)
        self.template_db = f"failover_template_{case}"
        self.run_prefix = f"failover_run_{case}_"
        self.runs = 0
        self.run_db: str | None = None
        self.killed_at = 0.0
        self.copy_s = 0.0
        self.lease_conn: psycopg.Connection[Any] | None = None  # reads the lease row
        self.lease_left_s: float | None = None

    @classmethod
    def lease_ms(cls, activation_ms: int) -> int:
        """The lease: the activation interval, or the least the server takes ("fast")."""
        return max(activation_ms, cls.MIN_LEASE_MS)

    def _database_pair(self, workdir: Path, database: str, activation_ms: int) -> Pair:
        self.pair = Pair(workdir, heartbeat_ms=self.heartbeat_ms, activation_ms=activation_ms,
                         policy="shared-store", group=self.GROUP,
                         database=self.postgres.url(database),
                         lease_ms=self.lease_ms(activation_ms))
        return self.pair

    def _connections(self, database: str) -> int:
        return int(self.postgres.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                     f"'{database}'").strip())

    def prepare(self, retained: int, size: int) -> None:
        self.postgres.create_database(self.template_db)
        # As TwoServers: a 10 s interval (and lease) while loading, against long GC pauses.
        pair = self._database_pair(self.template, self.template_db,
                                   max(self.activation_ms, 10_000))
        load_then_stop(pair, retained, size, ready_timeout=600, stop_timeout=60)
        held = self.postgres.sql(f"SELECT count(*) FROM pairmq_{self.GROUP}.journal",
                                 database=self.template_db).strip()
        print(f"template database {self.template_db}: {held} journal rows, "
              + self.postgres.sql(f"SELECT pg_size_pretty(pg_database_size("
                                  f"'{self.template_db}'))").strip(),
              file=sys.stderr, flush=True)
        # the hint bits and visibility map set once here, not by the first read of each copy
        self.postgres.sql("VACUUM (ANALYZE)", database=self.template_db, timeout=1800)
        for data in self.template.glob("data-*"):  # local copies: every run makes its own
            shutil.rmtree(data, ignore_errors=True)
        for log in self.template.glob("*.log"):
            log.unlink()

    def start_run(self, workdir: Path) -> None:
        # CREATE DATABASE ... TEMPLATE fails while anything is connected to the template
        deadline = time.monotonic() + 30
        while self._connections(self.template_db) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.runs += 1
        self.run_db = f"{self.run_prefix}{self.runs}"
        started = time.monotonic()
        # FILE_COPY (PostgreSQL 15+; the only way before): the files copied, not WAL-logged
        strategy = " STRATEGY FILE_COPY" if self.postgres.version >= 15 else ""
        self.postgres.sql(f"CREATE DATABASE {quote_ident(self.run_db)} TEMPLATE "
                          f"{quote_ident(self.template_db)}{strategy}", timeout=1800)
        self.copy_s = time.monotonic() - started
        self._database_pair(workdir, self.run_db, self.activation_ms).start_pair(timeout=600)
        self.lease_conn = psycopg.connect(self.postgres.url(self.run_db), autocommit=True)
        self.lease_left_s = None

    def ready(self, status: dict[str, Any] | None) -> bool:
        """PASSIVE and warm: the backup read the journal ahead up to the active's appended
        seq, and the database committed all of it (an idle active: nothing in flight)."""
        pair = self._current()
        if ha_state(status) != "PASSIVE" or status is None:
            return False
        if status["ha"]["peer"]["state"] != "ACTIVE":
            return False
        active = pair.status("primary")
        if active is None or ha_state(active) != "ACTIVE":
            return False
        appended = active["journal"]["appended_seq"]
        committed = active["journal"].get("database", {}).get("committed_seq", 0)
        return committed >= appended and status["ha"]["shared"].get("read_ahead_seq", 0) \
            >= appended

    def kill_active(self) -> None:
        self.killed_at = time.time()
        super().kill_active()
        # When the dead active's lease runs out: its row read at once, on the database's
        # clock (an open connection: a millisecond; the lease has a second or more left)
        assert self.lease_conn is not None
        try:
            row = self.lease_conn.execute(
                f"SELECT expires_ms - (extract(epoch from clock_timestamp()) * 1000)::bigint, "
                f"holder FROM pairmq_{self.GROUP}.lease WHERE id = 1").fetchone()
        except psycopg.Error as e:  # only the timeline lacks it
            print(f"the lease row could not be read after the kill: {e}", file=sys.stderr)
            return
        if row is not None and row[1].startswith("primary "):
            self.lease_left_s = time.time() - self.killed_at + row[0] / 1000

    def timeline(self) -> dict[str, Any]:
        backup = self._current().servers.get("backup")
        found = takeover_timeline(backup.log_path, self.killed_at) if backup else {}
        expired = {} if self.lease_left_s is None else \
            {"lease_expired_s": round(self.lease_left_s, 3)}
        return {"database_copy_s": round(self.copy_s, 2), **expired, **found}

    def stop(self) -> list[str]:
        if self.lease_conn is not None:
            self.lease_conn.close()
            self.lease_conn = None
        problems = super().stop()
        if self.run_db is not None:
            try:
                self.postgres.drop_database(self.run_db)
            except Exception as e:  # reported; the benchmark goes on
                problems.append(f"dropping {self.run_db}: {e}")
            self.run_db = None
        return problems

    def close(self) -> None:
        try:
            self.postgres.drop_database(self.template_db)
        except PostgresError as e:  # only disk space is at stake: the server goes at the end
            print(f"could not drop {self.template_db}: {e}", file=sys.stderr)


def load_then_stop(pair: Pair, retained: int, size: int, ready_timeout: float,
                   stop_timeout: float) -> None:
    """A template's journal: the pair started, `retained` messages loaded through its
    active (each confirmed), the backup ready; then both stopped, the backup first
    (stopping the active would not make it take over, but would leave it behind; a
    database pair's active releases the lease as it stops)."""
    try:
        pair.start_pair(timeout=120)
        if retained:
            primary = pair.servers["primary"]
            load = run_load(primary.host, primary.port, 2, 0, retained, size=size,
                            destination=QUEUE, timeout=3600)
            if load.errors or load.confirmed != retained:
                raise BenchError(f"loading the queue failed: confirmed {load.confirmed} "
                                 f"of {retained}: {load.errors}")
        pair.wait("backup", pair.ready_to_take_over, ready_timeout, "ready to take over")
    finally:
        problems = []
        for role in ("backup", "primary"):
            server = pair.servers.get(role)
            if server is not None and server.alive():
                code = server.stop(timeout=stop_timeout)
                if code not in (0, None):
                    problems.append(f"the {role} exited with code {code}")
        problems += pair.stop()
    if problems:
        raise BenchError(f"preparing the journal: {problems}")
