"""The pair on etcd (issue 36): a steady load through etcd's bad days, and throughput beside
the witness.

Run from the repository root (Debian's etcd-server installed: `make test-deps`):

    .venv/bin/python benchmarks/etcd_arbiter.py --scenario steady
    .venv/bin/python benchmarks/etcd_arbiter.py --scenario throughput --rounds 6

Steady (--scenario steady): a local 3-member etcd cluster and a pair on it with the default
intervals (heartbeat 500 ms, activation 2000 ms); the pair reaches member 1 through a TCP
proxy (tests/netproxy.py). A durable load (1 producer, 1 consumer, receipts, 1 KiB) runs
while, --phase seconds apart, etcd goes through: a follower killed (SIGKILL) then
restarted; the leader killed then restarted; member 1 cut from both servers at the proxy
(a partition between the pair and one member) then healed; a member frozen (SIGSTOP, a
member that hangs for everyone) then thawed. Reported: the role changes of both servers
during the load (lines "Local server switched to"; target 0), the messages confirmed and
consumed (lost: confirmed but never consumed; target 0), the lease's renewals that failed.

Throughput (--scenario throughput): alternating rounds, each a fresh pair, one on `pairmq
witness` and one on etcd, each under the same durable load (--messages); the rate and
the server CPU per message of each, and their ratios etcd / witness per round.

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
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.netproxy import NetProxy  # noqa: E402
from tests.support.etcd import EtcdCluster  # noqa: E402

from benchmarks.ha_replication import Pair  # noqa: E402
from benchmarks.persistent import run_load  # noqa: E402

SWITCHED = "Local server switched to"


def _switches(pair: Pair) -> int:
    return sum(s.log_path.read_text(errors="replace").count(SWITCHED)
               for s in pair.servers.values())


def _renewals_failed(pair: Pair) -> int:
    return sum(s.log_path.read_text(errors="replace").count("Cannot reach a majority of etcd")
               for s in pair.servers.values())


def steady(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with EtcdCluster(workdir / "etcd") as cluster:
        proxy = NetProxy(cluster.endpoints[0], name="etcd-e1").start()
        try:
            url = "etcd://" + ",".join([proxy.address, *cluster.endpoints[1:]])
            pair = Pair(workdir / "pair", etcd=url)
            try:
                pair.start_pair(timeout=60)
                return _steady_load(args, cluster, proxy, pair)
            finally:
                pair.stop()
        finally:
            proxy.stop()


def _steady_load(args: argparse.Namespace, cluster: EtcdCluster, proxy: NetProxy,
                 pair: Pair) -> dict[str, Any]:
    phase = args.phase
    follower: list[int] = []
    leader: list[int] = []

    def kill_follower() -> None:
        chosen = next(i for i in range(3) if i != cluster.wait_leader())
        follower.append(chosen)
        cluster.kill(chosen)

    def kill_leader() -> None:
        leader.append(cluster.wait_leader())
        cluster.kill(leader[0])

    schedule: list[tuple[float, str, Callable[[], None]]] = [
        (1 * phase, "kill an etcd follower", kill_follower),
        (2 * phase, "restart it", lambda: cluster.restart(follower[0])),
        (3 * phase, "kill the etcd leader", kill_leader),
        (4 * phase, "restart it", lambda: cluster.restart(leader[0])),
        (5 * phase, "cut member e1 from both servers", lambda: proxy.cut()),
        (6 * phase, "heal the cut", lambda: proxy.heal()),
        (7 * phase, "freeze member e2 (SIGSTOP)", lambda: cluster.pause(1)),
        (8 * phase, "thaw it", lambda: cluster.resume(1)),
    ]
    done: list[tuple[float, str]] = []
    started = time.monotonic()

    def on_tick(_confirmed: int, _received: int) -> None:
        elapsed = time.monotonic() - started
        while len(done) < len(schedule) and elapsed >= schedule[len(done)][0]:
            _at, what, act = schedule[len(done)]
            act()
            done.append((round(elapsed, 2), what))
            print(f"{elapsed:6.1f} s: {what}", file=sys.stderr, flush=True)

    switches_before = _switches(pair)
    failed_before = _renewals_failed(pair)
    primary = pair.servers["primary"]
    load = run_load(primary.host, primary.port, 1, 1, args.messages, size=1024,
                    destination="/queue/etcd.steady", timeout=1800, on_tick=on_tick)
    return {"scenario": "steady", "faults": done,
            "faults_complete": len(done) == len(schedule),
            "role_changes": _switches(pair) - switches_before,
            "etcd_unreachable_logged": _renewals_failed(pair) - failed_before,
            "confirmed": load.confirmed, "received": load.received, "lost": load.lost,
            "duplicated": load.duplicated, "msgs_per_s": round(load.msgs_per_s),
            "receipt_p99_ms": load.receipt_p99_ms, "receipt_max_ms": load.receipt_max_ms,
            "seconds": round(load.seconds, 1), "errors": load.errors,
            "ok": not load.errors and load.lost == 0 and len(done) == len(schedule)
            and _switches(pair) == switches_before}


def throughput_round(args: argparse.Namespace, workdir: Path, cluster: EtcdCluster,
                     arbiter: str) -> dict[str, Any]:
    pair = Pair(workdir / f"pair-{arbiter}-{time.monotonic_ns()}",
                etcd=cluster.url if arbiter == "etcd" else "")
    try:
        pair.start_pair(timeout=60)
        primary = pair.servers["primary"]
        load = run_load(primary.host, primary.port, 1, 1, args.messages, size=1024,
                        destination="/queue/etcd.throughput", timeout=1800,
                        server=psutil.Process(primary.proc.pid))
    finally:
        pair.stop()
    cpu = load.server_cpu_s
    return {"arbiter": arbiter, "msgs_per_s": round(load.msgs_per_s),
            "server_cpu_us_per_msg": round(cpu / load.confirmed * 1e6, 1)
            if cpu and load.confirmed else None,
            "lost": load.lost, "errors": load.errors}


def throughput(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rates: list[float] = []
    cpus: list[float] = []
    with EtcdCluster(workdir / "etcd") as cluster:
        for rnd in range(args.rounds):
            order = ["witness", "etcd"] if rnd % 2 == 0 else ["etcd", "witness"]
            got = {a: throughput_round(args, workdir, cluster, a) for a in order}
            for record in got.values():
                print(json.dumps({"round": rnd + 1, **record}), flush=True)
            witness, etcd = got["witness"], got["etcd"]
            rates.append(etcd["msgs_per_s"] / witness["msgs_per_s"])
            if etcd["server_cpu_us_per_msg"] and witness["server_cpu_us_per_msg"]:
                cpus.append(etcd["server_cpu_us_per_msg"] / witness["server_cpu_us_per_msg"])
    return {"scenario": "throughput", "rounds": args.rounds, "messages": args.messages,
            "rate_ratio_median": round(statistics.median(rates), 3),
            "rate_ratios": [round(r, 3) for r in rates],
            "cpu_per_msg_ratio_median": round(statistics.median(cpus), 3) if cpus else None,
            "cpu_per_msg_ratios": [round(c, 3) for c in cpus], "ok": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=["steady", "throughput"], default="steady")
    ap.add_argument("--messages", type=int, default=400_000,
                    help="steady: enough to outlast the faults; throughput: per run")
    ap.add_argument("--phase", type=float, default=5.0, help="steady: seconds between faults")
    ap.add_argument("--rounds", type=int, default=6, help="throughput: alternating rounds")
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-etcd-bench-"))
    try:
        result = steady(args, workdir) if args.scenario == "steady" else \
            throughput(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
