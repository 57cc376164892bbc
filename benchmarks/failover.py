"""Failover time of a pair: kill -9 of the active .. the new active's first confirmed SEND.

Run from the repository root:

    .venv/bin/python benchmarks/failover.py                        # 0, 100k, 1M retained
    .venv/bin/python benchmarks/failover.py --retained 0,100000 --runs 20
    .venv/bin/python benchmarks/failover.py --retained 1000000 --runs 5 --setting fast
    .venv/bin/python benchmarks/failover.py --arbiter etcd --setting all --retained 0
    .venv/bin/python benchmarks/failover.py --policy database --retained 0,100000 --runs 5

For each number of retained messages (--retained, persistent, --size bytes each):

1. a journal is prepared once: a pair is started, the messages are sent to one queue
   through the active server (each confirmed by a RECEIPT, so on both servers' disks),
   and both servers are stopped; their data directories are the template;
2. every run copies the template into a fresh directory, starts the pair on it (witness,
   primary, backup) and waits until the primary is ACTIVE with an in-sync PASSIVE backup;
3. sends SIGKILL to the active server and, every --poll-ms, tries CONNECT plus one
   persistent SEND with a receipt on the other one: failover time is from just before
   the kill to that RECEIPT (time to the first CONNECTED is reported too);
4. checks the new active server holds every retained message (its /status), and on the
   first run of each size (--drain all: every run) consumes them all and checks each body.

Intervals (--setting): "defaults" is the configuration's defaults (heartbeat 500 ms,
activation 2000 ms; target below 3 s whatever is retained), "fast" 100 / 300 ms (target
below 1 s). --policy picks how the pair shares its data: "replication" (each server its
own journal, the backup fed by the active's record stream, a witness) or "shared-store"
(one journal in one directory, a lock; the backup replays it when it takes over; targets
below 3 s empty and below 10 s with 1,000,000 messages) or "database" (shared store on
PostgreSQL, below).

--policy database: a shared-store pair whose journal and lock (a lease of
--lease-timeout-ms: the activation interval, but at least 500 ms, the least the server
takes, so 500 with "fast") are in a PostgreSQL database ([store] url; the schema
pairmq_<group>). One throwaway PostgreSQL server (tests/support/postgres.py,
fsync on) runs for the whole benchmark. The template is a database: a pair loads the
messages into it and is stopped; every run is `CREATE DATABASE ... TEMPLATE` of it and a
fresh pair with empty local data directories (the active restores its local copy from
the database, the backup fills its own and reads it ahead). A run is killed once the
backup is PASSIVE and warm: its read-ahead has reached the active's appended seq, every
record of which the database committed (so a takeover reads only the lease, an empty
tail and the rest of its own copy). The backup's log gives each run's timeline after the
kill: lease taken, tail read, journal recovered, serving. Target: below 3 s (defaults)
whatever is retained.

--arbiter etcd (replication): the pair's arbiter is a local 3-member etcd cluster
(tests/support/etcd.py, started once; each run is a new pair with its own [ha] group)
instead of `pairmq witness`; --kill-etcd-leader kills etcd's leader at the same moment as
the active (restarted after the run); --etcd-heartbeat-ms / --etcd-election-ms tune etcd
itself (its defaults 100 / 1000 ms; a leader lost with the active costs an election).

Prints one JSON line per (setting, retained) with p50 and max (and every run's time). A
lost message, a failover that does not happen within --give-up seconds, or a server that
fails makes it say so on stderr and exit 1; a missed target only exits 3 with
--check-target.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import datetime  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any, Protocol  # noqa: E402

import psycopg  # noqa: E402
from tests.support.etcd import EtcdCluster  # noqa: E402
from tests.support.postgres import PostgresError, PostgresServer, quote_ident  # noqa: E402

from benchmarks.ha_replication import (  # noqa: E402
    BenchError,
    Pair,
    drain_queue,
    ha_state,
    is_serving,
    probe_send,
)
from benchmarks.loadgen import nearest_rank  # noqa: E402
from benchmarks.persistent import run_load  # noqa: E402
from benchmarks.progress import progress_bar  # noqa: E402

# name: (heartbeat_interval_ms, activation_interval_ms, target seconds)
SETTINGS: dict[str, tuple[int, int, float]] = {"defaults": (500, 2000, 3.0),
                                               "fast": (100, 300, 1.0)}
QUEUE = "/queue/failover.retained"
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
PORT_IN_NAME = re.compile(r"^(server-\w+)-\d+\.log")


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
        try:
            pair.start_pair(timeout=120)
            if retained:
                primary = pair.servers["primary"]
                load = run_load(primary.host, primary.port, 2, 0, retained, size=size,
                                destination=QUEUE, timeout=3600)
                if load.errors or load.confirmed != retained:
                    raise BenchError(f"loading the queue failed: confirmed {load.confirmed} "
                                     f"of {retained}: {load.errors}")
            pair.wait("backup", pair.ready_to_take_over, 120, "ready to take over")
        finally:
            # The backup first: stopping the active would not make it take over
            # (failover_on_shutdown is off), but it would leave it behind.
            problems = []
            for role in ("backup", "primary"):
                server = pair.servers.get(role)
                if server is not None and server.alive():
                    code = server.stop()
                    if code not in (0, None):
                        problems.append(f"the {role} exited with code {code}")
            problems += pair.stop()
        if problems:
            raise BenchError(f"preparing the journal: {problems}")
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
        try:
            pair.start_pair(timeout=120)
            if retained:
                primary = pair.servers["primary"]
                load = run_load(primary.host, primary.port, 2, 0, retained, size=size,
                                destination=QUEUE, timeout=3600)
                if load.errors or load.confirmed != retained:
                    raise BenchError(f"loading the queue failed: confirmed {load.confirmed} "
                                     f"of {retained}: {load.errors}")
            pair.wait("backup", pair.ready_to_take_over, 600, "ready to take over")
        finally:
            problems = []
            for role in ("backup", "primary"):  # the active last: it releases the lease
                server = pair.servers.get(role)
                if server is not None and server.alive():
                    code = server.stop(timeout=60)
                    if code not in (0, None):
                        problems.append(f"the {role} exited with code {code}")
            problems += pair.stop()
        if problems:
            raise BenchError(f"preparing the journal: {problems}")
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


# --policy name -> how to make its deployment (template directory, heartbeat and
# activation intervals in ms)
POLICIES: dict[str, Callable[..., Deployment]] = {
    **{name: partial(TwoServers, policy=name) for name in ("replication", "shared-store")},
    "database": DatabasePair}


def one_run(args: argparse.Namespace, deployment: Deployment, retained: int, run: int,
            label: str) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"pairmq-failover-{label}-{run}-",
                                    dir=args.workdir))
    record: dict[str, Any] = {"run": run}
    errors: list[str] = []
    try:
        deployment.start_run(workdir)
        # Ready once is not ready still: the active may append a record meanwhile (shared
        # store: the backup then reads it ahead within a heartbeat).
        ready_by = time.monotonic() + 10
        before = deployment.status_of_taker()
        while not deployment.ready(before) and time.monotonic() < ready_by:
            time.sleep(0.05)
            before = deployment.status_of_taker()
        if not deployment.ready(before):
            raise BenchError(f"before the kill the backup is {ha_state(before)}, not ready "
                             "to take over")
        assert before is not None
        host, port = deployment.taker()
        poll_s = args.poll_ms / 1000
        attempts = 0
        first_connected = None
        last_detail = ""
        t0 = time.monotonic()
        deployment.kill_active()
        give_up = t0 + args.give_up
        while True:
            attempt = time.monotonic()
            if attempt > give_up:
                raise BenchError(f"no confirmed SEND on the backup within {args.give_up:.0f}s "
                                 f"of the kill ({attempts} attempts; last: {last_detail})")
            attempts += 1
            probe = probe_send(host, port, "/queue/failover.probe",
                               timeout=max(0.1, min(5.0, give_up - attempt)))
            if probe.connected and first_connected is None:
                first_connected = probe.connected_at
            if probe.confirmed:
                failover_s = time.monotonic() - t0
                break
            last_detail = probe.detail
            time.sleep(max(0.0, attempt + poll_s - time.monotonic()))
        after = deployment.status_of_taker()
        record.update(
            failover_s=round(failover_s, 4),
            connect_s=round(first_connected - t0, 4) if first_connected else None,
            attempts=attempts,
            backup_state_after=ha_state(after),
            **deployment.timeline(),
        )
        if after:
            # Each activation of the backup opens an epoch: more than one means it became
            # active, stepped down and tried again before its SEND was confirmed. (A
            # shared-store backup that never served reports epoch 0: counted from the
            # active's, which it saw.)
            before_epoch = max(before["ha"]["epoch"],
                               before["ha"].get("peer", {}).get("epoch") or 0)
            record["activations"] = after["ha"]["epoch"] - before_epoch
            held = after.get("destinations", {}).get(QUEUE, {}).get("messages", 0)
            record["held_after"] = held
            if held != retained:
                errors.append(f"the new active holds {held} of {retained} messages")
        if not is_serving(after):
            errors.append(f"the backup confirmed a SEND but its state is {ha_state(after)}")
        if retained and (args.drain == "all" or (args.drain == "first" and run == 1)):
            drained = drain_queue(host, port, QUEUE, retained, size=args.size,
                                  timeout=max(60.0, retained / 5000))
            record.update(received=drained.unique, lost=drained.lost,
                          redelivered=drained.duplicated)
            errors += drained.errors
    except (BenchError, RuntimeError, TimeoutError, OSError) as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        errors += deployment.stop()
        record["log_problems"] = deployment.log_problems()
        record["errors"] = errors
        record["ok"] = not errors
        if errors or args.keep:
            record["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return record


def common_problems(runs: list[dict[str, Any]], limit: int = 20) -> dict[str, int]:
    """Log problems of all runs, without timestamps and ports, with how many runs had each."""
    counts: dict[str, int] = {}
    for r in runs:
        seen = {TIMESTAMP.sub("", PORT_IN_NAME.sub(r"\1.log", line))
                for line in r.get("log_problems", [])}
        for line in seen:
            counts[line] = counts.get(line, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:limit])


def target_s(policy: str, setting: str, retained: int) -> float:
    """Replication: the setting's target whatever is retained (the backup follows the
    journal). Shared store replays it: the same target empty, growing to 10 s (defaults)
    with 1,000,000 messages, in proportion between. Database: the setting's target
    whatever is retained (the backup reads the journal ahead; a takeover reads the tail)."""
    target = SETTINGS[setting][2]
    if policy == "shared-store":
        target += (10.0 - SETTINGS["defaults"][2]) * retained / 1_000_000
    return target


def describe_timeline(record: dict[str, Any]) -> str:
    """The takeover's steps of one run (database), for its line on stderr."""
    if "lease_taken_s" not in record:
        return ""
    steps = ", ".join(f"{key[:-2].replace('_', ' ')} {record[key]}" for key in
                      ("lease_expired_s", *(k for k, _ in TAKEOVER_STEPS)) if key in record)
    tail, recovery = record.get("tail_read"), record.get("recovery")
    return (f"; after the kill (s): {steps}"
            + (f"; tail read in {tail['took_s']} s (the copy: {tail['copy_records']} "
               f"records)" if isinstance(tail, dict) else f"; {tail}" if tail else "")
            + (f"; recovery {recovery['records']} records ({recovery['read_ahead']} read "
               f"ahead) in {recovery['took_s']} s" if recovery else ""))


def timeline_p50(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over the runs of each step of the takeover (seconds after the kill), of
    the database copy's time, of the tail read's and of the recovery's."""
    keys = ["database_copy_s", "lease_expired_s", *(key for key, _ in TAKEOVER_STEPS)]
    found: dict[str, Any] = {k: nearest_rank([r[k] for r in runs if k in r], 0.5)
                             for k in keys}
    found["tail_read_took_s"] = nearest_rank(
        [r["tail_read"]["took_s"] for r in runs if isinstance(r.get("tail_read"), dict)], 0.5)
    found["recovery_took_s"] = nearest_rank(
        [r["recovery"]["took_s"] for r in runs if "recovery" in r], 0.5)
    return found


def run_case(args: argparse.Namespace, setting: str, retained: int) -> dict[str, Any]:
    heartbeat_ms, activation_ms, _ = SETTINGS[setting]
    target = target_s(args.policy, setting, retained)
    started = time.monotonic()
    template = Path(tempfile.mkdtemp(prefix=f"pairmq-failover-template-{retained}-",
                                     dir=args.workdir))
    options: dict[str, Any] = (
        {"postgres": args.postgres} if args.policy == "database" else
        {"etcd": args.etcd_cluster, "kill_etcd_leader": args.kill_etcd_leader})
    deployment = POLICIES[args.policy](template, heartbeat_ms, activation_ms, **options)
    label = f"{setting}-{retained}"
    runs: list[dict[str, Any]] = []
    setup_errors: list[str] = []
    try:
        try:
            deployment.prepare(retained, args.size)
        except (BenchError, RuntimeError, TimeoutError, OSError) as e:
            setup_errors.append(f"preparing {retained} messages: {type(e).__name__}: {e}")
            args = argparse.Namespace(**{**vars(args), "runs": 0})
        prepared_s = time.monotonic() - started
        print(f"{label}: journal prepared in {prepared_s:.0f} s", file=sys.stderr, flush=True)
        with progress_bar(f"{label}: failovers", args.runs) as advance_to:
            for run in range(1, args.runs + 1):
                record = one_run(args, deployment, retained, run, label)
                runs.append(record)
                advance_to(run)
                print(f"{label} run {run}: failover {record.get('failover_s')} s, connect "
                      f"{record.get('connect_s')} s, {record.get('activations')} "
                      f"activation(s), {record.get('held_after')} of {retained} held"
                      + describe_timeline(record)
                      + ("" if record["ok"] else f" FAILED {record['errors']}"),
                      file=sys.stderr, flush=True)
    finally:
        try:
            deployment.close()
        finally:
            if not args.keep:
                shutil.rmtree(template, ignore_errors=True)
    times = [r["failover_s"] for r in runs if r.get("failover_s") is not None]
    connects = [r["connect_s"] for r in runs if r.get("connect_s") is not None]
    errors = setup_errors + [f"run {r['run']}: {e}" for r in runs for e in r["errors"]]
    worst = max(times) if times else None
    return {
        "benchmark": "failover",
        "policy": args.policy,
        "arbiter": args.arbiter + (" (its leader killed with the active)"
                                   if args.kill_etcd_leader else ""),
        "etcd_heartbeat_election_ms": ([args.etcd_heartbeat_ms, args.etcd_election_ms]
                                       if args.arbiter == "etcd" else None),
        "setting": setting,
        "heartbeat_interval_ms": heartbeat_ms,
        "activation_interval_ms": activation_ms,
        **({"lease_timeout_ms": DatabasePair.lease_ms(activation_ms)}
           if args.policy == "database" else {}),
        "retained": retained,
        "size": args.size,
        "runs": args.runs,
        "measured": len(times),
        "p50_s": nearest_rank(times, 0.5),
        "p90_s": nearest_rank(times, 0.9),
        "max_s": worst,
        "min_s": min(times) if times else None,
        "mean_s": round(statistics.fmean(times), 4) if times else None,
        "connect_p50_s": nearest_rank(connects, 0.5),
        "connect_max_s": max(connects) if connects else None,
        "target_s": target,
        "target_met": worst is not None and worst < target and len(times) == args.runs,
        "activations_max": max((r.get("activations", 0) for r in runs), default=None),
        "drained": [r["run"] for r in runs if "received" in r],
        "lost": sum(r.get("lost", 0) for r in runs),
        "poll_ms": args.poll_ms,
        "failover_s_runs": times,
        **({"timeline_p50": timeline_p50(runs)} if args.policy == "database" else {}),
        "log_problems": common_problems(runs),
        "wall_s": round(time.monotonic() - started, 1),
        "ok": not errors and len(runs) == args.runs,
        "errors": errors,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", choices=list(POLICIES), default="replication")
    ap.add_argument("--arbiter", choices=["witness", "etcd"], default="witness",
                    help="replication: `pairmq witness`, or a local 3-member etcd cluster")
    ap.add_argument("--kill-etcd-leader", action="store_true",
                    help="--arbiter etcd: kill the etcd leader at the same moment as the active "
                         "(restarted after each run)")
    ap.add_argument("--etcd-heartbeat-ms", type=int, default=100,
                    help="--arbiter etcd: etcd's --heartbeat-interval (its default: 100)")
    ap.add_argument("--etcd-election-ms", type=int, default=1000,
                    help="--arbiter etcd: etcd's --election-timeout (its default: 1000)")
    ap.add_argument("--runs", type=int, default=20, help="failovers per case")
    ap.add_argument("--setting", choices=[*SETTINGS, "all"], default="defaults")
    ap.add_argument("--retained", default="0,100000,1000000",
                    help="comma-separated numbers of messages in the queue at the kill")
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--drain", choices=["first", "all", "none"], default="first",
                    help="which runs consume and check every retained message afterwards")
    ap.add_argument("--poll-ms", type=float, default=5.0, help="between attempts on the backup")
    ap.add_argument("--give-up", type=float, default=60.0,
                    help="seconds after the kill without a confirmed SEND that fail the run")
    ap.add_argument("--workdir", default=None, help="where data directories go (default: tmp)")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    ap.add_argument("--check-target", action="store_true",
                    help="exit 3 when the slowest failover of a case misses its target")
    args = ap.parse_args(argv)
    try:
        args.retained = [int(n) for n in args.retained.split(",")]
    except ValueError:
        ap.error(f"--retained takes comma-separated integers, got {args.retained!r}")
    if args.kill_etcd_leader and args.arbiter != "etcd":
        ap.error("--kill-etcd-leader needs --arbiter etcd")
    if args.policy == "database" and args.arbiter != "witness":
        ap.error("--policy database has no arbiter: the database's lease decides")
    if args.runs < 1 or args.poll_ms < 0 or args.give_up <= 0 or min(args.retained) < 0:
        ap.error("--runs and --give-up must be positive, --retained not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(SETTINGS) if args.setting == "all" else [args.setting]
    with ExitStack() as stack:
        args.etcd_cluster = None
        args.postgres = None
        if args.policy == "database":
            # one server for the whole run; shared_buffers at PostgreSQL's default (the test
            # fixture's 32 MB is for many clusters at once), fsync on
            args.postgres = stack.enter_context(
                PostgresServer(settings={"shared_buffers": "128MB"}))
        if args.arbiter == "etcd":
            etcd_dir = Path(tempfile.mkdtemp(prefix="pairmq-failover-etcd-", dir=args.workdir))
            args.etcd_cluster = stack.enter_context(EtcdCluster(
                etcd_dir, heartbeat_ms=args.etcd_heartbeat_ms, election_ms=args.etcd_election_ms))
            stack.callback(shutil.rmtree, etcd_dir, ignore_errors=True)
        return _cases(args, names)


def _cases(args: argparse.Namespace, names: list[str]) -> int:
    failed = missed = False
    try:
        for name in names:
            for retained in args.retained:
                record = run_case(args, name, retained)
                print(json.dumps(record), flush=True)
                missed = missed or not record["target_met"]
                if not record["ok"]:
                    failed = True
                    for err in record["errors"]:
                        print(f"FAILED {name} {retained}: {err}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if failed:
        return 1
    return 3 if missed and args.check_target else 0


if __name__ == "__main__":
    sys.exit(main())
