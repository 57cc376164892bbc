"""Colocated backups (docs/cluster.md, "Colocated backups"; issue 38): a colocated
member's CPU and RSS with one live and one hosted backup under load, against a live alone.

Run from the repository root:

    .venv/bin/python benchmarks/colocated.py                       # 3 rounds, 20 s, 1000/s
    .venv/bin/python benchmarks/colocated.py --rounds 5 --seconds 30 --rate 2000 --size 1024

Two cases, alternating (colocated, alone, colocated, alone, ...), each on fresh processes:

- colocated: two members m0 and m1 (tests/support/colocated.py's `ColocatedCluster`,
  `--policy colocated --request-backup --max-backups 1`, a real 3-member etcd as the
  pairs' arbiter, started for the round): m0 hosts m1's backup and m1 hosts m0's, each a
  child process of its member. Both lives backed up and in sync before the load starts.
- alone: one standalone `pairmq server` (no [ha], no cluster): "a live alone".

The load is the same on every live: one producer process (pairmq.client, `send_async`
of persistent --size byte messages, each confirmed by a receipt, at most --window
unconfirmed) offering --rate msgs/s, and one consumer process (pairmq.client,
client-individual, every message ACKed) draining the live's own queue. After --warmup
seconds of load, a window of --seconds is measured on member m0's two processes, its
live and its hosted backup (m1's), separately (psutil, not their children): CPU seconds
(user + system) used in the window, RSS at its end and the peak of RSS sampled every
0.5 s; and the same of the lone server. `member` is the sum of m0's live and hosted
backup; `cpu_ratio` and `rss_ratio` are member / alone of the same round. The achieved
rates (sent = confirmed by the window's end, give or take --window; consumed) show a case
that did not keep the offered rate. m1's figures are in the JSON lines (`peer`), for
symmetry.

At these rates a server's CPU follows its wake-ups (journal commits, fsyncs) more than
its messages, and a live with a backup commits less often than one alone (its receipts
wait for the backup, so more records go in each commit): the CPU ratio depends on
--rate (docs/benchmarks.md, "Colocated backups (issue 38)"). Compare at several rates.

One JSON line per case and round, then a summary line (medians, [min, max]) and a table.
Every message is numbered: a lost or duplicated one, a live without its backup at the end
of the window, or any other error exits 1.
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
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import start_server  # noqa: E402
from tests.support.colocated import ColocatedCluster, children  # noqa: E402
from tests.support.etcd import EtcdCluster, missing  # noqa: E402

import pairmq.client  # noqa: E402
from benchmarks.ha_replication import BenchError, log_problems  # noqa: E402
from benchmarks.loadgen import GeneratorPool, host_busy_cpu  # noqa: E402

QUEUE = "/queue/colocated.bench"
SEQ = 10  # digits of the sequence number at the start of every body
SAMPLE_S = 0.5
SETUP_TIMEOUT_S = 30.0
MIB = 1024 * 1024


# --------------------------------------------------------------------------- load


@dataclass(frozen=True)
class Load:
    """One live's load: its producer's and consumer's settings."""

    index: int
    url: str
    queue: str
    rate: float
    size: int
    window: int
    prefetch: int


def _producer(load: Load, events: Any, start: Any, stop: Any, sent: Any) -> None:
    """Paced `send_async` until `stop`, then `flush()`; reports what it sent."""
    result: dict[str, Any] = {"sent": 0}
    client = None
    try:
        client = pairmq.client.connect(load.url, send_window=load.window,
                                       name=f"bench-producer-{load.index}")
        pad = b"x" * max(0, load.size - SEQ)
        events.put(("ready", "producer", load.index, None))
        start.wait()
        began = time.monotonic()
        k = 0
        while not stop.is_set():
            due = int((time.monotonic() - began) * load.rate) + 1
            while k < due and not stop.is_set():
                client.send_async(load.queue, b"%010d" % k + pad)
                k += 1
                sent[load.index] = k
            time.sleep(max(0.001, began + k / load.rate - time.monotonic()))
        client.flush(60)
        result["sent"] = k
        result["unconfirmed"] = client.stats()["unconfirmed"]
    except Exception as e:
        result["error"] = f"producer {load.index}: {type(e).__name__}: {e}"
    finally:
        if client is not None:
            client.close(5)
        events.put(("done", "producer", load.index, result))


def _consumer(load: Load, events: Any, stop: Any, consumed: Any) -> None:
    """ACKs every message until `stop`; reports how often each number came."""
    seen = bytearray()
    result: dict[str, Any] = {}
    client = None
    try:
        client = pairmq.client.connect(load.url, name=f"bench-consumer-{load.index}")
        sub = client.subscribe(load.queue, ack="client-individual",
                               headers={"prefetch-count": str(load.prefetch)})
        events.put(("ready", "consumer", load.index, None))
        count = 0
        while not stop.is_set():
            message = sub.receive(0.1)
            if message is None:
                continue
            k = int(message.body[:SEQ])
            if k >= len(seen):
                seen.extend(bytes(max(k + 1 - len(seen), 65536)))
            if seen[k] < 255:
                seen[k] += 1
            client.ack(message)
            count += 1
            consumed[load.index] = count
    except Exception as e:
        result["error"] = f"consumer {load.index}: {type(e).__name__}: {e}"
    finally:
        if client is not None:
            client.close(5)
        result["seen"] = bytes(seen)
        events.put(("done", "consumer", load.index, result))


class Loads:
    """A producer and a consumer process per live, all started together (loadgen.py's
    GeneratorPool runs them and gathers their reports)."""

    def __init__(self, loads: list[Load]) -> None:
        ctx = mp.get_context("fork")
        self.loads = loads
        self.pool = GeneratorPool(ctx, ctx.Queue(), [])
        self.start_event, self.stop_producing, self.stop_consuming = (
            ctx.Event(), ctx.Event(), ctx.Event())
        self.sent = ctx.RawArray("q", len(loads))
        self.consumed = ctx.RawArray("q", len(loads))
        for load in loads:
            self.pool.launch("consumer", load.index, _consumer, (
                load, self.pool.events, self.stop_consuming, self.consumed))
            self.pool.launch("producer", load.index, _producer, (
                load, self.pool.events, self.start_event, self.stop_producing, self.sent))

    def _take(self, timeout: float) -> None:
        """One report at most; a generator that failed raises its error."""
        self.pool.take(timeout)
        if self.pool.errors:
            raise BenchError(self.pool.errors[0])

    def wait_ready(self) -> None:
        count = len(self.loads)
        if not (self.pool.wait_ready("consumer", count, SETUP_TIMEOUT_S)
                and self.pool.wait_ready("producer", count, SETUP_TIMEOUT_S)):
            raise BenchError(f"load generators not ready: {'; '.join(self.pool.errors)}")
        self.start_event.set()

    def poll(self) -> None:
        """Every report already there: a generator that ended early raises its error."""
        while not self.pool.events.empty():
            self._take(0.01)

    def counts(self) -> tuple[list[int], list[int]]:
        return list(self.sent), list(self.consumed)

    def finish(self, timeout: float) -> list[dict[str, Any]]:
        """Stop the producers, let the consumers drain what was sent, check every number."""
        self.stop_producing.set()
        until = time.monotonic() + timeout
        producers = {("producer", load.index) for load in self.loads}
        while not producers <= set(self.pool.results) and time.monotonic() < until:
            self._take(0.1)
        out = []
        for load in self.loads:
            sent = self.pool.results.get(("producer", load.index), {}).get("sent")
            if sent is None:
                raise BenchError(f"producer {load.index} did not report")
            while self.consumed[load.index] < sent and time.monotonic() < until:
                time.sleep(0.05)
            out.append({"sent": sent})
        time.sleep(0.3)  # anything more than was sent would be a duplicate
        self.stop_consuming.set()
        self.pool.collect(max(0.1, until - time.monotonic()))
        if self.pool.errors:
            raise BenchError("; ".join(self.pool.errors))
        for load, row in zip(self.loads, out, strict=True):
            seen = self.pool.results.get(("consumer", load.index), {}).get("seen")
            if seen is None:
                raise BenchError(f"consumer {load.index} did not report")
            row["lost"] = seen[:row["sent"]].count(0) + max(0, row["sent"] - len(seen))
            row["duplicated"] = sum(c - 1 for c in seen if c > 1)
            row["unknown"] = sum(1 for c in seen[row["sent"]:] if c)
        return out

    def kill(self) -> None:
        self.stop_producing.set()
        self.stop_consuming.set()
        self.start_event.set()
        for p in self.pool.procs.values():
            p.join(5)
            if p.is_alive():
                p.terminate()


# --------------------------------------------------------------------------- measuring


class Watched:
    """One server process: CPU seconds in the window, RSS at its end and its peak."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.cpu0 = self._cpu()
        self.peak = 0
        self.sample()

    def _cpu(self) -> float:
        t = self.proc.cpu_times()  # this process's own: not its children's
        return t.user + t.system

    def sample(self) -> None:
        self.peak = max(self.peak, self.proc.memory_info().rss)

    def end(self) -> dict[str, Any]:
        self.sample()
        return {"pid": self.proc.pid, "cpu_s": round(self._cpu() - self.cpu0, 3),
                "rss_mib": round(self.proc.memory_info().rss / MIB, 1),
                "peak_rss_mib": round(self.peak / MIB, 1)}


def summed(*parts: dict[str, Any]) -> dict[str, Any]:
    return {key: round(sum(p[key] for p in parts), 3 if key == "cpu_s" else 1)
            for key in ("cpu_s", "rss_mib", "peak_rss_mib")}


def measure(args: argparse.Namespace, loads: Loads, watched: dict[str, Watched],
            check: Any = None) -> dict[str, Any]:
    """The load for --warmup, then the measured window of --seconds."""
    loads.wait_ready()
    time.sleep(args.warmup)
    for w in watched.values():
        w.cpu0 = w._cpu()
        w.peak = 0
        w.sample()
    sent0, consumed0 = loads.counts()
    host0 = host_busy_cpu()
    t0 = time.monotonic()
    while (left := t0 + args.seconds - time.monotonic()) > 0:
        time.sleep(min(SAMPLE_S, left))
        for w in watched.values():
            w.sample()
        loads.poll()
    seconds = time.monotonic() - t0
    sent1, consumed1 = loads.counts()
    figures: dict[str, Any] = {name: w.end() for name, w in watched.items()}
    host = host_busy_cpu() - host0
    in_sync = check() if check is not None else None
    checked = loads.finish(args.give_up)
    return {"seconds": round(seconds, 2),
            "sent_per_s": [round((b - a) / seconds) for a, b in zip(sent0, sent1, strict=True)],
            "consumed_per_s": [round((b - a) / seconds)
                               for a, b in zip(consumed0, consumed1, strict=True)],
            "host_cpu_s": round(host, 2), "backed_up_at_end": in_sync, **figures,
            "lost": sum(c["lost"] for c in checked),
            "duplicated": sum(c["duplicated"] for c in checked),
            "unknown": sum(c["unknown"] for c in checked),
            "messages": [c["sent"] for c in checked]}


def load_for(args: argparse.Namespace, i: int, port: int) -> Load:
    return Load(i, f"failover:(stomp://127.0.0.1:{port})", f"{QUEUE}.m{i}", args.rate,
                args.size, args.window, args.prefetch)


def report_log_problems(case: str, workdir: Path, logs: list[Path]) -> None:
    """Warnings, errors and tracebacks of the servers' logs, on stderr (but the warning
    every server here gives: no [security] rules, as the tests' servers run)."""
    problems = [f"{path.relative_to(workdir)}: {line.split(': ', 1)[-1]}"
                for path in logs for line in log_problems([path], 1000)
                if "No [security] rules" not in line]
    if problems:
        print(json.dumps({"kind": "log_problems", "case": case, "lines": problems[:20]}),
              file=sys.stderr, flush=True)


def colocated_round(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    etcd = EtcdCluster(workdir / "etcd")
    members = None
    loads = None
    try:
        t0 = time.monotonic()
        etcd.start()
        members = ColocatedCluster(workdir, 2, etcd=etcd.url, max_backups=1).start()
        started = time.monotonic() - t0
        members.wait_backed_up(timeout=args.give_up)
        backed_up = time.monotonic() - t0
        if [members.host_of(0), members.host_of(1)] != [1, 0]:
            raise BenchError(f"backups hosted by {[members.host_of(0), members.host_of(1)]}"
                             ", not [1, 0]")
        watched: dict[str, Watched] = {}
        for i, role in ((0, ""), (1, "peer_")):
            server = members.servers[i]
            assert server is not None
            hosted = children(server.proc.pid)
            published = [h["pid"] for h in members.colocated(i)["hosted"]]  # type: ignore[index]
            if len(hosted) != 1 or hosted != published:
                raise BenchError(f"member {i}: children {hosted}, hosted backups {published}")
            watched[f"{role}live"] = Watched(server.proc.pid)
            watched[f"{role}hosted_backup"] = Watched(hosted[0])
        loads = Loads([load_for(args, i, members.stomp[i]) for i in range(2)])
        row = measure(args, loads, watched,
                      check=lambda: [members.backed_up(0), members.backed_up(1)])
        loads = None
        row["member"] = summed(row["live"], row["hosted_backup"])
        row["peer"] = summed(row.pop("peer_live"), row.pop("peer_hosted_backup"))
        row["start_s"] = round(started, 1)
        row["backed_up_s"] = round(backed_up, 1)
        return row
    finally:
        if loads is not None:
            loads.kill()
        if members is not None:
            members.stop()
            logs = [s.log_path for s in members.servers if s is not None]
            report_log_problems("colocated", workdir,
                                [*logs, *sorted(workdir.glob("data-*/backups/*/server.log"))])
        etcd.close()


def alone_round(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    server = start_server(workdir, name="alone")
    loads = None
    try:
        watched = {"live": Watched(server.proc.pid)}
        loads = Loads([load_for(args, 0, server.port)])
        row = measure(args, loads, watched)
        loads = None
        return row
    finally:
        if loads is not None:
            loads.kill()
        server.stop(30)
        report_log_problems("alone", workdir, [server.log_path])


# --------------------------------------------------------------------------- report


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 3),
            "range": [round(min(values), 3), round(max(values), 3)]}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    col = [r for r in rows if r["case"] == "colocated"]
    alone = [r for r in rows if r["case"] == "alone"]
    out: dict[str, Any] = {"kind": "summary", "rounds": min(len(col), len(alone))}
    for name, rs, part in (("live", col, "live"), ("hosted_backup", col, "hosted_backup"),
                           ("member", col, "member"), ("alone", alone, "live")):
        out[name] = {key: spread([r[part][key] for r in rs])
                     for key in ("cpu_s", "rss_mib", "peak_rss_mib")}
    pairs = list(zip(col, alone, strict=False))
    for key, ratio in (("cpu_s", "cpu_ratio"), ("rss_mib", "rss_ratio"),
                       ("peak_rss_mib", "peak_rss_ratio")):
        out[ratio] = spread([c["member"][key] / a["live"][key] for c, a in pairs])
    out["backup_over_live_cpu"] = spread([c["hosted_backup"]["cpu_s"] / c["live"]["cpu_s"]
                                          for c in col])
    out["colocated_sent_per_s"] = spread([min(r["sent_per_s"]) for r in col])
    out["colocated_consumed_per_s"] = spread([min(r["consumed_per_s"]) for r in col])
    out["alone_sent_per_s"] = spread([r["sent_per_s"][0] for r in alone])
    out["alone_consumed_per_s"] = spread([r["consumed_per_s"][0] for r in alone])
    return out


def table(s: dict[str, Any], args: argparse.Namespace) -> str:
    def cell(d: dict[str, Any], digits: int = 1) -> str:
        lo, hi = d["range"]
        return f"{d['median']:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"

    lines = [f"| {args.seconds:g} s at {args.rate:g} msgs/s per live, {args.size} B | "
             "m0's live | m0's hosted backup (of m1) | member m0 (sum) | a live alone | "
             "member / alone |",
             "|---|---|---|---|---|---|"]
    for key, label, digits in (("cpu_s", "CPU seconds", 2), ("rss_mib", "RSS at end, MiB", 1),
                               ("peak_rss_mib", "RSS peak, MiB", 1)):
        ratio = {"cpu_s": "cpu_ratio", "rss_mib": "rss_ratio",
                 "peak_rss_mib": "peak_rss_ratio"}[key]
        lines.append(f"| {label} | {cell(s['live'][key], digits)} | "
                     f"{cell(s['hosted_backup'][key], digits)} | "
                     f"{cell(s['member'][key], digits)} | {cell(s['alone'][key], digits)} | "
                     f"**{cell(s[ratio], 2)}** |")
    lines.append(f"| achieved msgs/s, sent / consumed (slower live) | "
                 f"{cell(s['colocated_sent_per_s'], 0)} / "
                 f"{cell(s['colocated_consumed_per_s'], 0)} | | | "
                 f"{cell(s['alone_sent_per_s'], 0)} / {cell(s['alone_consumed_per_s'], 0)} | |")
    return "\n".join(lines)


def failed(row: dict[str, Any]) -> bool:
    return bool(row.get("error") or row.get("lost") or row.get("duplicated")
                or row.get("unknown")
                or row.get("backed_up_at_end") not in (None, [True, True]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of both cases, alternating")
    p.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    p.add_argument("--warmup", type=float, default=3.0, help="load before the window")
    p.add_argument("--rate", type=float, default=1000.0, help="msgs/s offered to each live")
    p.add_argument("--size", type=int, default=1024, help="message body bytes (>= 10)")
    p.add_argument("--window", type=int, default=100, help="unconfirmed sends at most")
    p.add_argument("--prefetch", type=int, default=100)
    p.add_argument("--give-up", type=float, default=120.0)
    p.add_argument("--keep", action="store_true", help="keep the work directories")
    args = p.parse_args(argv)
    if args.size < SEQ or args.rate <= 0 or args.seconds <= 0 or args.rounds < 1:
        p.error(f"--size must be at least {SEQ}; --rate, --seconds and --rounds positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = missing()
    if reason is not None:
        print(reason, file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    bad = False
    for n in range(1, args.rounds + 1):
        for case, run in (("colocated", colocated_round), ("alone", alone_round)):
            workdir = Path(tempfile.mkdtemp(prefix=f"pairmq-colocated-{case}-"))
            try:
                row = {"kind": "round", "case": case, "round": n, **run(args, workdir)}
            except (BenchError, TimeoutError, RuntimeError, OSError, psutil.Error) as e:
                row = {"kind": "round", "case": case, "round": n,
                       "error": f"{type(e).__name__}: {e}", "workdir": str(workdir)}
            print(json.dumps(row), flush=True)
            if failed(row):
                bad = True
                row.setdefault("workdir", str(workdir))
            else:
                rows.append(row)
            if not args.keep and "workdir" not in row:
                shutil.rmtree(workdir, ignore_errors=True)
    if any(r["case"] == "colocated" for r in rows) and any(r["case"] == "alone" for r in rows):
        summary = summarise(rows)
        print(json.dumps(summary), flush=True)
        print(table(summary, args), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
