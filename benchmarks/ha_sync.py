"""Initial synchronisation of a backup: how long it takes to copy a loaded active's journal.

Run from the repository root:

    .venv/bin/python benchmarks/ha_sync.py                     # 100,000 messages of 1 KiB
    .venv/bin/python benchmarks/ha_sync.py --messages 20000 --no-verify

1. starts the witness and the primary alone (a fresh pair: the primary activates
   on its own, STANDALONE) and waits until it serves;
2. puts --messages persistent --size byte messages in one queue through it (the
   load of benchmarks/persistent.py, one producer, receipts, --window in flight);
3. starts the backup and polls its management HTTP (GET /status) every 10 ms:
   the sync time is from just before the backup's process is started until
   /status says ha.state PASSIVE with ha["synchronized-with-live"] true
   (the times its STOMP port listened, /status first answered and SYNCING was
   first seen are reported too, and when the primary said its backup is in sync);
4. unless --no-verify: kills the primary (SIGKILL), waits until the backup
   confirms a SEND (at most --failover-give-up seconds), and consumes the whole
   queue from it: every message must be there once. verify_epoch_after minus
   backup_epoch is how many times the backup activated (1 unless it stepped down
   and tried again).

Prints one JSON line: seconds, msgs/s and MB/s of journal copied. A lost message,
a sync that does not finish within --timeout or a server that fails makes it say
so on stderr and exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402

from benchmarks.ha_replication import (  # noqa: E402
    BenchError,
    Pair,
    drain_queue,
    ha_state,
    http_status,
    is_active_with_backup,
    is_passive_in_sync,
    is_serving,
    probe_send,
)
from benchmarks.loadgen import process_cpu  # noqa: E402
from benchmarks.persistent import journal_usage, run_load  # noqa: E402

POLL_S = 0.01


def since(t0: float, t: float | None) -> float | None:
    return None if t is None else round(t - t0, 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-ha-sync-", dir=args.workdir))
    # 100,000 messages of 1 KiB are more than a destination holds by default (64 MiB).
    pair = Pair(workdir, heartbeat_ms=args.heartbeat_ms, activation_ms=args.activation_ms,
                extra=("--max-size-bytes", str(args.max_size_bytes)))
    destination = f"/queue/sync.{uuid.uuid4().hex[:10]}"
    record: dict[str, Any] = {"benchmark": "ha_sync", "messages": args.messages,
                              "size": args.size}
    errors: list[str] = []
    try:
        pair.start_witness()
        primary = pair.start("primary")
        pair.wait("primary", is_serving, 60, "serving alone")
        load_started = time.monotonic()
        load = run_load(primary.host, primary.port, 1, 0, args.messages, size=args.size,
                        window=args.window, destination=destination, timeout=args.timeout)
        if load.errors or load.confirmed != args.messages:
            raise BenchError(f"loading failed: {load.confirmed} of {args.messages} confirmed: "
                             f"{load.errors}")
        record["load_msgs_per_s"] = load.msgs_per_s
        record["load_s"] = round(time.monotonic() - load_started, 3)
        status = pair.status("primary")
        if ha_state(status) != "STANDALONE":
            raise BenchError(f"the primary is {ha_state(status)} before the backup started, "
                             "not STANDALONE")
        segments, journal_bytes = journal_usage(primary.data_dir / "journal")
        record.update(primary_appended_seq=status["ha"]["appended_seq"],
                      journal_segments=segments, journal_bytes=journal_bytes)

        primary_ps = psutil.Process(primary.proc.pid)
        primary_cpu0 = process_cpu(primary_ps)
        t0 = time.monotonic()
        backup = pair.start("backup")
        t_listen = time.monotonic()
        backup_ps = psutil.Process(backup.proc.pid)
        admin = pair.admin["backup"]
        t_admin = t_syncing = t_done = None
        deadline = t0 + args.timeout
        while True:
            status = http_status(admin)
            now = time.monotonic()
            if status is not None and t_admin is None:
                t_admin = now
            state = ha_state(status)
            if state == "SYNCING" and t_syncing is None:
                t_syncing = now
            if is_passive_in_sync(status):
                t_done = now
                break
            if not backup.alive():
                raise BenchError(f"the backup exited with code {backup.proc.returncode}")
            if now > deadline:
                raise BenchError(f"the backup was not in sync within {args.timeout:.0f}s "
                                 f"(state {state})")
            time.sleep(POLL_S)
        backup_cpu = process_cpu(backup_ps)
        primary_cpu = process_cpu(primary_ps)
        primary_status = pair.wait("primary", is_active_with_backup, 30,
                                   "ACTIVE with its backup in sync")
        t_primary = time.monotonic()
        seconds = t_done - t0
        record.update(
            seconds=round(seconds, 3),
            msgs_per_s=round(args.messages / seconds, 1),
            journal_mb_per_s=round(journal_bytes / seconds / 1e6, 1),
            listening_s=since(t0, t_listen),
            status_answered_s=since(t0, t_admin),
            syncing_seen_s=since(t0, t_syncing),
            copy_s=since(t_syncing, t_done) if t_syncing else None,
            primary_in_sync_s=since(t0, t_primary),
            backup_appended_seq=status["ha"]["appended_seq"],
            backup_epoch=status["ha"]["epoch"],
            backup_synced_seq=status["ha"]["synced_seq"],
            primary_confirmed_seq=primary_status["ha"]["confirmed_seq"],
            backup_cpu_s=round(backup_cpu, 3) if backup_cpu is not None else None,
            primary_cpu_s=(round(primary_cpu - primary_cpu0, 3)
                           if primary_cpu is not None and primary_cpu0 is not None else None),
            backup_journal_bytes=journal_usage(backup.data_dir / "journal")[1],
        )
        if status["ha"]["appended_seq"] < record["primary_appended_seq"]:
            errors.append(f"the backup says it is in sync at seq {status['ha']['appended_seq']}"
                          f" but the primary had {record['primary_appended_seq']}")
        if args.verify:
            verify(args, pair, destination, record, errors)
    except (BenchError, RuntimeError, TimeoutError, OSError, psutil.Error) as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        errors += pair.stop()
        record["log_problems"] = pair.log_problems()
        record["host_cpus"] = psutil.cpu_count()
        record["ok"] = not errors
        record["errors"] = errors
        if errors or args.keep:
            record["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return record


def verify(args: argparse.Namespace, pair: Pair, destination: str, record: dict[str, Any],
           errors: list[str]) -> None:
    """Kill the primary; the backup must take over and hold every message."""
    primary, backup = pair.servers["primary"], pair.servers["backup"]
    t0 = time.monotonic()
    primary.proc.send_signal(signal.SIGKILL)
    primary.proc.wait(10)
    give_up = t0 + args.failover_give_up
    epoch_before = record.get("backup_epoch")
    while not probe_send(backup.host, backup.port, "/queue/sync.probe", 5.0).confirmed:
        if time.monotonic() > give_up or not backup.alive():
            status = pair.status("backup")
            epoch = status["ha"]["epoch"] if status else None
            raise BenchError(f"the backup did not take over within {args.failover_give_up:.0f}s "
                             f"of the primary's kill (now {ha_state(status)}, epoch {epoch}; "
                             f"it was epoch {epoch_before} before the kill)")
        time.sleep(0.02)
    record["verify_failover_s"] = round(time.monotonic() - t0, 3)
    status = pair.status("backup")
    # One activation adds one epoch; more mean it activated, stepped down and tried again.
    record["verify_epoch_after"] = status["ha"]["epoch"] if status else None
    drained = drain_queue(backup.host, backup.port, destination, args.messages,
                          size=args.size, timeout=args.timeout)
    record.update(verify_received=drained.unique, lost=drained.lost,
                  redelivered=drained.duplicated, verify_drain_s=drained.seconds,
                  verify_drain_interruptions=drained.interruptions)
    if drained.interruption_reasons:
        record["verify_drain_interruption_reasons"] = drained.interruption_reasons
    errors += drained.errors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000, help="in the queue at the sync")
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--window", type=int, default=100, help="receipts in flight while loading")
    ap.add_argument("--heartbeat-ms", type=int, default=500, help="--heartbeat-interval-ms")
    ap.add_argument("--activation-ms", type=int, default=2000, help="--activation-interval-ms")
    ap.add_argument("--max-size-bytes", type=int, default=0,
                    help="the servers' --max-size-bytes (0 = unlimited: the queue holds it all)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="cap on loading, on the sync and on draining, seconds each")
    ap.add_argument("--failover-give-up", type=float, default=60.0,
                    help="verification: seconds after the kill for the backup to take over")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip the failover and the check that every message reached the backup")
    ap.add_argument("--workdir", default=None, help="where data directories go (default: tmp)")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.size < 0 or args.window < 1 or args.timeout <= 0 \
            or args.max_size_bytes < 0:
        ap.error("--messages, --window and --timeout must be positive, --size and "
                 "--max-size-bytes not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        record = run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(json.dumps(record), flush=True)
    for err in record["errors"]:
        print(f"FAILED: {err}", file=sys.stderr, flush=True)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
