"""The failover client (`pairmq.client`): its own throughput, and failover time as an
application sees it.

Run from the repository root:

    .venv/bin/python benchmarks/client.py --scenario throughput          # 3 rounds of 50,000
    .venv/bin/python benchmarks/client.py --scenario throughput --messages 20000 --rounds 1
    .venv/bin/python benchmarks/client.py --scenario failover            # 20 runs, 500 / 2000 ms
    .venv/bin/python benchmarks/client.py --scenario failover --setting fast --runs 3
    .venv/bin/python benchmarks/client.py --scenario failover --client-option retry_interval=50

--scenario throughput: one blocking client against a standalone server, in two phases
on the same connection:

- send: --messages persistent messages of --size bytes, `send_async` (each with a
  receipt; at most --window unconfirmed, the client's send_window), then `flush()`;
  msgs/s is --messages over first send_async .. flush returned;
- receive: `subscribe(ack="client-individual", prefetch-count --prefetch)`, then
  `receive()` and `ack()` (pipelined, with a receipt) for each message; msgs/s is
  --messages over subscribe .. last ack(). Every body carries its sequence number:
  a lost, duplicated or damaged message fails the run.

Beside it, on a fresh server each, the raw load generator of benchmarks/persistent.py
does the same load: `run_load` with 1 producer and no consumer (the same window), then
one of its consumer processes (first MESSAGE .. last ACK, no receipts) on the backlog.
The two alternate (--rounds; the client first in odd rounds); each round prints one JSON
line with both, the ratios client/raw, the client process's CPU seconds (all its
threads), the server's and the raw generators'; a summary line gives the medians of
the rounds and of the per-round ratios. A ratio near 1 means the broker limits, well
below 1 the client. The default 50,000 messages of 1 KiB stay below a destination's
64 MiB max_size_bytes: more makes the backlog page (both sides alike).

--scenario failover: a pair (benchmarks/failover.py's deployment, replication policy,
--setting defaults = heartbeat 500 / activation 2000 ms, fast = 100 / 300 ms), fresh for
every run (a copy of an empty template). An application thread sends persistent
messages in a loop with the blocking `client.send()` through
failover:(stomp://primary,stomp://backup); after --warmup seconds the active is killed
(SIGKILL). Failover time = just before the kill .. the first send() that returns
confirmed by the new active (the one in flight at the kill, resent with its stamp,
mostly). The client's own FailoverEvent.seconds (its failure .. its new connection) is
reported beside it. The thread sends on for --after seconds, then the queue is drained
from the new active: every confirmed message must be there exactly once. One JSON line
per setting with p50 and max over --runs.

Exit 1 on a lost, duplicated or damaged message, a failed send, or a server problem.
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
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import ServerProcess, start_server  # noqa: E402

import pairmq.client  # noqa: E402
from benchmarks.failover import SETTINGS, TwoServers  # noqa: E402
from benchmarks.ha_replication import (  # noqa: E402
    BenchError,
    drain_queue,
    ha_state,
    is_serving,
)
from benchmarks.loadgen import (  # noqa: E402
    GeneratorPool,
    cpu_seconds,
    host_busy_cpu,
    nearest_rank,
    process_cpu,
)
from benchmarks.persistent import (  # noqa: E402
    DUPLICATE_GRACE_S,
    REPORT_TIMEOUT_S,
    Job,
    Shared,
    generator_main,
    run_load,
    server_log_problems,
)
from pairmq.client import ClientError  # noqa: E402

SEQ = 10  # digits of the sequence number at the start of every body (throughput)
QUEUE = "/queue/client.failover"
TARGET_SEND_MSGS_PER_S = 20_000


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


class Meter:
    """Wall time, this process's CPU (every thread), the server's and the host's."""

    def __init__(self, server: psutil.Process) -> None:
        self.server = server
        self.t0 = self.cpu0 = self.host0 = 0.0
        self.server0: float | None = None

    def start(self) -> Meter:
        self.server0 = process_cpu(self.server)
        self.host0 = host_busy_cpu()
        self.cpu0 = cpu_seconds()
        self.t0 = time.monotonic()
        return self

    def stop(self, end: float | None = None, children_cpu: float = 0.0) -> dict[str, Any]:
        """`end`: the wall clock's end if not now; `children_cpu`: CPU of generator
        processes of this span (counted as ours, not as other load)."""
        seconds = (end or time.monotonic()) - self.t0
        cpu = cpu_seconds() - self.cpu0
        server1 = process_cpu(self.server)
        host = host_busy_cpu() - self.host0
        server = None if server1 is None or self.server0 is None else server1 - self.server0
        return {"seconds": round(seconds, 3), "cpu_s": round(cpu, 3),
                "server_cpu_s": None if server is None else round(server, 3),
                "other_cpu_s": None if server is None else
                round(host - server - cpu - children_cpu, 3)}


def fresh_server(args: argparse.Namespace, label: str) -> tuple[Path, ServerProcess]:
    workdir = Path(tempfile.mkdtemp(prefix=f"pairmq-client-{label}-", dir=args.workdir))
    return workdir, start_server(workdir, name=label)


def finish_server(args: argparse.Namespace, record: dict[str, Any], workdir: Path,
                  server: ServerProcess) -> None:
    errors = record.setdefault("errors", [])
    if not server.alive():
        errors.append("the server died")
    code = server.stop()
    if code not in (0, None):
        errors.append(f"the server exited with code {code}")
    record["server_log_problems"] = server_log_problems(server)
    if errors or args.keep:
        record["workdir"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- throughput


def client_run(args: argparse.Namespace) -> dict[str, Any]:
    """Both phases through one pairmq.client on a fresh server."""
    workdir, server = fresh_server(args, "client")
    record: dict[str, Any] = {"errors": []}
    errors = record["errors"]
    n, dest = args.messages, f"/queue/client.{uuid.uuid4().hex[:10]}"
    pad = b"x" * (args.size - SEQ)
    client = None
    try:
        meter = Meter(psutil.Process(server.proc.pid))
        client = pairmq.client.connect(f"failover:(stomp://{server.host}:{server.port})",
                                       **{"send_window": args.window, **args.client_options})
        meter.start()
        for i in range(n):
            client.send_async(dest, b"%010d" % i + pad)
        client.flush()
        record["send"] = meter.stop()
        unconfirmed = client.stats()["unconfirmed"]
        if unconfirmed:
            errors.append(f"{unconfirmed} sends unconfirmed after flush()")
        seen = bytearray(n)
        counts = {"bad": 0, "redelivered": 0}

        def check(message: pairmq.client.Message) -> None:
            body = message.body
            k = int(body[:SEQ]) if body[:SEQ].isdigit() else -1
            if 0 <= k < n and body[SEQ:] == pad:
                if seen[k] < 255:
                    seen[k] += 1
            else:
                counts["bad"] += 1
            counts["redelivered"] += message.redelivered
            client.ack(message)

        meter.start()
        sub = client.subscribe(dest, ack="client-individual",
                               headers={"prefetch-count": str(args.prefetch)})
        for got in range(n):
            message = sub.receive(args.idle_timeout)
            if message is None:
                errors.append(f"stalled: nothing for {args.idle_timeout:.0f} s after {got} "
                              f"of {n} messages")
                break
            check(message)
        last_ack = time.monotonic()
        while (message := sub.receive(DUPLICATE_GRACE_S)) is not None:
            check(message)  # more than were sent
        client.close()
        client = None
        receive = meter.stop(end=last_ack)
        lost, bad = seen.count(0), counts["bad"]
        duplicated = sum(c - 1 for c in seen if c > 1)
        if lost:
            errors.append(f"{lost} of {n} messages lost")
        if duplicated:
            errors.append(f"{duplicated} duplicate deliveries")
        if bad:
            errors.append(f"{bad} messages with a damaged body or unknown number")
        record.update(receive=receive, lost=lost, duplicated=duplicated,
                      bad_bodies=bad, redelivered=counts["redelivered"])
    except (ClientError, BenchError, RuntimeError, OSError, psutil.Error) as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        if client is not None:
            client.close(0)
        finish_server(args, record, workdir, server)
    return record


def raw_receive(server: ServerProcess, dest: str, total: int, args: argparse.Namespace
                ) -> dict[str, Any]:
    """One of persistent.py's consumer processes on a backlog of `total` messages."""
    ctx = mp.get_context("fork")
    shared = Shared(ctx.Queue(), ctx.Event(), ctx.RawValue("b", 0), ctx.RawArray("q", 1),
                    ctx.RawArray("q", 1))
    errors: list[str] = []
    pool = GeneratorPool(ctx, shared.events, errors)
    deadline = time.monotonic() + args.timeout
    meter = Meter(psutil.Process(server.proc.pid)).start()
    pool.launch("consumer", 0, generator_main, (
        Job("consumer", 0, server.host, server.port, dest, deadline, total, size=args.size,
            prefetch=args.prefetch, late=True), shared))
    last, changed = -1, time.monotonic()
    while not errors:
        pool.take(0.01)
        got, now = shared.progress[0], time.monotonic()
        if got >= total:
            time.sleep(DUPLICATE_GRACE_S)
            break
        if got != last:
            last, changed = got, now
        elif now - changed > args.idle_timeout or now > deadline:
            errors.append(f"raw consumer stalled at {got} of {total}")
    shared.stop.value = 2 if errors else 1
    pool.collect(REPORT_TIMEOUT_S)
    result = pool.results.get(("consumer", 0), {})
    span = meter.stop(children_cpu=result.get("cpu_s", 0.0))
    seen = result.get("seen", bytearray(total))
    first, last_ack = result.get("first_recv_ns", 0), result.get("last_ack_ns", 0)
    seconds = (last_ack - first) / 1e9 if first and last_ack > first else 0.0
    return {"msgs_per_s": round(total / seconds, 1) if seconds else None,
            "seconds": round(seconds, 3), "server_cpu_s": span["server_cpu_s"],
            "loadgen_cpu_s": round(result.get("cpu_s", 0.0) + span["cpu_s"], 3),
            "other_cpu_s": span["other_cpu_s"], "lost": seen.count(0),
            "duplicated": sum(c - 1 for c in seen if c > 1), "bad_bodies": result.get("bad", 0),
            "errors": errors}


def raw_run(args: argparse.Namespace) -> dict[str, Any]:
    """The same load through persistent.py's raw generator processes, on a fresh server."""
    workdir, server = fresh_server(args, "raw")
    record: dict[str, Any] = {"errors": []}
    n, dest = args.messages, f"/queue/raw.{uuid.uuid4().hex[:10]}"
    try:
        res = run_load(server.host, server.port, 1, 0, n, size=args.size, window=args.window,
                       destination=dest, timeout=args.timeout,
                       server=psutil.Process(server.proc.pid))
        record["errors"] += res.errors
        record["send"] = {"msgs_per_s": res.producer_msgs_per_s,
                          "seconds": res.producer_seconds, "server_cpu_s": res.server_cpu_s,
                          "loadgen_cpu_s": res.loadgen_cpu_s, "other_cpu_s": res.other_cpu_s,
                          "receipt_p50_ms": res.receipt_p50_ms,
                          "receipt_p99_ms": res.receipt_p99_ms}
        if not res.errors:
            receive = raw_receive(server, dest, n, args)
            record["errors"] += receive.pop("errors")
            for key in ("lost", "duplicated", "bad_bodies"):
                record[key] = receive.pop(key)
                if record[key]:
                    record["errors"].append(f"{record[key]} {key.replace('_', ' ')}")
            record["receive"] = receive
    except (BenchError, RuntimeError, OSError, psutil.Error) as e:
        record["errors"].append(f"{type(e).__name__}: {e}")
    finally:
        finish_server(args, record, workdir, server)
    return record


def throughput_round(args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    order = ("client", "raw") if round_no % 2 else ("raw", "client")
    runs = {name: (client_run if name == "client" else raw_run)(args) for name in order}
    c, r = runs["client"], runs["raw"]
    n = args.messages
    out: dict[str, Any] = {"benchmark": "client", "scenario": "throughput", "round": round_no,
                           "order": "/".join(order), "messages": n, "size": args.size,
                           "window": args.window, "prefetch": args.prefetch}
    for phase in ("send", "receive"):
        cp, rp = c.get(phase, {}), r.get(phase, {})
        cm = round(n / cp["seconds"], 1) if cp.get("seconds") else None
        out.update({
            f"client_{phase}_msgs_per_s": cm,
            f"raw_{phase}_msgs_per_s": rp.get("msgs_per_s"),
            f"{phase}_ratio": ratio(cm, rp.get("msgs_per_s")),
            f"client_{phase}_s": cp.get("seconds"),
            f"client_{phase}_cpu_s": cp.get("cpu_s"),
            f"client_{phase}_cpu_util": ratio(cp.get("cpu_s"), cp.get("seconds")),
            f"client_{phase}_cpu_us_per_msg": ratio(cp.get("cpu_s", 0) * 1e6, n),
            f"client_{phase}_server_cpu_s": cp.get("server_cpu_s"),
            f"client_{phase}_other_cpu_s": cp.get("other_cpu_s"),
            f"raw_{phase}_s": rp.get("seconds"),
            f"raw_{phase}_loadgen_cpu_s": rp.get("loadgen_cpu_s"),
            f"raw_{phase}_server_cpu_s": rp.get("server_cpu_s"),
            f"raw_{phase}_other_cpu_s": rp.get("other_cpu_s"),
        })
    out["raw_receipt_p50_ms"] = r.get("send", {}).get("receipt_p50_ms")
    for key in ("lost", "duplicated", "bad_bodies", "redelivered"):
        out[f"client_{key}"] = c.get(key)
    out["raw_lost"], out["raw_duplicated"] = r.get("lost"), r.get("duplicated")
    out["host_cpus"] = psutil.cpu_count()
    out["server_log_problems"] = c["server_log_problems"] + r["server_log_problems"]
    out["errors"] = [f"client: {e}" for e in c["errors"]] + [f"raw: {e}" for e in r["errors"]]
    out["workdirs"] = [x["workdir"] for x in (c, r) if "workdir" in x]
    out["ok"] = not out["errors"]
    return out


def throughput_summary(args: argparse.Namespace, rounds: list[dict[str, Any]]
                       ) -> dict[str, Any]:
    def median(key: str) -> float | None:
        values = [r[key] for r in rounds if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    keys = ("client_send_msgs_per_s", "raw_send_msgs_per_s", "send_ratio",
            "client_receive_msgs_per_s", "raw_receive_msgs_per_s", "receive_ratio",
            "client_send_cpu_us_per_msg", "client_receive_cpu_us_per_msg")
    sends = [r["client_send_msgs_per_s"] for r in rounds if r.get("client_send_msgs_per_s")]
    return {"benchmark": "client", "scenario": "throughput", "summary": True,
            "rounds": len(rounds), "messages": args.messages, "size": args.size,
            "window": args.window, **{f"median_{k}": median(k) for k in keys},
            "client_send_msgs_per_s_rounds": sends,
            "target_send_msgs_per_s": TARGET_SEND_MSGS_PER_S,
            "target_met": bool(sends) and min(sends) >= TARGET_SEND_MSGS_PER_S,
            "ok": all(r["ok"] for r in rounds)}


# --------------------------------------------------------------------------- failover


class Sender(threading.Thread):
    """The application: blocking persistent sends in a loop, each logged as
    (number, called at, returned at, client.server when it returned)."""

    def __init__(self, client: pairmq.client.Client, size: int) -> None:
        super().__init__(name="app-sender", daemon=True)
        self.client = client
        self.body = b"x" * size
        self.halt = threading.Event()
        self.log: list[tuple[int, float, float, str | None]] = []
        self.error: str | None = None
        self.attempted = 0

    def run(self) -> None:
        client, body, log, clock = self.client, self.body, self.log, time.monotonic
        i = 0
        while not self.halt.is_set():
            self.attempted = i + 1
            called = clock()
            try:
                client.send(QUEUE, body, headers={"g": str(i)})
            except ClientError as e:
                self.error = f"send {i}: {type(e).__name__}: {e}"
                return
            log.append((i, called, clock(), client.server))
            i += 1


def wait_ready(deployment: TwoServers, timeout: float = 10.0) -> None:
    until = time.monotonic() + timeout
    status = deployment.status_of_taker()
    while not deployment.ready(status):
        if time.monotonic() > until:
            raise BenchError(f"the backup is {ha_state(status)}, not ready to take over")
        time.sleep(0.05)
        status = deployment.status_of_taker()


def failover_run(args: argparse.Namespace, deployment: TwoServers, run: int, label: str
                 ) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"pairmq-client-failover-{label}-{run}-",
                                    dir=args.workdir))
    record: dict[str, Any] = {"run": run}
    errors: list[str] = []
    client = sender = None
    events: list[tuple[float, Any]] = []
    try:
        deployment.start_run(workdir)
        wait_ready(deployment)
        assert deployment.pair is not None
        primary, backup = (deployment.pair.servers[r] for r in ("primary", "backup"))
        old, new = (f"{s.host}:{s.port}" for s in (primary, backup))
        client = pairmq.client.connect(
            f"failover:(stomp://{old},stomp://{new})", **args.client_options,
            failover_listener=lambda e: events.append((time.monotonic(), e)))
        if client.server != old:
            raise BenchError(f"the client connected to {client.server}, not the active {old}")
        sender = Sender(client, args.size)
        sender.start()
        time.sleep(args.warmup)
        wait_ready(deployment)
        if not sender.log or sender.error:
            raise BenchError(f"the application sent nothing before the kill: {sender.error}")
        t0 = time.monotonic()
        deployment.kill_active()
        give_up = t0 + args.give_up
        first, scanned = None, 0
        while first is None and sender.error is None and time.monotonic() < give_up:
            time.sleep(0.005)
            for entry in sender.log[scanned:]:
                scanned += 1
                if entry[2] > t0 and entry[3] == new:  # returned after the kill, new active
                    first = entry
                    break
        if first is None:
            raise BenchError(f"no send() confirmed by the new active within "
                             f"{args.give_up:.0f} s of the kill ({sender.error})")
        time.sleep(args.after)
        sender.halt.set()
        sender.join(args.give_up)
        if sender.error:
            errors.append(sender.error)
        before = [e for e in sender.log if e[2] <= t0]
        failover_event = next((ev for _, ev in events if ev.kind == "FAILOVER"), None)
        listener_at = next((at for at, ev in events if ev.kind == "FAILOVER"), None)
        stats = client.stats()
        client.close()
        client = None
        record.update(
            failover_s=round(first[2] - t0, 4),
            blocked_send_s=round(first[2] - first[1], 4),  # that send() call, in all
            last_confirmed_before_kill_s=round(t0 - before[-1][2], 4) if before else None,
            event_seconds=round(failover_event.seconds, 4) if failover_event else None,
            event_resent=failover_event.resent if failover_event else None,
            event_reason=failover_event.reason if failover_event else None,
            listener_s=round(listener_at - t0, 4) if listener_at else None,
            failovers=stats.get("failovers"), resent=stats.get("resent"),
            sends=len(sender.log), sends_before_kill=len(before))
        if len(events) != 1:
            errors.append(f"{len(events)} failover events, not 1: "
                          f"{[(ev.kind, ev.old_server, ev.new_server) for _, ev in events]}")
        if not is_serving(deployment.status_of_taker()):
            errors.append("the backup is not serving after the failover")
        if args.drain == "all" or run == 1:
            # Every send() returned, so every message is confirmed: all must be there, once
            # (if the last one failed, the run fails anyway).
            drained = drain_queue(backup.host, backup.port, QUEUE, sender.attempted,
                                  size=args.size, timeout=max(60.0, sender.attempted / 2000))
            record.update(drained=drained.unique, lost=drained.lost,
                          duplicated=drained.duplicated)
            errors += drained.errors
    except (ClientError, BenchError, RuntimeError, TimeoutError, OSError) as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        if sender is not None:
            sender.halt.set()
        if client is not None:
            client.close(0)
        errors += deployment.stop()
        record["log_problems"] = deployment.log_problems()
        record["errors"] = errors
        record["ok"] = not errors
        if errors or args.keep:
            record["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return record


def failover_case(args: argparse.Namespace, setting: str) -> dict[str, Any]:
    heartbeat_ms, activation_ms, target = SETTINGS[setting]
    started = time.monotonic()
    template = Path(tempfile.mkdtemp(prefix="pairmq-client-template-", dir=args.workdir))
    deployment = TwoServers(template, heartbeat_ms, activation_ms, "replication")
    runs: list[dict[str, Any]] = []
    try:
        deployment.prepare(0, args.size)
        for run in range(1, args.runs + 1):
            record = failover_run(args, deployment, run, setting)
            runs.append(record)
            print(f"{setting} run {run}: failover {record.get('failover_s')} s, client event "
                  f"{record.get('event_seconds')} s, {record.get('sends')} sends, resent "
                  f"{record.get('resent')}" + ("" if record["ok"] else
                                                f" FAILED {record['errors']}"),
                  file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(template, ignore_errors=True)

    def column(key: str) -> list[float]:
        return [r[key] for r in runs if r.get(key) is not None]

    times, event_s, listener_s = column("failover_s"), column("event_seconds"), \
        column("listener_s")
    errors = [f"run {r['run']}: {e}" for r in runs for e in r["errors"]]
    return {
        "benchmark": "client", "scenario": "failover", "setting": setting,
        "heartbeat_interval_ms": heartbeat_ms, "activation_interval_ms": activation_ms,
        "client_options": args.client_options, "size": args.size, "runs": args.runs,
        "measured": len(times),
        "p50_s": nearest_rank(times, 0.5), "max_s": max(times, default=None),
        "min_s": min(times, default=None),
        "event_seconds_p50": nearest_rank(event_s, 0.5),
        "event_seconds_max": max(event_s, default=None),
        "listener_s_p50": nearest_rank(listener_s, 0.5),
        "blocked_send_s_max": max(column("blocked_send_s"), default=None),
        "resent_runs": column("resent"), "sends_runs": column("sends"),
        "drained_runs": [r["run"] for r in runs if "drained" in r],
        "lost": sum(column("lost")), "duplicated": sum(column("duplicated")),
        "failover_s_runs": times, "event_seconds_runs": event_s,
        "target_s": target, "target_met": bool(times) and max(times) < target,
        "log_problems": sorted({p for r in runs for p in r["log_problems"]})[:20],
        "wall_s": round(time.monotonic() - started, 1),
        "ok": not errors and len(runs) == args.runs, "errors": errors,
    }


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=["throughput", "failover"], required=True)
    ap.add_argument("--messages", type=int, default=50_000, help="throughput: per run")
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--window", type=int, default=1000,
                    help="throughput: unconfirmed sends at most (client send_window, raw window)")
    ap.add_argument("--prefetch", type=int, default=1000, help="throughput: prefetch-count")
    ap.add_argument("--rounds", type=int, default=3, help="throughput: client/raw pairs")
    ap.add_argument("--idle-timeout", type=float, default=30.0,
                    help="throughput: seconds without a message that fail a run")
    ap.add_argument("--timeout", type=float, default=300.0, help="raw load: cap, seconds")
    ap.add_argument("--runs", type=int, default=20, help="failover: runs per setting")
    ap.add_argument("--setting", choices=[*SETTINGS, "all"], default="defaults",
                    help="failover: heartbeat / activation intervals, as failover.py")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="failover: seconds of sending before the kill")
    ap.add_argument("--after", type=float, default=0.5,
                    help="failover: seconds of sending after the first confirmation")
    ap.add_argument("--give-up", type=float, default=60.0,
                    help="failover: seconds after the kill without a confirmed send")
    ap.add_argument("--drain", choices=["all", "first"], default="all",
                    help="failover: which runs drain and check the queue")
    ap.add_argument("--client-option", action="append", default=[], metavar="NAME=VALUE",
                    help="a pairmq.client keyword option (e.g. retry_interval=50); repeatable")
    ap.add_argument("--workdir", default=None, help="where data directories go (default: tmp)")
    ap.add_argument("--keep", action="store_true", help="keep data directories and logs")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.size < SEQ or args.window < 1 or args.prefetch < 1 \
            or args.rounds < 1 or args.runs < 1:
        ap.error(f"--messages, --window, --prefetch, --rounds, --runs must be positive, "
                 f"--size at least {SEQ}")
    options = {}
    for item in args.client_option:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--client-option takes NAME=VALUE, got {item!r}")
        options[name.strip()] = value.strip()
    if "send_window" in options:
        ap.error("set send_window with --window (the raw generator uses the same)")
    try:
        pairmq.client.parse_options("127.0.0.1:1", options)
    except pairmq.client.ConfigurationError as e:
        ap.error(str(e))
    args.client_options = options
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    failed = False
    try:
        if args.scenario == "throughput":
            rounds = []
            for round_no in range(1, args.rounds + 1):
                record = throughput_round(args, round_no)
                rounds.append(record)
                print(json.dumps(record), flush=True)
                failed = failed or not record["ok"]
            print(json.dumps(throughput_summary(args, rounds)), flush=True)
        else:
            for setting in list(SETTINGS) if args.setting == "all" else [args.setting]:
                record = failover_case(args, setting)
                print(json.dumps(record), flush=True)
                failed = failed or not record["ok"]
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, BenchError) as e:  # a server that did not start
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
