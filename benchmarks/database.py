"""The journal in PostgreSQL ([store] url) against the file journal: durable throughput, the
CPU it costs, and the memory of a server holding a large backlog before and after a crash.

Run from the repository root (serialised with other benchmarks on this machine by flock):

    flock /tmp/pairmq-bench.lock .venv/bin/python benchmarks/database.py --rounds 3
    flock /tmp/pairmq-bench.lock .venv/bin/python benchmarks/database.py --rounds 1 \\
        --backlog 1000000 --skip-throughput
    .venv/bin/python benchmarks/database.py --rounds 5 --messages 40000 --json /tmp/db.json
    .venv/bin/python benchmarks/database.py --rounds 1 --scenarios 1p1c --keep   # logs kept

One throwaway PostgreSQL cluster (tests/support/postgres.py: initdb on loopback, fsync
and synchronous_commit on, its defaults otherwise) runs for the whole benchmark. Every
pairmq server is a fresh standalone one (fresh data directory) with the file journal
(`file`) or with its journal in a fresh database of that cluster (`database`: `--url`
on a database made by CREATE DATABASE for that run alone, `--group bench`, so the schema
`pairmq_bench`, the lease at its default length). Each server has a management port,
whose /status is read once its run is over.

Throughput (skipped with --skip-throughput): per round, per scenario, one run of each
store, which goes first alternating from round to round (the machine is a shared 2-core
box: the drift of the round falls on both). A run is a discarded warm-up of --warm-up
messages on its own queue, then the load of benchmarks/persistent.py's `run_load` (the
other benchmarks' "durable with receipts"): --messages persistent messages of --size
bytes on one queue, each producer process keeping up to --window SENDs with a receipt
in flight (a RECEIPT only once the record is on disk, and with `database` only once the
database's COMMIT returned), each consumer process ACKing every message
(ack:client-individual, prefetch-count --prefetch).

- 1p1c: 1 producer, 1 consumer;  4p4c: 4 producers, 4 consumers competing.

Per run: msgs/s (first SEND .. last ACK), the pairmq server's CPU seconds per message
(all its threads) and PostgreSQL's (the postmaster and every process of the cluster: the
backends of the copy and the lease, the WAL writer, the checkpointer), receipt latency
p50/p99, records per database transaction (the copy's groups, from /status). Printed:
the medians per store, then the median of the per-round ratios database/file (the
project's goal: database msgs/s at least 0.5x file's), each round's ratio beside it.

Backlog (--backlog N, 0 = skipped; run once per store, file first): N persistent
messages of --size bytes sent to one queue nobody consumes (`run_load` with no consumer,
--backlog-producers producers), then the server's RSS (psutil) once they are all
confirmed and the queue depth /status reports; then kill -9 and the same server started
again on the same data directory (and database): seconds until it listens and until it
confirms a persistent SEND, its RSS then and --settle seconds later, the peak RSS while
it loaded and while it restarted, and the queue's depth after the restart (it must be
N). The goal: RSS with the database journal as with the file journal (the local copy of
the journal pages bodies out as the file journal does).

Every run's warnings, errors and tracebacks in the pairmq server's log (pairmq.store's
about the database among them) and PostgreSQL's warnings, errors and checkpoint
complaints are printed at the end and kept in the JSON (--json PATH: the whole result,
one object). A lost or duplicated message, an ERROR frame, a stall or a dead server
makes the run fail: said on stderr, exit status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import ServerProcess, free_port, start_server  # noqa: E402
from tests.support.admin import admin_status, admin_user_flags  # noqa: E402
from tests.support.postgres import PostgresServer  # noqa: E402

from benchmarks.backlog import wait_confirmed  # noqa: E402
from benchmarks.persistent import run_load, server_log_problems  # noqa: E402

STORES = ("file", "database")
SCENARIOS: dict[str, tuple[int, int]] = {"1p1c": (1, 1), "4p4c": (4, 4)}
GROUP = "bench"  # the database's schema: pairmq_bench
SEGMENT_BYTES = str(64 << 20)
GOAL_RATE_RATIO = 0.5  # database msgs/s over file msgs/s, the project's goal
# PostgreSQL's log: what says something of the run (warnings, errors, checkpoints too close)
PG_LOG_PROBLEMS = re.compile(r"\b(WARNING|ERROR|FATAL|PANIC):|checkpoints are occurring")
MB = 1 << 20
# Said by every server here (the benchmark's clients are anonymous), and by PostgreSQL to
# pg_isready while it starts: not worth reporting
EXPECTED_LOG_LINES = re.compile(r"No \[security\] rules|the database system is starting up")
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


class BenchFailed(Exception):
    """A run that measured nothing valid (lost messages, a dead server, a wrong depth)."""


# --------------------------------------------------------------------------- measuring


def pg_cpu(pg: PostgresServer) -> float | None:
    """CPU seconds of the PostgreSQL cluster so far: the postmaster, the children it reaped
    (backends that ended) and the ones that run."""
    if pg.pid is None:
        return None
    try:
        post = psutil.Process(pg.pid)
        t = post.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        children = post.children()
    except psutil.Error:
        return None
    for child in children:
        try:
            c = child.cpu_times()
        except psutil.Error:  # ended meanwhile: in children_* from now on
            continue
        total += c.user + c.system
    return total


def rss(pid: int) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


def rss_parts(pid: int) -> dict[str, float | None]:
    """The RSS's anonymous part (the heap: what paging is about) and its file-backed part
    (mapped files, which the kernel may drop), in MB, from /proc/PID/status."""
    parts: dict[str, float | None] = {"anon_mb": None, "file_mb": None}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return parts
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssFile"):
            parts[f"{name[3:].lower()}_mb"] = round(int(value.split()[0]) / 1024, 1)
    return parts


def mb(n: int | None) -> float | None:
    return None if n is None else round(n / MB, 1)


class PeakRss(threading.Thread):
    """The highest RSS of this process's children whose command line holds `needle` (a
    server's `--name`, which a restarted server keeps), sampled every `interval` s."""

    def __init__(self, needle: str, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.needle = needle
        self.interval = interval
        self.peak = 0
        self._halt = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._halt.wait(self.interval):
            try:
                children = me.children()
            except psutil.Error:
                continue
            for child in children:
                try:
                    if self.needle in child.cmdline():
                        self.peak = max(self.peak, child.memory_info().rss)
                except psutil.Error:
                    continue

    def reset(self) -> None:
        self.peak = 0

    def stop(self) -> int:
        self._halt.set()
        self.join(5)
        return self.peak


# --------------------------------------------------------------------------- servers


class Bench:
    """The PostgreSQL cluster of the whole benchmark, the scratch directory, and the
    pairmq servers started on them (one data directory, and one database, per run)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch = Path(tempfile.mkdtemp(prefix="pairmq-database-bench-", dir=args.workdir))
        self.pg = PostgresServer()
        self.pg.start()
        self.pg_version = self.pg.sql("SHOW server_version").strip()
        self.pg_log_offset = 0
        self.runs = 0
        self.pg_problems: list[str] = []  # PostgreSQL's, as they come (with the run's name)
        self.server_problems: list[str] = []  # pairmq's, every run's, prefixed by the run

    def flags(self, store: str, label: str) -> tuple[list[str], str | None]:
        """A fresh server's flags, and its database (None: the file journal)."""
        flags = ["--segment-bytes", SEGMENT_BYTES, "--log-level", "info"]
        if store == "file":
            return flags, None
        name = f"{label.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
        url = self.pg.create_database(name)
        return [*flags, "--url", url, "--group", GROUP], name

    def start(self, store: str, label: str, flags: list[str], workdir: Path,
              start_timeout: float = 60.0) -> tuple[ServerProcess, str]:
        admin = f"127.0.0.1:{free_port()}"
        server = start_server(workdir, *flags, "--admin", admin, *admin_user_flags(),
                              name=label, start_timeout=start_timeout)
        return server, admin

    def take_logs(self, label: str, server: ServerProcess | None) -> list[str]:
        """The run's server log problems and PostgreSQL's since the last call, kept."""
        found = [line for line in (server_log_problems(server, limit=40)
                                   if server is not None else [])
                 if not EXPECTED_LOG_LINES.search(line)]
        self.server_problems += [f"{label}: {line}" for line in found]
        try:
            with open(self.pg.log_path, "rb") as log:
                log.seek(self.pg_log_offset)
                text = log.read()
                self.pg_log_offset += len(text)
        except OSError:
            text = b""
        pg = [line for line in text.decode(errors="replace").splitlines()
              if PG_LOG_PROBLEMS.search(line) and not EXPECTED_LOG_LINES.search(line)]
        self.pg_problems += [f"{label}: {line}" for line in pg]
        return found

    def drop(self, database: str | None) -> None:
        if database is not None:
            try:
                self.pg.drop_database(database)
            except Exception as e:  # only the disk space is at stake
                print(f"could not drop database {database}: {e}", file=sys.stderr)

    def close(self) -> None:
        self.pg.close()
        if not self.args.keep:
            shutil.rmtree(self.scratch, ignore_errors=True)


def database_status(admin: str) -> dict[str, Any]:
    status = admin_status(admin, 5.0) or {}
    return status.get("journal", {}).get("database") or {}


def queue_depth(admin: str, queue: str) -> int | None:
    status = admin_status(admin, 30.0) or {}
    found = status.get("destinations", {}).get(queue)
    return None if found is None else found.get("messages")


def stop_server(server: ServerProcess, errors: list[str]) -> None:
    code = server.stop(30.0)
    if code not in (0, None):
        errors.append(f"server exited with code {code}")


# --------------------------------------------------------------------------- throughput


def throughput_run(bench: Bench, store: str, scenario: str, rnd: int) -> dict[str, Any]:
    """One fresh server (and database) of `store`: a warm-up, then the measured load."""
    args = bench.args
    producers, consumers = SCENARIOS[scenario]
    bench.runs += 1
    label = f"r{rnd}-{scenario}-{store}"
    workdir = bench.scratch / label
    flags, database = bench.flags(store, f"r{rnd}_{scenario}")
    server, admin = bench.start(store, label, flags, workdir)
    record: dict[str, Any] = {"round": rnd, "scenario": scenario, "store": store,
                              "producers": producers, "consumers": consumers,
                              "messages": args.messages, "size": args.size}
    errors: list[str] = []
    try:
        proc = psutil.Process(server.proc.pid)
        if args.warm_up:
            warm = run_load(server.host, server.port, 1, 1, args.warm_up, size=args.size,
                            window=args.window, prefetch=args.prefetch, server=proc,
                            timeout=args.timeout)
            if warm.errors:
                raise BenchFailed(f"{label}: warm-up failed: {warm.errors[:3]}")
        before = database_status(admin)
        pg0 = pg_cpu(bench.pg)
        res = run_load(server.host, server.port, producers, consumers, args.messages,
                       size=args.size, window=args.window, prefetch=args.prefetch,
                       server=proc, timeout=args.timeout)
        pg1 = pg_cpu(bench.pg)
        after = database_status(admin)
        errors += res.errors
        if not server.alive():
            errors.append("the server process died")
        n = res.received or args.messages
        pg_s = None if pg0 is None or pg1 is None else round(pg1 - pg0, 3)
        groups = (after.get("groups", 0) - before.get("groups", 0)) if after else None
        records = (after.get("committed_seq", 0) - before.get("committed_seq", 0)) \
            if after else None
        record.update(
            msgs_per_s=res.msgs_per_s, seconds=res.seconds,
            server_cpu_s=res.server_cpu_s,
            server_cpu_us_per_msg=(round(res.server_cpu_s / n * 1e6, 1)
                                   if res.server_cpu_s is not None else None),
            server_loop_cpu_s=res.server_loop_cpu_s,
            postgres_cpu_s=pg_s,
            postgres_cpu_us_per_msg=round(pg_s / n * 1e6, 1) if pg_s is not None else None,
            receipt_p50_ms=res.receipt_p50_ms, receipt_p99_ms=res.receipt_p99_ms,
            receipt_max_ms=res.receipt_max_ms, e2e_p50_ms=res.e2e_p50_ms,
            e2e_p99_ms=res.e2e_p99_ms, loadgen_cpu_s=round(res.loadgen_cpu_s, 3),
            other_cpu_s=res.other_cpu_s, received=res.received, lost=res.lost,
            duplicated=res.duplicated,
            database_groups=groups, database_records=records,
            records_per_group=(round(records / groups, 1) if groups else None),
            sends_per_group=(round(args.messages / groups, 1) if groups else None),
            database_copy=after.get("copy") if after else None,
            server_rss_mb=mb(rss(server.proc.pid)), database=database)
    finally:
        stop_server(server, errors)
        record["server_log_problems"] = bench.take_logs(label, server)
        bench.drop(database)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            record["workdir"] = str(workdir)
    record["ok"] = not errors
    record["errors"] = errors
    return record


def throughput(bench: Bench) -> list[dict[str, Any]]:
    args = bench.args
    runs: list[dict[str, Any]] = []
    for rnd in range(1, args.rounds + 1):
        order = STORES if rnd % 2 else STORES[::-1]
        for scenario in args.scenarios:
            for store in order:
                try:
                    r = throughput_run(bench, store, scenario, rnd)
                except (BenchFailed, RuntimeError, TimeoutError) as e:
                    r = {"round": rnd, "scenario": scenario, "store": store, "ok": False,
                         "errors": [str(e)]}
                runs.append(r)
                if r["ok"]:
                    print(f"round {rnd} {scenario} {store:8} {r['msgs_per_s']:8.0f} msgs/s "
                          f"server {r['server_cpu_us_per_msg']:6.1f} µs/msg  postgres "
                          f"{r['postgres_cpu_us_per_msg'] or 0:6.1f} µs/msg  receipt p50 "
                          f"{r['receipt_p50_ms']} ms p99 {r['receipt_p99_ms']} ms"
                          + (f"  {r['records_per_group']} records, {r['sends_per_group']} "
                             "SENDs per transaction" if r.get("records_per_group") else ""),
                          flush=True)
                else:
                    print(f"round {rnd} {scenario} {store:8} FAILED: {r['errors'][:3]}",
                          file=sys.stderr, flush=True)
    return runs


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def summarise(runs: list[dict[str, Any]], scenarios: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for scenario in scenarios:
        by_store = {store: {r["round"]: r for r in runs
                            if r["scenario"] == scenario and r["store"] == store and r["ok"]}
                    for store in STORES}
        entry: dict[str, Any] = {}
        for store, rs in by_store.items():
            entry[store] = {
                "rounds": len(rs),
                "msgs_per_s": median([r["msgs_per_s"] for r in rs.values()]),
                "server_cpu_us_per_msg": median([r["server_cpu_us_per_msg"]
                                                 for r in rs.values()]),
                "postgres_cpu_us_per_msg": median([r["postgres_cpu_us_per_msg"]
                                                   for r in rs.values()]),
                "receipt_p50_ms": median([r["receipt_p50_ms"] for r in rs.values()]),
                "receipt_p99_ms": median([r["receipt_p99_ms"] for r in rs.values()]),
                "records_per_group": median([r.get("records_per_group")
                                             for r in rs.values()]),
                "sends_per_group": median([r.get("sends_per_group") for r in rs.values()]),
            }
        both = sorted(set(by_store["file"]) & set(by_store["database"]))
        f, d = by_store["file"], by_store["database"]
        rate = [d[k]["msgs_per_s"] / f[k]["msgs_per_s"] for k in both]
        cpu = [d[k]["server_cpu_us_per_msg"] / f[k]["server_cpu_us_per_msg"] for k in both]
        # the whole cost of a message with the database: pairmq's CPU and PostgreSQL's
        total = [(d[k]["server_cpu_us_per_msg"] + (d[k]["postgres_cpu_us_per_msg"] or 0))
                 / (f[k]["server_cpu_us_per_msg"] + (f[k]["postgres_cpu_us_per_msg"] or 0))
                 for k in both]
        entry["ratio"] = {
            "rounds": len(both),
            "msgs_per_s": median(rate),
            "server_cpu_per_msg": median(cpu),
            "server_and_postgres_cpu_per_msg": median(total),
            "msgs_per_s_per_round": [round(x, 3) for x in rate],
            "server_cpu_per_msg_per_round": [round(x, 3) for x in cpu],
            "goal_msgs_per_s_ratio": GOAL_RATE_RATIO,
            "goal_met": (median(rate) or 0) >= GOAL_RATE_RATIO if rate else None,
        }
        summary[scenario] = entry
    return summary


def print_throughput(summary: dict[str, Any]) -> None:
    print(f"\n{'scenario':8} {'store':>9} {'msgs/s':>8} {'server µs/msg':>14} "
          f"{'postgres µs/msg':>16} {'receipt p50/p99 ms':>19} {'records/txn':>12} "
          f"{'SENDs/txn':>10}")
    for scenario, entry in summary.items():
        for store in STORES:
            s = entry[store]
            if not s["rounds"]:
                print(f"{scenario:8} {store:>9}  (no successful run)")
                continue
            print(f"{scenario:8} {store:>9} {s['msgs_per_s']:8.0f} "
                  f"{s['server_cpu_us_per_msg']:14.1f} {s['postgres_cpu_us_per_msg'] or 0:16.1f} "
                  f"{s['receipt_p50_ms']:>9}/{s['receipt_p99_ms']:<9} "
                  f"{s['records_per_group'] or '':>12} {s['sends_per_group'] or '':>10}")
        r = entry["ratio"]
        if not r["rounds"]:
            continue
        print(f"{scenario:8} {'db/file':>9} {r['msgs_per_s']:8.3f} "
              f"{r['server_cpu_per_msg']:14.3f} {'':16} "
              f"median of {r['rounds']} rounds; pairmq+PostgreSQL CPU/msg "
              f"{r['server_and_postgres_cpu_per_msg']:.3f}")
        rates = " ".join(f"{x:.3f}" for x in r["msgs_per_s_per_round"])
        cpus = " ".join(f"{x:.3f}" for x in r["server_cpu_per_msg_per_round"])
        print(f"{'':8} {'':>9} rate per round {rates}; server CPU/msg per round {cpus}; goal rate "
              f">= {GOAL_RATE_RATIO}: {'met' if r['goal_met'] else 'NOT met'}")


# --------------------------------------------------------------------------- backlog


def backlog_run(bench: Bench, store: str) -> dict[str, Any]:
    """Load the backlog, note the RSS, kill -9, start again: times and RSS."""
    args = bench.args
    label = f"backlog-{store}"
    workdir = bench.scratch / label
    flags, database = bench.flags(store, "backlog")
    server, admin = bench.start(store, label, flags, workdir)
    queue = f"/queue/backlog.{uuid.uuid4().hex[:8]}"
    record: dict[str, Any] = {"store": store, "messages": args.backlog, "size": args.size,
                              "producers": args.backlog_producers}
    errors: list[str] = []
    peak = PeakRss(label)
    peak.start()
    restarted: ServerProcess | None = None
    try:
        record["rss_empty_mb"] = mb(rss(server.proc.pid))
        res = run_load(server.host, server.port, args.backlog_producers, 0, args.backlog,
                       size=args.size, window=args.window, destination=queue,
                       server=psutil.Process(server.proc.pid), timeout=args.backlog_timeout,
                       idle_timeout=120.0)
        if res.errors:
            raise BenchFailed(f"{label}: loading failed: {res.errors[:3]}")
        record.update(load_msgs_per_s=res.msgs_per_s, load_seconds=res.seconds,
                      load_server_cpu_us_per_msg=round(res.server_cpu_s / args.backlog * 1e6, 1)
                      if res.server_cpu_s else None,
                      load_receipt_p99_ms=res.receipt_p99_ms)
        time.sleep(args.settle)
        record["rss_loaded_mb"] = mb(rss(server.proc.pid))
        record["rss_loaded_parts"] = rss_parts(server.proc.pid)
        record["peak_rss_loading_mb"] = mb(peak.peak)
        status = admin_status(admin, 30.0) or {}
        depth = status.get("destinations", {}).get(queue, {})
        record["depth_loaded"] = depth.get("messages")
        record["paged_messages_loaded"] = depth.get("paged_messages")
        record["memory_bytes_loaded_mb"] = mb(depth.get("memory_bytes"))
        record["database_loaded"] = status.get("journal", {}).get("database")
        server.kill()
        # the restart writes the same log file anew: what the first life said, kept first
        first_life = bench.take_logs(f"{label} (loading)", server)
        shutil.copy(server.log_path, server.log_path.with_suffix(".first.log"))
        record["server_log_problems_loading"] = first_life
        peak.reset()
        started = time.monotonic()
        restarted = server.start_again(*flags, "--admin", admin, *admin_user_flags(),
                                       start_timeout=args.backlog_timeout)
        record["restart_listening_s"] = round(time.monotonic() - started, 2)
        wait_confirmed(restarted.host, restarted.port, args.backlog_timeout)
        record["restart_ready_s"] = round(time.monotonic() - started, 2)
        record["rss_restarted_mb"] = mb(rss(restarted.proc.pid))
        time.sleep(args.settle)
        record[f"rss_restarted_{args.settle:g}s_later_mb"] = mb(rss(restarted.proc.pid))
        record["rss_restarted_parts"] = rss_parts(restarted.proc.pid)
        record["peak_rss_restart_mb"] = mb(peak.peak)
        depth_after = queue_depth(admin, queue)
        record["depth_restarted"] = depth_after
        record["restart_log"] = restarted.log_lines("Recovered") \
            + restarted.log_lines("Journal restored") + restarted.log_lines("lease held by")
        record["restart_lease_wait_s"] = lease_wait_s(restarted)
        if depth_after != args.backlog:
            errors.append(f"{depth_after} messages waiting after the restart, not "
                          f"{args.backlog}")
        if not restarted.alive():
            errors.append("the restarted server died")
    except (BenchFailed, RuntimeError, TimeoutError) as e:
        errors.append(str(e))
    finally:
        peak.stop()
        for s in (server, restarted):
            if s is not None and s.alive():
                stop_server(s, errors)
        record["server_log_problems"] = bench.take_logs(
            f"{label} (restarted)" if restarted is not None else label, restarted or server)
        bench.drop(database)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            record["workdir"] = str(workdir)
    record["ok"] = not errors
    record["errors"] = errors
    return record


def lease_wait_s(server: ServerProcess) -> float | None:
    """From the server's first log line to `Database lease taken` (None: no such line): the
    lease a killed server left behind runs out first."""
    times = []
    for line in server.logs().splitlines():
        found = LOG_TIME.match(line)
        if found and (not times or "Database lease taken" in line):
            times.append(time.mktime(time.strptime(found[1][:19], "%Y-%m-%d %H:%M:%S"))
                         + int(found[1][20:]) / 1000)
            if len(times) == 2:
                return round(times[1] - times[0], 2)
    return None


BACKLOG_COLUMNS = [
    ("load msgs/s", "load_msgs_per_s", "{:.0f}"),
    ("RSS empty MB", "rss_empty_mb", "{}"),
    ("peak RSS loading MB", "peak_rss_loading_mb", "{}"),
    ("RSS loaded MB", "rss_loaded_mb", "{}"),
    ("  of which anonymous MB", ("rss_loaded_parts", "anon_mb"), "{}"),
    ("restart: listening s", "restart_listening_s", "{}"),
    ("restart: ready s", "restart_ready_s", "{}"),
    ("  of which lease wait s", "restart_lease_wait_s", "{}"),
    ("peak RSS restart MB", "peak_rss_restart_mb", "{}"),
    ("RSS restarted MB", "rss_restarted_mb", "{}"),
    ("depth after restart", "depth_restarted", "{}"),
]


def print_backlog(records: list[dict[str, Any]], settle: float) -> None:
    later = f"rss_restarted_{settle:g}s_later_mb"
    columns = [*BACKLOG_COLUMNS[:-1], (f"RSS restarted +{settle:g}s MB", later, "{}"),
               ("  of which anonymous MB", ("rss_restarted_parts", "anon_mb"), "{}"),
               BACKLOG_COLUMNS[-1]]
    width = max(len(c[0]) for c in columns)
    print(f"\n{'backlog':{width}} " + " ".join(f"{r['store']:>12}" for r in records)
          + f" {'db/file':>8}")
    by = {r["store"]: r for r in records}
    def value(r: dict[str, Any], key: str | tuple[str, str]) -> Any:
        if isinstance(key, tuple):
            return (r.get(key[0]) or {}).get(key[1])
        return r.get(key)

    for title, key, fmt in columns:
        cells = []
        for r in records:
            v = value(r, key)
            cells.append(f"{fmt.format(v) if v is not None else '-':>12}")
        ratio = ""
        f, d = value(by.get("file", {}), key), value(by.get("database", {}), key)
        if isinstance(f, int | float) and isinstance(d, int | float) and f \
                and key != "depth_restarted":
            ratio = f"{d / f:8.2f}"
        print(f"{title:{width}} " + " ".join(cells) + f" {ratio:>8}")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="1p1c,4p4c",
                    help=f"comma-separated, of {', '.join(SCENARIOS)}")
    ap.add_argument("--messages", type=int, default=20_000, help="per run, all producers")
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--window", type=int, default=100, help="receipts in flight per producer")
    ap.add_argument("--prefetch", type=int, default=1000, help="prefetch-count per consumer")
    ap.add_argument("--warm-up", type=int, default=2000,
                    help="messages of a discarded 1p1c run before each measured one")
    ap.add_argument("--timeout", type=float, default=600.0, help="cap on one run, seconds")
    ap.add_argument("--skip-throughput", action="store_true",
                    help="only the backlog part (with --backlog)")
    ap.add_argument("--backlog", type=int, default=0,
                    help="messages of the backlog part (0: skipped)")
    ap.add_argument("--backlog-producers", type=int, default=4)
    ap.add_argument("--backlog-timeout", type=float, default=3600.0,
                    help="cap on loading the backlog, and on the restart, seconds")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds between the load (or the restart) and the RSS read")
    ap.add_argument("--json", default=None, help="write the whole result to this file")
    ap.add_argument("--workdir", default=None, help="where data directories go (default tmp)")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    args = ap.parse_args(argv)
    args.scenarios = args.scenarios.split(",")
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(sorted(unknown))}")
    if args.messages < 1 or args.rounds < 1 or args.window < 1 or args.prefetch < 1:
        ap.error("--messages, --rounds, --window and --prefetch must be positive")
    if args.skip_throughput and not args.backlog:
        ap.error("--skip-throughput leaves nothing to run without --backlog N")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    result: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "workdir")},
        "postgres_version": bench.pg_version, "host_cpus": psutil.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    failed = False
    try:
        print(f"PostgreSQL {bench.pg_version} on port {bench.pg.port} ({bench.pg.workdir})",
              flush=True)
        if not args.skip_throughput:
            runs = throughput(bench)
            result["runs"] = runs
            result["summary"] = summarise(runs, args.scenarios)
            failed |= not all(r["ok"] for r in runs)
        if args.backlog:
            backlog = []
            for store in STORES:
                r = backlog_run(bench, store)
                backlog.append(r)
                print(json.dumps({k: v for k, v in r.items()
                                  if k not in ("server_log_problems", "database_loaded")}),
                      flush=True)
                if not r["ok"]:
                    failed = True
                    print(f"FAILED backlog {store}: {r['errors'][:3]}", file=sys.stderr)
            result["backlog"] = backlog
    finally:
        bench.take_logs("end", None)
        result["server_log_problems"] = bench.server_problems
        result["postgres_log_problems"] = bench.pg_problems
        bench.close()
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if "summary" in result:
        print_throughput(result["summary"])
    if "backlog" in result:
        print_backlog(result["backlog"], args.settle)
    for title, lines in (("pairmq server logs", bench.server_problems),
                         ("PostgreSQL log", bench.pg_problems)):
        print(f"\n{title}: " + ("nothing to report" if not lines else f"{len(lines)} lines"))
        for line in lines[:40]:
            print(f"  {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
