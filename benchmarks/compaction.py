"""Does pairmq's journal stay bounded under a long persistent send-and-consume run?

Run from the repository root:

    .venv/bin/python benchmarks/compaction.py                    # 1,000,000 x 1 KiB, 64 MiB
    .venv/bin/python benchmarks/compaction.py --messages 300000 --segment-bytes 16777216

Starts a fresh server with --segment-bytes, then producers send --messages
persistent messages with receipts (up to --window in flight each) while consumers
ACK every one of them (ack:client-individual), exactly as persistent.py does.
Meanwhile the journal directory's segment count and bytes are sampled every
--interval seconds (echoed on stderr). Once everything is acknowledged it waits
for compaction to settle and samples once more.

Prints one JSON line: throughput, the peak and final segment count and bytes, how
much was journaled in all (an estimate: messages x record size), and every sample
as [seconds, segments, bytes]. Exits 1 on a lost or duplicated message, an ERROR,
a stall, more than --max-segments segments at any time, or more than
--final-segments once settled.
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
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import start_server  # noqa: E402

from benchmarks.persistent import (  # noqa: E402
    JournalSampler,
    run_load,
    server_log_problems,
    settle_journal,
)

# Journal bytes one message costs: its ADD record (body, headers, ids) plus the
# DELIVERED and DEL records of its consumption (about 1,390 bytes for a 1 KiB body, measured).
RECORD_OVERHEAD_BYTES = 365


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-compaction-", dir=args.workdir))
    server = start_server(workdir, "--segment-bytes", str(args.segment_bytes),
                          name="compaction")
    journal = server.data_dir / "journal"
    sampler = JournalSampler(journal, interval=args.interval, echo=not args.quiet)
    proc = psutil.Process(server.proc.pid)
    peak_rss = 0

    def tick(confirmed: int, received: int) -> None:
        nonlocal peak_rss
        sampler.extra["confirmed"] = confirmed
        sampler.extra["received"] = received
        try:
            peak_rss = max(peak_rss, proc.memory_info().rss)
        except psutil.Error:
            pass

    record: dict[str, Any] = {}
    errors: list[str] = []
    started = time.monotonic()
    try:
        sampler.start()
        res = run_load(server.host, server.port, args.producers, args.consumers,
                       args.messages, size=args.size, window=args.window,
                       prefetch=args.prefetch, timeout=args.timeout, server=proc,
                       on_tick=tick)
        errors.extend(res.errors)
        settled_segments, settled_bytes, settle_s = settle_journal(journal, args.final_segments)
        sampler.stop()
        sampler.sample()  # the settled state, as the last sample
        written = args.messages * (args.size + RECORD_OVERHEAD_BYTES)
        record = {
            "messages": args.messages,
            "size": args.size,
            "producers": args.producers,
            "consumers": args.consumers,
            "segment_bytes": args.segment_bytes,
            "msgs_per_s": res.msgs_per_s,
            "seconds": res.seconds,
            "received": res.received,
            "lost": res.lost,
            "duplicated": res.duplicated,
            "receipt_p50_ms": res.receipt_p50_ms,
            "receipt_p99_ms": res.receipt_p99_ms,
            "e2e_p50_ms": res.e2e_p50_ms,
            "e2e_p99_ms": res.e2e_p99_ms,
            "server_cpu_s": res.server_cpu_s,
            "server_cpu_us_per_msg": (round(res.server_cpu_s / res.received * 1e6, 1)
                                      if res.server_cpu_s and res.received else None),
            "server_loop_cpu_s": res.server_loop_cpu_s,
            "loadgen_cpu_s": res.loadgen_cpu_s,
            "other_cpu_s": res.other_cpu_s,
            "server_peak_rss_bytes": peak_rss,
            "journaled_bytes_estimate": written,
            "segments_created": sampler.highest_segment,
            "peak_segments": sampler.peak_segments,
            "peak_bytes": sampler.peak_bytes,
            "peak_fraction_of_journaled": round(sampler.peak_bytes / written, 4),
            "final_segments": settled_segments,
            "final_bytes": settled_bytes,
            "settle_s": settle_s,
            "samples_count": len(sampler.samples),
            "samples": [list(s) for s in sampler.samples],
        }
        if sampler.peak_segments > args.max_segments:
            errors.append(f"the journal reached {sampler.peak_segments} segments "
                          f"(limit {args.max_segments}): it did not stay bounded")
        if settled_segments > args.final_segments:
            errors.append(f"{settled_segments} segments ({settled_bytes} bytes) remain after "
                          f"everything was acknowledged (expected <= {args.final_segments})")
        if not server.alive():
            errors.append("the server process died")
        record["server_log_problems"] = server_log_problems(server)
    finally:
        sampler.stop()
        code = server.stop(timeout=30)
        if code not in (0, None):
            errors.append(f"server exited with code {code}")
        record["wall_s"] = round(time.monotonic() - started, 2)
        record["ok"] = not errors
        record["errors"] = errors
        if errors or args.keep:
            record["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--consumers", type=int, default=1)
    ap.add_argument("--window", type=int, default=100, help="receipts in flight per producer")
    ap.add_argument("--prefetch", type=int, default=1000, help="prefetch-count per consumer")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--max-segments", type=int, default=10,
                    help="fail if the journal ever holds more segments than this")
    ap.add_argument("--final-segments", type=int, default=2,
                    help="fail if more segments than this remain once settled")
    ap.add_argument("--timeout", type=float, default=1800.0, help="cap on the run, seconds")
    ap.add_argument("--workdir", default=None, help="where the data directory goes")
    ap.add_argument("--keep", action="store_true", help="keep the data directory and log")
    ap.add_argument("--quiet", action="store_true", help="do not echo samples on stderr")
    args = ap.parse_args(argv)
    if min(args.messages, args.producers, args.consumers, args.window, args.prefetch) < 1:
        ap.error("--messages, --producers, --consumers, --window, --prefetch must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        record = run(args)
    except (RuntimeError, TimeoutError) as e:
        print(f"FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(record), flush=True)
    for err in record["errors"]:
        print(f"FAILED: {err}", file=sys.stderr, flush=True)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
