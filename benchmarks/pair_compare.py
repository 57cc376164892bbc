"""Two builds of a replication pair, in alternating runs: the price of a change to the
pair's path (the active's replication stream, the backup's apply), as ratios.

    make compiled && cp -a build/compiled /tmp/before      # the build before the change
    ... change, make compiled ...
    .venv/bin/python benchmarks/pair_compare.py --ref-src /tmp/before --src build/compiled \
        --rounds 8 --messages 100000

Each round starts a fresh pair of each build, the order alternating between rounds: the
pair of the shared bench (`../shared/bench/side_by_side.py`'s `pairmq-pair`: a witness,
a primary, a backup acknowledging after its fsync, on loopback), a discarded warm-up, then
one run of the shared bench's load generator against the primary: the peers' durable
1P/1C scenario (1 KiB, persistent, a receipt for each SEND, window 100,
client-individual acks, prefetch 1000). Printed: each build's median rate, median
latency, and CPU per message of the primary and of the backup (event loop and journal
writer, from /proc); then the median of the per-round ratios, `--src` over `--ref-src`.
The compare.py of a server alone does not see the backup's cost at all: this one does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.loadgen import run_time_seconds  # noqa: E402

BENCH = ROOT.parent / "shared" / "bench"
WARM_UP_MESSAGES = 2000


@dataclass(frozen=True)
class PairRun:
    build: str
    round: int
    msgs_per_s: float
    p50_ms: float
    primary_us: float  # CPU per message
    backup_us: float


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, all its threads (the journal writer's too): the
    scheduler's run time to the microsecond where the kernel shows it, else user and
    system time (10 ms ticks)."""
    precise = run_time_seconds(pid)
    if precise is not None:
        return precise
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(name: str, src: Path, venv: Path, messages: int, rnd: int) -> PairRun:
    """A fresh pair of the build in `src`, a warm-up, one measured run."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import side_by_side  # the shared bench's harness: ../shared/bench/README.md

    os.environ["PYTHONPATH"] = str(src.resolve())
    pair = side_by_side.Pairmq(str(venv), pair=True)
    pair.start()
    try:
        primary, backup = pair.procs[1].pid, pair.procs[2].pid
        load = [str(venv / "bin" / "python"), str(BENCH / "stompbench.py"), "--port",
                str(pair.port), "--login", "bench", "--passcode", "bench", "--messages"]
        subprocess.run([*load, str(WARM_UP_MESSAGES)], capture_output=True, check=True)
        before = cpu_seconds(primary), cpu_seconds(backup)
        done = subprocess.run([*load, str(messages)], capture_output=True, text=True,
                              timeout=900, check=False)
        after = cpu_seconds(primary), cpu_seconds(backup)
        lines = done.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        if done.returncode != 0 or not result.get("ok"):
            raise RuntimeError(f"{name}: {done.stderr.strip()[-300:] or result}")
        per_message = [(b - a) / messages * 1e6 for a, b in zip(before, after, strict=True)]
        return PairRun(name, rnd, float(result["consumer_msgs_per_s"]),
                       float(result["lat_p50_ms"]), per_message[0], per_message[1])
    finally:
        pair.stop()


def report(runs: list[PairRun]) -> None:
    figures = (("rate, msgs/s", "msgs_per_s"), ("latency p50, ms", "p50_ms"),
               ("primary CPU, µs/msg", "primary_us"), ("backup CPU, µs/msg", "backup_us"))
    ref = {r.round: r for r in runs if r.build == "ref"}
    work = {r.round: r for r in runs if r.build == "src"}
    rounds = sorted(ref.keys() & work.keys())
    print(f"\n{'figure':22} {'ref':>10} {'src':>10} {'src/ref':>8} {'middle half':>14}")
    for label, field in figures:
        ratios = [getattr(work[n], field) / getattr(ref[n], field) for n in rounds]
        quarters = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(f"{label:22} {statistics.median(getattr(ref[n], field) for n in rounds):>10.2f} "
              f"{statistics.median(getattr(work[n], field) for n in rounds):>10.2f} "
              f"{statistics.median(ratios):>8.3f} {quarters[0]:>6.3f}-{quarters[2]:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref-src", type=Path, required=True,
                   help="the build before: a directory holding its `pairmq` package")
    p.add_argument("--src", type=Path, default=ROOT / "src",
                   help="the build measured (default: this checkout's sources)")
    p.add_argument("--venv", type=Path, default=ROOT / ".venv")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--json", default=None, help="append one JSON line per run to this file")
    args = p.parse_args(argv)
    if not (BENCH / "side_by_side.py").exists():
        p.error(f"the shared bench is not at {BENCH}")
    runs: list[PairRun] = []
    for rnd in range(1, args.rounds + 1):
        builds = [("ref", args.ref_src), ("src", args.src)]
        for name, src in builds if rnd % 2 else builds[::-1]:
            run = one_round(name, src, args.venv, args.messages, rnd)
            runs.append(run)
            print(f"round {rnd} {name:3} {run.msgs_per_s:9.0f} msgs/s  p50 {run.p50_ms:.2f} ms"
                  f"  primary {run.primary_us:5.1f}  backup {run.backup_us:5.1f} µs/msg",
                  flush=True)
            if args.json:
                with open(args.json, "a") as out:
                    out.write(json.dumps(run.__dict__) + "\n")
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
