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
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

from tests.support.etcd import EtcdCluster  # noqa: E402
from tests.support.postgres import PostgresServer  # noqa: E402

from benchmarks.failover_deployments import (  # noqa: E402
    QUEUE,
    TAKEOVER_STEPS,
    DatabasePair,
    Deployment,
    TwoServers,
)
from benchmarks.ha_replication import (  # noqa: E402
    BenchError,
    drain_queue,
    ha_state,
    is_serving,
    probe_send,
)
from benchmarks.loadgen import nearest_rank  # noqa: E402
from benchmarks.progress import progress_bar  # noqa: E402

# name: (heartbeat_interval_ms, activation_interval_ms, target seconds)
SETTINGS: dict[str, tuple[int, int, float]] = {"defaults": (500, 2000, 3.0),
                                               "fast": (100, 300, 1.0)}
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
PORT_IN_NAME = re.compile(r"^(server-\w+)-\d+\.log")


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
