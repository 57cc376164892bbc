"""A pair whose active's disk freezes: time until the backup confirms (issue 35), and a
soak without stalls that must not step down.

Run from the repository root, as root (loop mounts and fsfreeze):

    .venv/bin/python benchmarks/gray_failures.py --runs 10
    .venv/bin/python benchmarks/gray_failures.py --soak-seconds 600

Freeze (--runs): every run starts a fresh pair (witness, primary, backup; the default
intervals, heartbeat 500 ms and activation 2000 ms, and the default stall_timeout_ms
unless --stall-timeout-ms) whose data directories are each a loop-mounted ext4 of their
own, puts a producer on it (persistent sends with receipts, 16 in flight, tests/ha's Load,
through the pairmq client's failover), freezes the active's file system with `fsfreeze
-f` and measures the time from the freeze to the first receipt of a send made after it
(the 17th receipt: at most 16 were in flight when it froze). Then it thaws, waits until
the pair has formed again, stops the producer and checks that every receipted message is
consumed exactly once. Target: at most the timeout plus 1 s.

Soak (--soak-seconds): a pair on the ordinary disk under the shared bench's durable load
(`../shared/bench/stompbench.py` against the pair, 2 producers and 2 consumers, runs of
200,000 messages until the time is up), then each server's longest journal write (GET
/status, journal.disk) and whether anything stalled or stepped down: a slow but working
disk must not look stalled.

Prints one JSON line per run and a summary line.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from contextlib import ExitStack  # noqa: E402

from tests.ha.clients import Load, consumed_exactly_once  # noqa: E402
from tests.ha.pair import NAMES, Pair  # noqa: E402
from tests.support.admin import ADMIN_PASSWORD, ADMIN_USER  # noqa: E402
from tests.support.disk import frozen, loop_filesystem  # noqa: E402

WINDOW = 16
STOMPBENCH = ROOT.parent / "shared" / "bench" / "stompbench.py"
QUEUE = "/queue/gray-bench"


def pair_in(workdir: Path, stall_ms: int | None) -> Pair:
    flags = ["--segment-bytes", str(16 << 20)]
    if stall_ms is not None:
        flags += ["--stall-timeout-ms", str(stall_ms)]
    return Pair(workdir, heartbeat_ms=500, activation_ms=2000, flags=flags)


def freeze_run(workdir: Path, stall_ms: int | None) -> dict[str, object]:
    pair = pair_in(workdir, stall_ms)
    with ExitStack() as stack:
        mounts = {name: stack.enter_context(loop_filesystem(
            workdir / f"fs-{name}", pair.data_dir(name), size_mb=256)) for name in NAMES}
        stack.callback(pair.close)
        pair.start(parallel=True)
        pair.wait_formed(30)
        load = Load(pair.client_addresses(), QUEUE, window=WINDOW, receipt_timeout=60).start()
        stack.callback(lambda: load.stop_event.set())
        load.wait_receipts(500, 30)
        with frozen(mounts["primary"]):
            froze = time.monotonic()
            load.wait_receipts(WINDOW + 1, 60)
            first = time.monotonic() - froze
            serving = pair.wait_active(10)
            time.sleep(1.0)
        pair.wait_formed(60)
        load.wait_receipts(200, 30)
        receipted = load.stop()
        consumed_exactly_once(pair.client_addresses(), QUEUE, receipted)
        logs = pair.logs("primary")
        return {"freeze_to_first_receipt_s": round(first, 3), "served_by": serving,
                "receipted": len(receipted), "stall_logged": "Journal write pending" in logs,
                "handed_over": "stopped completing writes" in logs}


def soak(workdir: Path, seconds: float) -> dict[str, object]:
    pair = pair_in(workdir, None)
    try:
        pair.start(parallel=True)
        pair.wait_formed(30)
        hosts = ",".join(f"{h}:{p}" for h, p in pair.client_addresses())
        end = time.monotonic() + seconds
        runs = messages = 0
        while time.monotonic() < end:
            done = subprocess.run(
                [sys.executable, str(STOMPBENCH), "--hosts", hosts, "--persistent",
                 "--login", ADMIN_USER, "--passcode", ADMIN_PASSWORD,
                 "--producers", "2", "--consumers", "2", "--messages", "200000",
                 "--size", "1024", "--window", "100", "--ack", "client-individual"],
                cwd=STOMPBENCH.parent, capture_output=True, text=True, timeout=1800)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            if not result.get("ok"):
                raise SystemExit(f"stompbench failed: {result}")
            runs += 1
            messages += 200000
        disks = {}
        for name in NAMES:
            st = pair.status(name)
            assert st is not None
            disks[name] = {"ha_state": st["state"], **st["journal"]["disk"]}
        stepped = [n for n in NAMES if "stopped completing writes" in pair.logs(n)
                   or "dropped from synchronous replication" in pair.logs(n)]
        return {"seconds": seconds, "stompbench_runs": runs, "messages": messages,
                "disks": disks, "stepped_down_or_dropped": stepped}
    finally:
        pair.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=0, help="freeze runs")
    p.add_argument("--stall-timeout-ms", type=int, default=None,
                   help="the pair's [store] stall_timeout_ms (default: the server's)")
    p.add_argument("--soak-seconds", type=float, default=0.0)
    args = p.parse_args(argv)
    if args.runs:
        times = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="gray-") as d:
                row = freeze_run(Path(d), args.stall_timeout_ms)
            row["run"] = i + 1
            print(json.dumps(row), flush=True)
            times.append(float(row["freeze_to_first_receipt_s"]))  # type: ignore[arg-type]
        print(json.dumps({"runs": len(times), "p50_s": round(statistics.median(times), 3),
                          "max_s": max(times), "min_s": min(times)}))
    if args.soak_seconds:
        with tempfile.TemporaryDirectory(prefix="gray-soak-") as d:
            print(json.dumps(soak(Path(d), args.soak_seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
