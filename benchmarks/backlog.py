"""A pair that holds millions of waiting messages (issue 18): memory, pauses and roles as the
backlog builds, then failover, restart and drain times.

Run from the repository root:

    .venv/bin/python benchmarks/backlog.py --messages 10000000
    .venv/bin/python benchmarks/backlog.py --messages 1000000 --out before.jsonl
    .venv/bin/python benchmarks/backlog.py --messages 10000000 --stream
    .venv/bin/python benchmarks/backlog.py --plot before.jsonl after.jsonl --png docs/backlog.png

1. A replication pair with the default intervals (heartbeat 500 ms, activation 2000 ms)
   and a witness, formed (primary ACTIVE, backup PASSIVE).
2. Fill: one pairmq client sends --messages persistent messages of --size bytes to one
   queue with `send_batch_async`, --batch a frame, at most --in-flight frames unconfirmed,
   nobody consuming. Every --sample messages one JSON line: messages so far, the fill
   rate since the last line, both servers' RSS, their HA states, role changes so far,
   the longest pause so far (event-loop lag or garbage collection, from the servers'
   logs) and the longest of them in which the loop's own thread was busy (its CPU time:
   on 2 cores, three busy processes also wait for a core). Filling stops early
   (`stopped`) if a server's RSS passes --max-rss-mb, so that the machine survives a
   build whose memory grows with the backlog.
3. Failover: kill -9 of the active; time until the other one confirms a persistent SEND.
4. Restart: kill -9 of that one too, then a standalone server on its data directory;
   time until it confirms a persistent SEND.
5. Drain: every message consumed from the restarted server (client-individual acks),
   each checked once: msgs/s, lost, duplicated.

With --stream the backlog is a stream's (`/stream/backlog`, docs/streams.md) and step 5
is replaced: between 2 and 3, a Spark batch read (`spark.read.format("pairmq")`, local[2],
--read-partitions offset ranges, through the failover URL of both servers) of the whole
stream, checked for count and distinct offsets, while the pair is sampled every 2 s (RSS,
states, role changes: it must stay in sync); after the restart, the restarted server's
(first, next) offsets, which must be (0, messages sent). The stream's retention
(`--max-bytes`) is set to keep every message.

A summary line ends the output (also written to --out with the samples, for --plot).
--plot draws RSS and longest pause against the backlog for one or more runs (their
--label) into --png, with matplotlib.
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
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tests.serverproc import free_port, start_server  # noqa: E402
from tests.support.admin import admin_request, admin_user_flags  # noqa: E402

import pairmq.client  # noqa: E402
from benchmarks.ha_replication import (  # noqa: E402
    BenchError,
    Pair,
    drain_queue,
    ha_state,
    probe_send,
)
from benchmarks.progress import progress_bar  # noqa: E402

QUEUE = "/queue/backlog"
STREAM = "backlog"
PAUSE = re.compile(r"(?:event loop was held for (\d+) ms|paused the server for ([\d.]+) s)")
BUSY = re.compile(r"event loop was held for (\d+) ms .*its thread had (\d+) ms of CPU")
SWITCHED = "Local server switched to"
LOGGED_FROM_MS = 100  # the servers log every hold of the event loop from this long on


def longest_pause_s(log: Path) -> float:
    """The longest event-loop hold or collection pause a server's log reports (seconds)."""
    longest = 0.0
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0.0
    for held_ms, gc_s in PAUSE.findall(text):
        longest = max(longest, int(held_ms) / 1000 if held_ms else float(gc_s))
    return longest


def longest_busy_s(log: Path) -> float:
    """The longest hold during which the loop's thread itself ran (its CPU time, which a
    machine short of cores does not inflate), in seconds."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0.0
    return max((min(int(held), int(cpu)) / 1000 for held, cpu in BUSY.findall(text)),
               default=0.0)


def role_changes(log: Path, formed: int) -> int:
    """State changes logged after the first `formed` ones (those of forming the pair)."""
    try:
        return max(0, log.read_text(errors="replace").count(SWITCHED) - formed)
    except OSError:
        return 0


def rss_mb(server: Any) -> float | None:
    try:
        return round(psutil.Process(server.proc.pid).memory_info().rss / 2**20, 1)
    except psutil.Error:
        return None


def wait_confirmed(host: str, port: int, timeout: float) -> float:
    """Seconds until the server confirms a persistent SEND (probes every 50 ms)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if probe_send(host, port, "/queue/probe", 2.0).confirmed:
            return time.monotonic() - started
        time.sleep(0.05)
    raise BenchError(f"{host}:{port} confirmed nothing within {timeout:.0f} s")


def destination(args: argparse.Namespace) -> str:
    return f"/stream/{STREAM}" if args.stream else QUEUE


def over_50ms(address: str) -> tuple[int | None, int | None]:
    """How often a server's event-loop timer ran over 50 ms late since it started, and how
    many collections paused it over 50 ms (the issue's goal: neither), from the histograms
    of its /metrics (its management port at `address`); None when it does not answer."""
    try:
        code, _headers, text = admin_request(address, "/metrics")
    except OSError:
        return None, None
    if code != 200 or not isinstance(text, str):
        return None, None
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_count"):
                counts[family.name] = counts.get(family.name, 0) + sample.value
            elif sample.name.endswith("_bucket") and sample.labels.get("le") == "0.05":
                counts[family.name] = counts.get(family.name, 0) - sample.value
    return (int(counts.get("pairmq_event_loop_lag_seconds", 0)),
            int(counts.get("pairmq_gc_pause_seconds", 0)))


def pair_over_50ms(pair: Pair) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for role in Pair.ROLES:
        turns, collections = over_50ms(pair.admin[role])
        out[f"turns_over_50ms_{role}"] = turns
        out[f"collections_over_50ms_{role}"] = collections
    return out


def pair_sample(pair: Pair, formed: dict[str, int]) -> dict[str, Any]:
    """Both servers' RSS and HA states, role changes since the pair formed (`formed`: the
    state changes each log had then), the longest pauses their logs report and how many
    turns and collections went over 50 ms."""
    servers = pair.servers
    return {**pair_over_50ms(pair),
            **{f"rss_mb_{r}": rss_mb(servers[r]) for r in Pair.ROLES},
            **{f"state_{r}": ha_state(pair.status(r)) for r in Pair.ROLES},
            "role_changes": sum(role_changes(servers[r].log_path, formed[r])
                                for r in Pair.ROLES),
            "longest_pause_s": max(longest_pause_s(servers[r].log_path) for r in Pair.ROLES),
            "longest_busy_s": max(longest_busy_s(servers[r].log_path) for r in Pair.ROLES)}


def fill(args: argparse.Namespace, pair: Pair, formed: dict[str, int], emit
         ) -> dict[str, Any]:
    """Send the backlog, sampling as it grows; returns what the fill ended with."""
    servers = pair.servers
    url = f"stomp://{servers['primary'].host}:{servers['primary'].port}"
    target = destination(args)
    pad = b"x" * args.size
    sent = 0
    stopped = None
    started = last_t = time.monotonic()
    last_n = 0
    with pairmq.client.connect(url, send_window=args.in_flight) as client, \
            progress_bar("filling the backlog", args.messages) as advance_to:
        while sent < args.messages:
            count = min(args.batch, args.messages - sent)
            client.send_batch_async(target,
                                    [(pad, {"g": str(sent + i)}) for i in range(count)])
            sent += count
            advance_to(sent)
            if sent % args.sample < args.batch or sent == args.messages:
                client.flush()
                now = time.monotonic()
                row = {"kind": "sample", "label": args.label, "messages": sent,
                       "elapsed_s": round(now - started, 1),
                       "fill_msgs_per_s": round((sent - last_n) / (now - last_t)),
                       **pair_sample(pair, formed)}
                emit(row)
                last_t, last_n = now, sent
                biggest = max((row[f"rss_mb_{r}"] or 0) for r in Pair.ROLES)
                if biggest > args.max_rss_mb:
                    stopped = f"a server's RSS passed {args.max_rss_mb} MB at {sent} messages"
                    break
        client.flush()
    return {"sent": sent, "fill_s": round(time.monotonic() - started, 1),
            "fill_msgs_per_s": round(sent / (time.monotonic() - started)), "stopped": stopped}


def spark_read(args: argparse.Namespace, pair: Pair, formed: dict[str, int], emit,
               rows: int) -> dict[str, Any]:
    """Read the whole stream with Spark while sampling the pair every 2 s."""
    from tests.support.spark import spark_session

    urls = ",".join(f"stomp://{pair.servers[r].host}:{pair.servers[r].port}"
                    for r in Pair.ROLES)
    spark = spark_session("local[2]")
    samples: list[dict[str, Any]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(2.0):
            row = {"kind": "read_sample", "label": args.label, **pair_sample(pair, formed)}
            samples.append(row)
            emit(row)

    watcher = threading.Thread(target=watch, daemon=True)
    df = (spark.read.format("pairmq").option("servers", f"failover:({urls})")
          .option("stream", STREAM).option("startingOffsets", "earliest")
          .option("endingOffsets", str(rows)).option("minPartitions", str(args.read_partitions))
          .option("includeHeaders", "true")  # every column, as the figures in the docs
          .load())
    started = time.monotonic()
    watcher.start()
    try:
        checked = df.selectExpr("count(*) AS n", "count(DISTINCT offset) AS d",
                                "min(offset) AS lo", "max(offset) AS hi").first()
    finally:
        done.set()
        watcher.join()
    elapsed = time.monotonic() - started
    exact = (checked["n"], checked["d"], checked["lo"], checked["hi"]) == (rows, rows, 0,
                                                                          rows - 1)
    in_sync = all((s["state_primary"], s["state_backup"]) == ("ACTIVE", "PASSIVE")
                  for s in samples)
    return {"spark_read_s": round(elapsed, 1),
            "spark_read_rows_per_s": round(checked["n"] / elapsed),
            "spark_read_exact": exact,
            "spark_read_result": {k: checked[k] for k in ("n", "d", "lo", "hi")},
            "read_samples": len(samples),
            "in_sync_during_read": in_sync,
            "role_changes_after_read": samples[-1]["role_changes"] if samples else None,
            **{f"max_rss_mb_{r}_during_read": max((s[f"rss_mb_{r}"] or 0) for s in samples)
               if samples else None for r in Pair.ROLES}}


def stream_offsets(host: str, port: int) -> tuple[int, int]:
    """(first, next) offsets of the benchmark's stream on a server."""
    from tests.integration.rawstomp import connect
    from tests.support.streams import stream_info

    client, _ = connect((host, port), timeout=30)
    with client:
        return stream_info(client, f"/stream/{STREAM}")


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-backlog-", dir=args.workdir))
    out = open(args.out, "a") if args.out else None  # noqa: SIM115

    def emit(row: dict[str, Any]) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if out is not None:
            out.write(line + "\n")
            out.flush()

    # a stream keeps the whole backlog (retention's default, 1 GiB, would remove most of it)
    extra = ("--max-bytes", str(args.messages * (args.size + 512))) if args.stream else ()
    pair = Pair(workdir, extra=extra)
    restarted = None
    summary: dict[str, Any] = {"kind": "summary", "label": args.label,
                               "messages": args.messages, "size": args.size}
    try:
        pair.start_pair()
        formed = {role: pair.servers[role].log_path.read_text(errors="replace")
                  .count(SWITCHED) for role in Pair.ROLES}
        summary.update(fill(args, pair, formed, emit))
        for role in Pair.ROLES:
            summary[f"longest_pause_s_{role}"] = longest_pause_s(pair.servers[role].log_path)
            summary[f"rss_mb_{role}"] = rss_mb(pair.servers[role])
        summary["states_after_fill"] = {r: ha_state(pair.status(r)) for r in Pair.ROLES}
        in_sync = summary["states_after_fill"] == {"primary": "ACTIVE", "backup": "PASSIVE"}
        summary["in_sync_after_fill"] = in_sync
        if args.stream:
            summary.update(spark_read(args, pair, formed, emit, summary["sent"]))
        pair.servers["primary"].kill()
        backup = pair.servers["backup"]
        try:
            summary["failover_s"] = round(wait_confirmed(backup.host, backup.port,
                                                         args.give_up), 2)
        except BenchError as e:
            summary["failover_s"] = None
            summary["failover_error"] = str(e)
        backup.kill()
        pair.stop()
        started = time.monotonic()
        admin = f"{backup.host}:{free_port()}"
        restarted = start_server(workdir, *extra, "--admin", admin, *admin_user_flags(),
                                 name="backup", port=backup.port,
                                 start_timeout=args.give_up * 5)
        summary["restart_s"] = round(wait_confirmed(restarted.host, restarted.port,
                                                    args.give_up), 2)
        summary["restart_log"] = [line for line in restarted.logs().splitlines()
                                  if "Recovered" in line][-1:]
        summary["restart_total_s"] = round(time.monotonic() - started, 2)
        emit({**summary, "kind": "restarted"})  # the figures so far, before a long drain
        if args.stream:
            summary["offsets_after_restart"] = stream_offsets(restarted.host, restarted.port)
            return 0 if summary["offsets_after_restart"] == (0, summary["sent"]) \
                and summary.get("spark_read_exact") and summary.get("failover_s") else 1
        drained = drain_queue(restarted.host, restarted.port, QUEUE, summary["sent"],
                              size=args.size, timeout=args.give_up * 20)
        summary.update(drain_s=drained.seconds,
                       drain_msgs_per_s=round(drained.unique / drained.seconds)
                       if drained.seconds else None,
                       lost=drained.lost, duplicated=drained.duplicated,
                       drain_errors=drained.errors[:3],
                       longest_pause_s_restarted=longest_pause_s(restarted.log_path))
        summary["turns_over_50ms_restarted"], summary["collections_over_50ms_restarted"] = \
            over_50ms(admin)
    finally:
        pair.stop()
        if restarted is not None:
            restarted.stop()
        emit(summary)
        if out is not None:
            out.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if not summary.get("drain_errors") and summary.get("failover_s") else 1


def plot(paths: list[str], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rss, pause) = plt.subplots(1, 2, figsize=(11, 4.2))
    for path in paths:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
        samples = [r for r in rows if r.get("kind") == "sample"]
        if not samples:
            continue
        label = samples[0].get("label") or Path(path).stem
        millions = [r["messages"] / 1e6 for r in samples]
        for role, style in (("primary", "-"), ("backup", "--")):
            rss.plot(millions, [r[f"rss_mb_{role}"] for r in samples], style,
                     label=f"{label}, {role}")
        # the servers log holds from 100 ms: less is drawn at 100 ("none logged")
        pause.plot(millions, [max(r["longest_pause_s"] * 1000, LOGGED_FROM_MS)
                              for r in samples], label=label)
    rss.set(xlabel="messages waiting (millions)", ylabel="RSS (MB)", title="Memory")
    pause.set(xlabel="messages waiting (millions)", ylabel="longest pause so far (ms)",
              title="Longest event-loop hold or GC pause", yscale="log")
    pause.set_ylim(bottom=LOGGED_FROM_MS * 0.9)
    pause.text(0.02, LOGGED_FROM_MS * 1.03, "none logged (under 100 ms)", fontsize=8,
               color="grey", transform=pause.get_yaxis_transform())
    pause.axhline(2000, color="grey", linewidth=0.8, linestyle=":")
    pause.text(0.02, 2100, "activation_interval_ms", fontsize=8, color="grey",
               transform=pause.get_yaxis_transform())
    for ax in (rss, pause):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--batch", type=int, default=1000, help="messages per SEND frame")
    ap.add_argument("--in-flight", type=int, default=16, help="frames unconfirmed at most")
    ap.add_argument("--sample", type=int, default=250_000, help="messages between samples")
    ap.add_argument("--max-rss-mb", type=float, default=6000,
                    help="stop filling once a server's RSS passes this")
    ap.add_argument("--give-up", type=float, default=120.0,
                    help="seconds a failover or restart may take before it counts as failed")
    ap.add_argument("--label", default="", help="names this run in the plot")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file")
    ap.add_argument("--workdir", default=None, help="where data directories go (default tmp)")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    ap.add_argument("--plot", nargs="+", default=None, metavar="JSONL",
                    help="only draw these runs' samples into --png")
    ap.add_argument("--png", default="backlog.png")
    ap.add_argument("--stream", action="store_true",
                    help="a stream's backlog, read by Spark (see above)")
    ap.add_argument("--read-partitions", type=int, default=4,
                    help="offset ranges of the Spark read (--stream)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        plot(args.plot, args.png)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
