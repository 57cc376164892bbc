"""A member's scale-down (docs/cluster.md, "Scale-down"): how long handing a backlog to
another member takes, against a consumer draining the same backlog.

Run from the repository root:

    .venv/bin/python benchmarks/scale_down.py --messages 1000000
    .venv/bin/python benchmarks/scale_down.py --messages 100000 --rounds 3

Each round: two standalone members of one cluster, member 0 with `scale_down = true`.

1. Fill member 0's queue with --messages persistent messages of --size bytes (the pairmq
   client's `send_batch_async`, nobody consuming).
2. SIGTERM member 0: it moves every message to member 1 and stops. Timed from the signal
   to the process's exit (`scale_down_s`), with the phases from its log.
3. Drain member 1's queue with one consumer on a raw socket (client-individual, each
   ACKed; benchmarks/ha_replication.py's `drain_queue`), checking each message once:
   that consumer's rate is what scale-down is compared with (`ratio` = scale-down rate /
   drain rate).

One JSON line per round, then the medians. A lost or duplicated message exits 1.
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
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.support.cluster import StandaloneCluster  # noqa: E402

import pairmq.client  # noqa: E402
from benchmarks.ha_replication import drain_queue  # noqa: E402
from benchmarks.loadgen import process_cpu  # noqa: E402
from benchmarks.progress import progress_bar  # noqa: E402

QUEUE = "/queue/scaled"


def fill(url: str, messages: int, size: int, batch: int) -> float:
    pad = b"x" * size
    started = time.monotonic()
    with pairmq.client.connect(url, send_window=64) as client, \
            progress_bar("filling member 0", messages) as advance_to:
        sent = 0
        while sent < messages:
            count = min(batch, messages - sent)
            client.send_batch_async(QUEUE, [(pad, {"g": str(sent + i)})
                                            for i in range(count)])
            sent += count
            advance_to(sent)
        client.flush()
    return time.monotonic() - started


def one_round(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cluster = StandaloneCluster(workdir, 2, flags_for={0: ["--scale-down"]})
    try:
        cluster.start()
        member0, member1 = cluster.servers
        assert member0 is not None and member1 is not None
        fill_s = fill(cluster.url(0), args.messages, args.size, args.batch)
        procs = [psutil.Process(s.proc.pid) for s in (member0, member1)]
        cpu_before = [process_cpu(p) or 0.0 for p in procs]
        started = time.monotonic()
        member0.proc.send_signal(signal.SIGTERM)
        member0.proc.wait(args.give_up)
        scale_down_s = time.monotonic() - started
        cpu_target = (process_cpu(procs[1]) or 0.0) - cpu_before[1]
        done = member0.log_lines("Scaled down to member m1")
        phases = [line.split("pairmq.cluster: ", 1)[1] for line in
                  member0.log_lines("Scaling down to member m1: ") if "%" not in line]
        drained = drain_queue(member1.host, member1.port, QUEUE, args.messages,
                              size=args.size, timeout=args.give_up)
        drain_rate = drained.unique / drained.seconds if drained.seconds else 0.0
        rate = args.messages / scale_down_s
        return {"kind": "round", "messages": args.messages, "size": args.size,
                "fill_s": round(fill_s, 1), "scaled_down": bool(done),
                "scale_down_s": round(scale_down_s, 2),
                "scale_down_msgs_per_s": round(rate),
                "target_cpu_s": round(cpu_target, 1),
                "drain_s": drained.seconds, "drain_msgs_per_s": round(drain_rate),
                "ratio": round(rate / drain_rate, 2) if drain_rate else None,
                "lost": drained.lost, "duplicated": drained.duplicated,
                "errors": drained.errors[:3], "phases": phases}
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--give-up", type=float, default=900.0)
    args = p.parse_args(argv)
    rows = []
    failed = False
    for _ in range(args.rounds):
        workdir = Path(tempfile.mkdtemp(prefix="pairmq-scale-down-"))
        try:
            row = one_round(args, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(json.dumps(row), flush=True)
        rows.append(row)
        failed = failed or bool(row["lost"] or row["duplicated"] or row["errors"]
                                or not row["scaled_down"])
    summary = {"kind": "summary", "rounds": len(rows)}
    for key in ("scale_down_s", "scale_down_msgs_per_s", "drain_msgs_per_s", "ratio"):
        values = [r[key] for r in rows if r[key] is not None]
        summary[f"median_{key}"] = statistics.median(values) if values else None
    print(json.dumps(summary), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
