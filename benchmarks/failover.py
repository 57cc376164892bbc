"""Failover time of a pair: kill -9 of the active .. the backup's first confirmed SEND.

Run from the repository root:

    .venv/bin/python benchmarks/failover.py                  # 20 runs per setting
    .venv/bin/python benchmarks/failover.py --runs 5 --setting fast

Two settings of the HA channel: the defaults (heartbeat 500 ms, activation 2000
ms; target below 3 s) and "fast" (100 ms / 300 ms; target below 1 s). Every run

1. starts a fresh pair (witness, primary, backup on 127.0.0.1) and waits until
   the primary is ACTIVE with an in-sync PASSIVE backup;
2. puts --messages persistent 1 KiB messages in a queue through the primary,
   each confirmed by a RECEIPT (so replicated to the backup's disk);
3. sends SIGKILL to the primary and, every --poll-ms, tries CONNECT plus one
   persistent SEND with a receipt on the backup: failover time is from just
   before the kill to that RECEIPT (time to the first CONNECTED is reported too);
4. consumes the queue from the backup: every message must be there (once,
   unless the backup stepped down meanwhile and redelivered unacknowledged ones).

activations > 1 in a run, or reactivations after the failover, mean the backup
became active, lost its lease and stepped down, and activated again.

Prints one JSON line per setting with p50 and max (and every run's time). A lost
or duplicated message, a failover that does not happen within --give-up
seconds, or a server that fails makes it say so on stderr and exit 1; a missed
target only exits 3 with --check-target.
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
import signal  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks.ha_replication import (  # noqa: E402
    BenchError,
    Pair,
    drain_queue,
    ha_state,
    is_passive_in_sync,
    is_serving,
    probe_send,
)
from benchmarks.loadgen import nearest_rank  # noqa: E402
from benchmarks.persistent import run_load  # noqa: E402

# name: (heartbeat_interval_ms, activation_interval_ms, target seconds)
SETTINGS: dict[str, tuple[int, int, float]] = {"defaults": (500, 2000, 3.0),
                                               "fast": (100, 300, 1.0)}

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
PORT_IN_NAME = re.compile(r"^(server-\w+)-\d+\.log")


def one_run(args: argparse.Namespace, setting: str, run: int) -> dict[str, Any]:
    heartbeat_ms, activation_ms, _ = SETTINGS[setting]
    workdir = Path(tempfile.mkdtemp(prefix=f"pairmq-failover-{setting}-{run}-",
                                    dir=args.workdir))
    pair = Pair(workdir, heartbeat_ms=heartbeat_ms, activation_ms=activation_ms)
    destination = f"/queue/failover.{uuid.uuid4().hex[:10]}"
    record: dict[str, Any] = {"run": run}
    errors: list[str] = []
    try:
        pair.start_pair()
        primary, backup = pair.servers["primary"], pair.servers["backup"]
        load = run_load(primary.host, primary.port, 1, 0, args.messages, size=args.size,
                        destination=destination, timeout=120)
        if load.errors or load.confirmed != args.messages:
            raise BenchError(f"loading the queue failed: confirmed {load.confirmed} of "
                             f"{args.messages}: {load.errors}")
        before = pair.status("backup")
        if not is_passive_in_sync(before):
            raise BenchError(f"before the kill the backup is {ha_state(before)}, not an "
                             "in-sync PASSIVE")
        record["backup_seq_before"] = before["ha"]["appended_seq"]

        poll_s = args.poll_ms / 1000
        attempts = 0
        first_connected = None
        last_detail = ""
        t0 = time.monotonic()
        primary.proc.send_signal(signal.SIGKILL)
        give_up = t0 + args.give_up
        while True:
            attempt = time.monotonic()
            if attempt > give_up:
                raise BenchError(f"no confirmed SEND on the backup within {args.give_up:.0f}s "
                                 f"of the kill ({attempts} attempts; last: {last_detail})")
            attempts += 1
            probe = probe_send(backup.host, backup.port, "/queue/failover.probe",
                               timeout=max(0.1, min(5.0, give_up - attempt)))
            if probe.connected and first_connected is None:
                first_connected = probe.connected_at
            if probe.confirmed:
                failover_s = time.monotonic() - t0
                break
            last_detail = probe.detail
            time.sleep(max(0.0, attempt + poll_s - time.monotonic()))
        primary.proc.wait(10)
        after = pair.status("backup")
        record.update(
            failover_s=round(failover_s, 4),
            connect_s=round(first_connected - t0, 4) if first_connected else None,
            attempts=attempts,
            backup_state_after=ha_state(after),
            epoch_after=after["ha"]["epoch"] if after else None,
        )
        if after:
            # Each activation of the backup opens an epoch: more than one means it became
            # active, stepped down and tried again before its SEND was confirmed.
            record["activations"] = after["ha"]["epoch"] - before["ha"]["epoch"]
        if not is_serving(after):
            errors.append(f"the backup confirmed a SEND but its state is {ha_state(after)}")
        drained = drain_queue(backup.host, backup.port, destination, args.messages,
                              size=args.size, timeout=60)
        record.update(received=drained.unique, lost=drained.lost,
                      redelivered=drained.duplicated,
                      drain_interruptions=drained.interruptions)
        if drained.interruption_reasons:
            record["drain_interruption_reasons"] = drained.interruption_reasons
        errors += drained.errors
        final = pair.status("backup")
        if final and after:
            # Activations after the confirmed SEND: the backup stepped down and came back.
            record["reactivations_after_failover"] = final["ha"]["epoch"] - after["ha"]["epoch"]
    except (BenchError, RuntimeError, TimeoutError, OSError) as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        errors += pair.stop()
        record["log_problems"] = pair.log_problems()
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


def run_setting(args: argparse.Namespace, setting: str) -> dict[str, Any]:
    heartbeat_ms, activation_ms, target = SETTINGS[setting]
    started = time.monotonic()
    runs = []
    for run in range(1, args.runs + 1):
        record = one_run(args, setting, run)
        runs.append(record)
        print(f"{setting} run {run}: failover {record.get('failover_s')} s, connect "
              f"{record.get('connect_s')} s, {record.get('activations')} activation(s), "
              f"{record.get('received')} of {args.messages} "
              "messages on the backup" + ("" if record["ok"] else f" FAILED {record['errors']}"),
              file=sys.stderr, flush=True)
    times = [r["failover_s"] for r in runs if r.get("failover_s") is not None]
    connects = [r["connect_s"] for r in runs if r.get("connect_s") is not None]
    errors = [f"run {r['run']}: {e}" for r in runs for e in r["errors"]]
    p50 = nearest_rank(times, 0.5)
    worst = max(times) if times else None
    return {
        "benchmark": "failover",
        "setting": setting,
        "heartbeat_interval_ms": heartbeat_ms,
        "activation_interval_ms": activation_ms,
        "runs": args.runs,
        "measured": len(times),
        "p50_s": p50,
        "p90_s": nearest_rank(times, 0.9),
        "max_s": worst,
        "min_s": min(times) if times else None,
        "mean_s": round(statistics.fmean(times), 4) if times else None,
        "connect_p50_s": nearest_rank(connects, 0.5),
        "connect_max_s": max(connects) if connects else None,
        "target_s": target,
        "target_met": worst is not None and worst < target and len(times) == args.runs,
        "messages_per_run": args.messages,
        "activations_max": max((r.get("activations", 0) for r in runs), default=None),
        "runs_with_repeated_activation": sum(1 for r in runs if r.get("activations", 0) > 1),
        "runs_reactivated_after_failover": sum(
            1 for r in runs if r.get("reactivations_after_failover", 0) > 0),
        "lost": sum(r.get("lost", 0) for r in runs),
        # Deliveries beyond the first (errors unless the drain was interrupted by a step-down).
        "redelivered": sum(r.get("redelivered", 0) for r in runs),
        "poll_ms": args.poll_ms,
        "failover_s_runs": times,
        "log_problems": common_problems(runs),
        "wall_s": round(time.monotonic() - started, 1),
        "ok": not errors,
        "errors": errors,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="failovers per setting")
    ap.add_argument("--setting", choices=[*SETTINGS, "all"], default="all")
    ap.add_argument("--messages", type=int, default=1000, help="in the queue at the kill")
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--poll-ms", type=float, default=5.0, help="between attempts on the backup")
    ap.add_argument("--give-up", type=float, default=30.0,
                    help="seconds after the kill without a confirmed SEND that fail the run")
    ap.add_argument("--workdir", default=None, help="where data directories go (default: tmp)")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    ap.add_argument("--check-target", action="store_true",
                    help="exit 3 when the slowest failover of a setting misses its target")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.messages < 1 or args.poll_ms < 0 or args.give_up <= 0:
        ap.error("--runs, --messages and --give-up must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(SETTINGS) if args.setting == "all" else [args.setting]
    failed = missed = False
    try:
        for name in names:
            record = run_setting(args, name)
            print(json.dumps(record), flush=True)
            missed = missed or not record["target_met"]
            if not record["ok"]:
                failed = True
                for err in record["errors"]:
                    print(f"FAILED {name}: {err}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if failed:
        return 1
    return 3 if missed and args.check_target else 0


if __name__ == "__main__":
    sys.exit(main())
