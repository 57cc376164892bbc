"""Queue throughput and end-to-end latency of pairmq under raw STOMP load.

Run from the repository root:

    .venv/bin/python benchmarks/throughput.py                  # starts its own server
    .venv/bin/python benchmarks/throughput.py --scenario 1p1c --messages 100000
    .venv/bin/python benchmarks/throughput.py --target 127.0.0.1:61613

Each scenario (1 producer / 1 consumer, 4 producers / 4 competing consumers on
one queue) does two runs on fresh queues:

- flood: the producers send --messages in total as fast as TCP lets them;
  throughput = messages received / (first send .. last receive). Its latency
  only measures queueing, so it is reported but not the latency figure.
- paced: the producers together offer --rate msgs/s for --paced-seconds; its
  p50/p99/max latency is the one that means something.

Prints one JSON line per scenario. Lost or duplicated messages, ERROR frames, a
stalled server or a dead server make it say so on stderr and exit 1.
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
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from array import array  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import ServerProcess, start_server  # noqa: E402

from benchmarks.loadgen import (  # noqa: E402
    GeneratorPool,
    alive,
    cpu_seconds,
    host_busy_cpu,
    percentile_ms,
    process_cpu,
    split,
)
from benchmarks.stomp_load import (  # noqa: E402
    ConsumerConfig,
    ProducerConfig,
    RunShared,
    consumer_main,
    producer_main,
)

SCENARIOS: dict[str, tuple[int, int]] = {"1p1c": (1, 1), "4p4c": (4, 4)}
SETUP_TIMEOUT_S = 20.0  # connecting and subscribing every generator process
COLLECT_TIMEOUT_S = 15.0  # generator processes reporting back after stop
LATENCY_SAMPLES = 50_000
DUPLICATE_GRACE_S = 0.3  # keep listening after the last expected message for extras


@dataclass
class RunStats:
    """The outcome of one flood or paced run."""

    planned: int
    sent: int = 0
    received: int = 0
    seconds: float = 0.0  # first send .. last receive
    msgs_per_s: float = 0.0
    offered_msgs_per_s: float = 0.0  # what the producers managed to hand to TCP
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    samples: int = 0
    loadgen_cpu_s: float = 0.0
    # Busiest producer / consumer process: its CPU s / (first send .. last receive).
    producer_cpu_util: float = 0.0
    consumer_cpu_util: float = 0.0
    server_cpu_s: float | None = None
    host_cpu_s: float = 0.0  # every core of the machine, busy, during the run
    wall_s: float = 0.0  # start signal .. stop signal
    errors: list[str] = field(default_factory=list)


def run_once(
    args: argparse.Namespace,
    host: str,
    port: int,
    server: psutil.Process | None,
    n_producers: int,
    n_consumers: int,
    total: int,
    rate: float | None,
    label: str,
) -> RunStats:
    """One run on a fresh queue: consumers subscribed first, then producers released together."""
    stats = RunStats(planned=total)
    destination = f"/queue/bench.{label}.{uuid.uuid4().hex[:10]}"
    expected_s = total / rate if rate else 0.0
    deadline = time.monotonic() + SETUP_TIMEOUT_S + expected_s + args.timeout
    ctx = mp.get_context("fork")
    shared = RunShared(
        events=ctx.Queue(),
        start=ctx.Event(),
        stop=ctx.RawValue("b", 0),
        progress=ctx.RawArray("q", n_consumers),
    )
    # About LATENCY_SAMPLES latencies per run: plenty for a p99, cheaper than all.
    sample_every = max(1, total // LATENCY_SAMPLES)
    pool = GeneratorPool(ctx, shared.events, stats.errors)

    t0 = time.monotonic()
    cpu_main0 = 0.0
    server_cpu0 = None
    host_cpu0 = 0.0
    try:
        for i in range(n_consumers):
            cfg = ConsumerConfig(i, host, port, destination, deadline, sample_every)
            pool.launch("consumer", i, consumer_main, (cfg, shared))
        if pool.wait_ready("consumer", n_consumers, SETUP_TIMEOUT_S):
            per_rate = rate / n_producers if rate else None
            for i, count in enumerate(split(total, n_producers)):
                pcfg = ProducerConfig(
                    i,
                    host,
                    port,
                    destination,
                    count,
                    args.size,
                    args.persistent,
                    per_rate,
                    deadline,
                    args.idle_timeout,
                )
                pool.launch("producer", i, producer_main, (pcfg, shared))
        if len(pool.procs) == n_consumers + n_producers and pool.wait_ready(
            "producer", n_producers, SETUP_TIMEOUT_S
        ):
            server_cpu0 = process_cpu(server)
            host_cpu0 = host_busy_cpu()
            cpu_main0 = cpu_seconds()
            t0 = time.monotonic()
            shared.start.set()
            _watch(args, shared, stats, pool, n_producers, total, t0, deadline, server)
    finally:
        stats.wall_s = time.monotonic() - t0
        shared.stop.value = 1
        shared.start.set()  # producers still waiting to start must see the stop
        if host_cpu0:
            stats.host_cpu_s = round(host_busy_cpu() - host_cpu0, 3)
        if server_cpu0 is not None:
            after = process_cpu(server)
            stats.server_cpu_s = None if after is None else round(after - server_cpu0, 3)
        pool.collect(COLLECT_TIMEOUT_S)
        stats.loadgen_cpu_s = cpu_seconds() - cpu_main0 if cpu_main0 else 0.0

    _summarise(stats, pool.results)
    return stats


def _watch(
    args: argparse.Namespace,
    shared: RunShared,
    stats: RunStats,
    pool: GeneratorPool,
    n_producers: int,
    total: int,
    t0: float,
    deadline: float,
    server: psutil.Process | None,
) -> None:
    """Wait until everything sent has arrived, or fail on error, stall or deadline."""
    last_total, last_change = 0, t0
    complete_at: float | None = None
    while True:
        pool.take(0.005)
        if stats.errors:
            return
        now = time.monotonic()
        received = sum(shared.progress)
        if received != last_total:
            last_total, last_change = received, now
        producer_results = pool.role_results("producer")
        sent = sum(r["sent"] for r in producer_results)
        if received >= total or (len(producer_results) == n_producers and received >= sent):
            # Everything arrived; linger briefly so duplicates would show up too.
            complete_at = complete_at or now
            if now - complete_at >= DUPLICATE_GRACE_S:
                return
            continue
        if now - last_change > args.idle_timeout:
            stats.errors.append(
                f"stalled: nothing arrived for {args.idle_timeout}s "
                f"(received {received} of {total} planned)"
            )
            return
        if now > deadline:
            stats.errors.append(f"timed out: received {received} of {total} planned")
            return
        if server is not None and not alive(server):
            stats.errors.append("the server process died")
            return


def _summarise(stats: RunStats, results: dict[tuple[str, int], dict[str, Any]]) -> None:
    """Throughput, latency percentiles and CPU from what the generator processes reported."""
    producers = [r for (role, _), r in results.items() if role == "producer"]
    consumers = [r for (role, _), r in results.items() if role == "consumer"]
    stats.sent = sum(r["sent"] for r in producers)
    stats.received = sum(r["received"] for r in consumers)
    stats.loadgen_cpu_s = round(
        stats.loadgen_cpu_s + sum(r["cpu_s"] for r in producers + consumers), 3
    )
    firsts = [r["first_send_ns"] for r in producers if r["first_send_ns"]]
    lasts_sent = [r["last_send_ns"] for r in producers if r["last_send_ns"]]
    lasts = [r["last_recv_ns"] for r in consumers if r["last_recv_ns"]]
    if firsts and lasts and max(lasts) > min(firsts):
        stats.seconds = round((max(lasts) - min(firsts)) / 1e9, 3)
        stats.msgs_per_s = round(stats.received / ((max(lasts) - min(firsts)) / 1e9), 1)
    busy_s = stats.seconds or stats.wall_s
    if busy_s > 0:
        stats.producer_cpu_util = round(max([r["cpu_s"] for r in producers] or [0]) / busy_s, 3)
        stats.consumer_cpu_util = round(max([r["cpu_s"] for r in consumers] or [0]) / busy_s, 3)
    if firsts and lasts_sent and max(lasts_sent) > min(firsts):
        stats.offered_msgs_per_s = round(stats.sent / ((max(lasts_sent) - min(firsts)) / 1e9), 1)
    merged = array("q")
    for r in consumers:
        merged.extend(r["latencies_ns"])
    ordered = sorted(merged)
    stats.samples = len(ordered)
    stats.p50_ms = percentile_ms(ordered, 0.50)
    stats.p99_ms = percentile_ms(ordered, 0.99)
    stats.max_ms = percentile_ms(ordered, 1.0)
    if stats.received != stats.sent:
        kind = "lost" if stats.received < stats.sent else "duplicated"
        stats.errors.append(
            f"{abs(stats.sent - stats.received)} messages {kind}: "
            f"sent {stats.sent}, received {stats.received}"
        )
    elif stats.sent != stats.planned and not stats.errors:
        stats.errors.append(f"sent {stats.sent} of {stats.planned} planned")


def run_scenario(
    args: argparse.Namespace, name: str, host: str, port: int, server: psutil.Process | None
) -> dict[str, Any]:
    """A flood run then a paced run; returns the scenario's JSON record."""
    n_producers, n_consumers = SCENARIOS[name]
    started = time.monotonic()
    flood = run_once(args, host, port, server, n_producers, n_consumers, args.messages, None, name)
    paced_total = max(n_producers, round(args.rate * args.paced_seconds))
    paced = run_once(
        args, host, port, server, n_producers, n_consumers, paced_total, args.rate, name
    )
    errors = [f"flood: {e}" for e in flood.errors] + [f"paced: {e}" for e in paced.errors]
    server_cpu = (
        None
        if flood.server_cpu_s is None or paced.server_cpu_s is None
        else round(flood.server_cpu_s + paced.server_cpu_s, 3)
    )
    return {
        "scenario": name,
        "producers": n_producers,
        "consumers": n_consumers,
        "size": args.size,
        "persistent": args.persistent,
        "flood_msgs_per_s": flood.msgs_per_s,
        "flood_p50_ms": flood.p50_ms,
        "flood_p99_ms": flood.p99_ms,
        "flood_s": flood.seconds,
        "flood_offered_msgs_per_s": flood.offered_msgs_per_s,
        "paced_rate": args.rate,
        "paced_offered_msgs_per_s": paced.offered_msgs_per_s,
        "paced_achieved_msgs_per_s": paced.msgs_per_s,
        "paced_p50_ms": paced.p50_ms,
        "paced_p99_ms": paced.p99_ms,
        "paced_max_ms": paced.max_ms,
        "received": flood.received + paced.received,
        "sent": flood.sent + paced.sent,
        "flood_received": flood.received,
        "paced_received": paced.received,
        "latency_samples": flood.samples + paced.samples,
        "loadgen_cpu_s": round(flood.loadgen_cpu_s + paced.loadgen_cpu_s, 3),
        "flood_loadgen_cpu_s": flood.loadgen_cpu_s,
        "flood_producer_cpu_util": flood.producer_cpu_util,
        "flood_consumer_cpu_util": flood.consumer_cpu_util,
        "paced_producer_cpu_util": paced.producer_cpu_util,
        "paced_consumer_cpu_util": paced.consumer_cpu_util,
        "server_cpu_s": server_cpu,
        "flood_server_cpu_s": flood.server_cpu_s,
        "flood_wall_s": round(flood.wall_s, 3),
        # Busy CPU of the whole machine minus generator and server: other load
        # (plus loopback softirq work) that makes the figures noisy.
        "other_cpu_s": round(
            flood.host_cpu_s
            + paced.host_cpu_s
            - (flood.loadgen_cpu_s + paced.loadgen_cpu_s)
            - (server_cpu or 0.0),
            3,
        ),
        "host_cpus": psutil.cpu_count(),
        "wall_s": round(time.monotonic() - started, 3),
        "ok": not errors,
        "errors": errors,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    ap.add_argument("--messages", type=int, default=200_000, help="flood run, all producers")
    ap.add_argument("--rate", type=int, default=40_000, help="paced run, msgs/s offered in all")
    ap.add_argument("--paced-seconds", type=float, default=5.0, help="length of the paced run")
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--persistent", action="store_true", help="send with persistent:true")
    ap.add_argument("--target", metavar="HOST:PORT", help="use this running server instead")
    ap.add_argument(
        "--idle-timeout", type=float, default=10.0, help="fail when nothing arrives this long"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="cap on one run, seconds")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.rate <= 0 or args.size < 0 or args.paced_seconds <= 0:
        ap.error("--messages, --rate and --paced-seconds must be positive, --size not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    server: ServerProcess | None = None
    server_ps: psutil.Process | None = None
    workdir: Path | None = None
    if args.target:
        host, _, port_text = args.target.rpartition(":")
        host, port = host or "127.0.0.1", int(port_text)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="pairmq-bench-"))
        try:
            server = start_server(workdir, name="bench")
        except (RuntimeError, TimeoutError) as exc:
            print(f"FAILED: could not start the server: {exc}", file=sys.stderr)
            return 1
        server_ps = psutil.Process(server.proc.pid)
        host, port = server.address
    failed = False
    interrupted = False
    try:
        for name in names:
            record = run_scenario(args, name, host, port, server_ps)
            print(json.dumps(record), flush=True)
            busy_other = record["other_cpu_s"] / max(record["wall_s"], 1e-9)
            if record["server_cpu_s"] is not None and busy_other > 0.25:
                print(
                    f"note {name}: other processes kept {busy_other:.2f} cores busy "
                    "during the run; the figures are noisy",
                    file=sys.stderr,
                    flush=True,
                )
            if not record["ok"]:
                failed = True
                for err in record["errors"]:
                    print(f"FAILED {name}: {err}", file=sys.stderr, flush=True)
            if server is not None and not server.alive():
                print("FAILED: the server process died", file=sys.stderr, flush=True)
                failed = True
                break
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        interrupted = True
    finally:
        if server is not None:
            code = server.stop()
            if failed:
                tail = server.logs()[-4000:]
                print(f"--- server log ({server.log_path}) ---\n{tail}", file=sys.stderr)
            elif code not in (0, None):
                print(f"note: server exited with code {code}", file=sys.stderr)
            if workdir is not None and not failed:
                shutil.rmtree(workdir, ignore_errors=True)
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
