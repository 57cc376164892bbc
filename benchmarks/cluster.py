"""A cluster's price: messages that cross a bridge, and members side by side (docs/cluster.md).

Run from the repository root:

    .venv/bin/python benchmarks/cluster.py                       # both scenarios, 3 rounds
    .venv/bin/python benchmarks/cluster.py --scenario cross --rounds 5 --messages 40000
    .venv/bin/python benchmarks/cluster.py --scenario members --queues shared

The load is benchmarks/persistent.py's `run_load`: producer processes on raw sockets
keeping --window persistent 1 KiB SENDs with receipts in flight, consumer processes
acknowledging each MESSAGE (client-individual). Members are standalone servers (no pair:
the pair's own price is benchmarks/ha_replication.py's).

- cross: two members. In the same run, alternating, on fresh queues: the producer and the
  consumer on member A ("local"), then the producer on A and the consumer on B ("cross":
  each message crosses B's bridge: received by it, stored on B, acknowledged on A).
  Goal: cross >= 0.5 x local. Also the servers' CPU per message of each.
- members: three members. One producer and one consumer on member 0 alone ("alone"),
  then one of each on every member at once ("all"): with --queues own each member's pair
  of clients uses its own queue (nothing crosses), with --queues shared all use one queue
  (on_demand: each member's bridges take a share of the others' messages). The ratio
  all/alone of the aggregate rate, and the servers' CPU per message: on one machine the
  members share its cores, so the CPU per message says how the rate grows with machines.

Prints one JSON line per run, then per scenario the medians and ratios. A lost or
duplicated message, an ERROR frame or a stall exits 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.support.cluster import StandaloneCluster  # noqa: E402

from benchmarks.loadgen import process_cpu  # noqa: E402
from benchmarks.persistent import LoadResult, run_load  # noqa: E402


class BenchError(Exception):
    pass


def _procs(cluster: StandaloneCluster) -> list[psutil.Process]:
    return [psutil.Process(s.proc.pid) for s in cluster.servers if s is not None]


def _cpu(procs: list[psutil.Process]) -> float:
    return sum(process_cpu(p) or 0.0 for p in procs)


def _check(res: LoadResult, what: str) -> None:
    if res.errors or res.lost or res.duplicated:
        raise BenchError(f"{what}: errors {res.errors[:3]}, lost {res.lost}, duplicated "
                         f"{res.duplicated}")


def _one(cluster: StandaloneCluster, producer: int, consumer: int, args: argparse.Namespace,
         destination: str) -> LoadResult:
    return run_load("127.0.0.1", cluster.ports[producer], 1, 1, args.messages,
                    window=args.window, prefetch=args.prefetch, destination=destination,
                    consumer_port=cluster.ports[consumer])


def cross_round(cluster: StandaloneCluster, args: argparse.Namespace, n: int
                ) -> list[dict[str, Any]]:
    procs = _procs(cluster)
    rows = []
    order = (("local", 0, 0), ("cross", 0, 1))
    for name, producer, consumer in order if n % 2 == 0 else reversed(order):
        cpu0 = _cpu(procs)
        res = _one(cluster, producer, consumer, args, f"/queue/bench.{uuid.uuid4().hex[:8]}")
        cpu = _cpu(procs) - cpu0
        _check(res, name)
        rows.append({"scenario": "cross", "run": name, "round": n,
                     "msgs_per_s": round(res.msgs_per_s),
                     "e2e_p50_ms": res.e2e_p50_ms, "e2e_p99_ms": res.e2e_p99_ms,
                     "servers_cpu_s": round(cpu, 2),
                     "servers_cpu_us_per_msg": round(cpu / args.messages * 1e6, 1),
                     "other_cpu_s": res.other_cpu_s})
    return rows


def members_round(cluster: StandaloneCluster, args: argparse.Namespace, n: int
                  ) -> list[dict[str, Any]]:
    procs = _procs(cluster)
    rows = []
    tag = uuid.uuid4().hex[:8]
    for name in ("alone", "all") if n % 2 == 0 else ("all", "alone"):
        if name == "all" and args.queues == "shared":
            # one queue: each member's consumer may get any member's messages
            rows.append(_shared_run(cluster, args, f"/queue/bench.{tag}.shared", n, procs))
            continue
        members = [0] if name == "alone" else list(range(len(cluster.ports)))
        rows.append(_own_queues(cluster, args, members, f"{tag}.{name}", name, n, procs))
    return rows


def _own_queues(cluster: StandaloneCluster, args: argparse.Namespace, members: list[int],
                tag: str, name: str, n: int, procs: list[psutil.Process]) -> dict[str, Any]:
    """A producer and a consumer on each of `members`, each pair on its own queue."""
    results: dict[int, LoadResult] = {}

    def run(i: int) -> None:
        results[i] = _one(cluster, i, i, args, f"/queue/bench.{tag}.{i}")

    cpu0, t0 = _cpu(procs), time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    cpu = _cpu(procs) - cpu0
    for i, res in results.items():
        _check(res, f"{name} member {i}")
    total = args.messages * len(members)
    return {"scenario": "members", "run": name, "round": n, "queues": args.queues,
            "msgs_per_s": round(sum(r.msgs_per_s for r in results.values())),
            "wall_msgs_per_s": round(total / seconds),
            "servers_cpu_s": round(cpu, 2),
            "servers_cpu_us_per_msg": round(cpu / total * 1e6, 1)}


def _shared_run(cluster: StandaloneCluster, args: argparse.Namespace, queue: str, n: int,
                procs: list[psutil.Process]) -> dict[str, Any]:
    """Three producers and three consumers on one queue, one of each per member: the
    consumers' counts are checked together (any consumer may get any message)."""
    cpu0, t0 = _cpu(procs), time.monotonic()
    members = range(len(cluster.ports))
    # one run_load per member for the producers (no consumers: it ends once confirmed) ...
    confirmed: dict[int, LoadResult] = {}

    def produce(i: int) -> None:
        confirmed[i] = run_load("127.0.0.1", cluster.ports[i], 1, 0, args.messages,
                                window=args.window, destination=queue)

    threads = [threading.Thread(target=produce, args=(i,)) for i in members]
    for t in threads:
        t.start()
    # ... and a consumer process per member, counting what arrives (any member's)
    ctx = mp.get_context("fork")
    total = args.messages * len(cluster.ports)
    got = ctx.Array("q", len(cluster.ports))
    done = ctx.Event()
    consumers = [ctx.Process(target=_consume, args=(cluster.url(i), queue, args.prefetch, i,
                                                    got, total, done)) for i in members]
    for p in consumers:
        p.start()
    for t in threads:
        t.join()
    done.wait(300)
    seconds = time.monotonic() - t0
    for p in consumers:
        p.join(10)
    cpu = _cpu(procs) - cpu0
    if sum(got) != total:
        raise BenchError(f"shared: consumed {sum(got)} of {total}")
    return {"scenario": "members", "run": "all", "round": n, "queues": "shared",
            "msgs_per_s": round(total / seconds), "per_member_consumed": list(got),
            "servers_cpu_s": round(cpu, 2),
            "servers_cpu_us_per_msg": round(cpu / total * 1e6, 1)}


def _consume(url: str, queue: str, prefetch: int, i: int, got: Any, total: int,
             done: Any) -> None:
    """A consumer process on one member: acknowledges what comes, counts it in `got[i]`,
    until every member's consumers together got `total`."""
    from pairmq.client import connect

    client = connect(url)
    sub = client.subscribe(queue, ack="client-individual",
                           headers={"prefetch-count": str(prefetch)})
    while not done.is_set():
        message = sub.receive(0.2)
        if message is not None:
            client.ack(message)
            got[i] += 1
            if sum(got) >= total:
                done.set()
    client.close()


def summarise(rows: list[dict[str, Any]], scenario: str, top: str, bottom: str,
              goal: float | None) -> dict[str, Any]:
    def med(run: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["run"] == run)

    ratios = [a["msgs_per_s"] / b["msgs_per_s"] for a in rows if a["run"] == top
              for b in rows if b["run"] == bottom and b["round"] == a["round"]]
    out: dict[str, Any] = {
        "summary": scenario, f"{top}_msgs_per_s": med(top, "msgs_per_s"),
        f"{bottom}_msgs_per_s": med(bottom, "msgs_per_s"),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        f"{top}_cpu_us_per_msg": med(top, "servers_cpu_us_per_msg"),
        f"{bottom}_cpu_us_per_msg": med(bottom, "servers_cpu_us_per_msg")}
    if goal is not None:
        out["goal"] = goal
        out["met"] = out["ratio_median"] >= goal
    return out


def _flags(args: argparse.Namespace, members: int) -> dict[int, list[str]]:
    flags = []
    if args.bridge_window is not None:
        flags += ["--bridge-window", str(args.bridge_window)]
    if args.load_balancing is not None:
        flags += ["--message-load-balancing", args.load_balancing]
    return {i: flags for i in range(members)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("cross", "members", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--queues", choices=("own", "shared"), default="own")
    parser.add_argument("--load-balancing", default=None,
                        help="[cluster] message_load_balancing of every member")
    parser.add_argument("--bridge-window", type=int, default=None,
                        help="[cluster] bridge_window of every member (default: the server's)")
    args = parser.parse_args(argv)
    try:
        if args.scenario in ("cross", "both"):
            with tempfile.TemporaryDirectory(prefix="pairmq-cluster-") as tmp:
                cluster = StandaloneCluster(Path(tmp), 2, flags_for=_flags(args, 2)).start()
                try:
                    rows = [r for n in range(args.rounds) for r in cross_round(cluster, args, n)]
                finally:
                    cluster.stop()
            for r in rows:
                print(json.dumps(r), flush=True)
            print(json.dumps(summarise(rows, "cross", "cross", "local", 0.5)), flush=True)
        if args.scenario in ("members", "both"):
            with tempfile.TemporaryDirectory(prefix="pairmq-cluster-") as tmp:
                cluster = StandaloneCluster(Path(tmp), 3, flags_for=_flags(args, 3)).start()
                try:
                    rows = [r for n in range(args.rounds)
                            for r in members_round(cluster, args, n)]
                finally:
                    cluster.stop()
            for r in rows:
                print(json.dumps(r), flush=True)
            print(json.dumps(summarise(rows, f"members ({args.queues} queues)", "all",
                                       "alone", None)), flush=True)
    except BenchError as e:
        print(f"cluster benchmark: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
