"""Recovery time of pairmq's durable store with a large journal.

Run from the repository root:

    .venv/bin/python benchmarks/recovery.py                       # 1,000,000 x 1 KiB
    .venv/bin/python benchmarks/recovery.py --messages 200000 --build server --cold

1. Build a journal holding --messages persistent messages of --size bytes in one
   queue, either
   - `--build api` (default): in this process, through the code path the server
     uses (a Broker and a Store on an asyncio loop; every SEND is one journal
     record group, written and fdatasynced by the store's group-commit writer), or
   - `--build server`: through a real server, with pipelined SENDs carrying
     receipts from --build-producers processes; the server is SIGKILLed after the
     last RECEIPT.
2. For each --paging value, start a real server on that data directory and measure
   ready_s (process start .. port accepting connections) and recovery_s (the
   server's own "Recovered ... in X s" log line), and its RSS once ready. With
   --cold the journal's pages are dropped from the page cache first
   (posix_fadvise DONTNEED on each segment), so recovery reads from the disk.
3. On the last start, a consumer drains the queue and checks that every message
   arrives exactly once, in order, from the first to the last (the bodies built
   by `--build api` carry their number, which is checked too).

Prints one JSON line per server start. Lost, duplicated or misordered messages,
a server that does not start, or errors exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from bisect import bisect_right  # noqa: E402
from itertools import accumulate  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import ServerProcess, free_port, start_server, wait_for_port  # noqa: E402

from benchmarks.loadgen import host_busy_cpu, split  # noqa: E402
from benchmarks.persistent import (  # noqa: E402
    SEGMENT_RE,
    LoadError,
    Wire,
    header_value,
    journal_usage,
    run_load,
    server_log_problems,
)

DESTINATION = "/queue/recovery"
SERVER_NAME = "recover"
DEFAULT_PAGING = 256 * 1024 * 1024
RECOVERED_RE = re.compile(r"Recovered (\d+) messages .* in ([0-9.]+) s"
                          r"(?: \((\d+) of the segments through their summaries\))?"
                          r"(?: \(paging: (\d+) bodies)?")
DRAIN_IDLE_S = 20.0
NUMBER_DIGITS = 12  # bodies built by --build api start with the message number


class _Flag:
    """A stand-in for the shared stop flag Wire checks: never set."""

    value = 0


# --------------------------------------------------------------------------- building


def build_with_api(journal: Path, messages: int, size: int, segment_bytes: int) -> dict[str, Any]:
    """Journal `messages` persistent SENDs through Broker + Store, as the server would."""
    from pairmq.core import Broker, CoreSettings
    from pairmq.core.admission import Admission
    from pairmq.store.settings import StoreSettings
    from pairmq.store.store import Store

    async def build() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        store = Store(journal, StoreSettings(segment_bytes=segment_bytes))
        replay, _ = store.recover()
        # The server's default limits: past 64 MiB the destination pages, so a persistent
        # message is never held or refused (a limit of 0 kept every message in memory,
        # and the 1 GiB global limit refused all after about a million).
        broker = Broker(CoreSettings(), id_prefix=f"ID:builder-{int(time.time() * 1000):x}-")
        broker.restore(replay)
        store.start(broker, loop)
        broker.open_session(1, "1.2")
        filler = b"x" * max(0, size - NUMBER_DIGITS)

        def synced(seq: int) -> asyncio.Future:
            done = loop.create_future()
            store.when_synced(seq, lambda: done.done() or done.set_result(None))
            return done

        started = time.monotonic()
        now = int(time.time() * 1000)
        for i in range(messages):
            body = (b"%0*d" % (NUMBER_DIGITS, i) + filler)[:size]
            headers = {"persistent": "true", "g": str(i), "ts": "0"}
            outcome = broker.send(1, DESTINATION, headers, body, now)
            if outcome.admission not in (Admission.ACCEPTED, Admission.PAGED):
                raise LoadError(f"message {i} was not taken: {outcome}")
            store.persist(broker.take_records())  # one record group per SEND, as the server
            if i % 1000 == 999:
                now = int(time.time() * 1000)
                # Keep the writer at most ~20,000 records behind, like 200 producers would.
                behind = store.appended_seq - 20_000
                if store.synced_seq < behind:
                    await asyncio.wait_for(synced(behind), 60)
                else:
                    await asyncio.sleep(0)
        await asyncio.wait_for(synced(store.appended_seq), 60)
        seconds = time.monotonic() - started
        store.close()
        return {"build": "api", "build_s": round(seconds, 2),
                "build_msgs_per_s": round(messages / seconds, 1)}

    return asyncio.run(build())


def build_with_server(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Send through a real server with receipts, then SIGKILL it: a crash, not a clean stop."""
    server = start_server(workdir, "--segment-bytes", str(args.segment_bytes),
                          "--max-size-bytes", "0", "--paging-bytes", str(DEFAULT_PAGING),
                          name=SERVER_NAME)
    try:
        res = run_load(server.host, server.port, args.build_producers, 0, args.messages,
                       size=args.size, window=args.window, destination=DESTINATION,
                       timeout=args.timeout, server=psutil.Process(server.proc.pid))
    finally:
        server.kill()
    if res.errors:
        raise RuntimeError("building through the server failed: " + "; ".join(res.errors))
    return {"build": "server", "build_producers": args.build_producers,
            "build_s": res.seconds, "build_msgs_per_s": res.msgs_per_s,
            "build_receipt_p99_ms": res.receipt_p99_ms, "build_server_cpu_s": res.server_cpu_s}


def evict_page_cache(journal: Path) -> None:
    """Drop the journal's pages from the page cache so recovery reads the disk."""
    for entry in os.scandir(journal):
        if SEGMENT_RE.match(entry.name):
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --------------------------------------------------------------------------- checking


def drain(server: ServerProcess, messages: int, size: int, numbered: bool,
          timeout: float, producers: int = 1) -> dict[str, Any]:
    """Consume the whole queue; every message exactly once and in order, first to last.

    In order means in each producer's order: producer i sent the numbers of the i-th
    part of split(messages, producers), ascending.
    """
    starts = list(accumulate(split(messages, producers), initial=0))[:-1]
    expected = starts[:]  # the next number expected from each producer
    deadline = time.monotonic() + timeout
    wire = Wire(server.host, server.port, _Flag(), deadline)
    seen = bytearray(messages)
    received = misordered = bad = redelivered = 0
    bad_examples: list[list[int]] = []
    first_body = last_body = None
    started = last_arrival = time.monotonic()
    try:
        wire.send((f"SUBSCRIBE\nid:0\ndestination:{DESTINATION}\nack:client\n"
                   f"prefetch-count:2000\n\n\x00").encode())
        buf = wire.buf
        while received < messages:
            if not wire.recv():
                if time.monotonic() - last_arrival > DRAIN_IDLE_S:
                    raise LoadError(f"nothing arrived for {DRAIN_IDLE_S:.0f} s after "
                                    f"{received} messages")
                continue
            last_arrival = time.monotonic()
            pos, n, last_ack = 0, len(buf), None
            while pos < n:
                if buf[pos] in (10, 13):
                    pos += 1
                    continue
                hend = buf.find(b"\n\n", pos)
                if hend < 0:
                    break
                if not buf.startswith(b"MESSAGE\n", pos):
                    raise LoadError("unexpected frame " + bytes(buf[pos:pos + 400]).decode(
                        errors="replace"))
                at = buf.rfind(b"\ncontent-length:", pos, hend)
                end = hend + 2 + int(buf[at + 16:hend])
                if end >= n:
                    break
                g = int(header_value(buf, b"\ng:", pos, hend) or b"-1")
                body = bytes(buf[hend + 2:end])
                if not 0 <= g < messages:
                    raise LoadError(f"message with unknown number g:{g}")
                seen[g] = min(255, seen[g] + 1)
                producer = bisect_right(starts, g) - 1
                if g != expected[producer]:
                    misordered += 1
                expected[producer] = g + 1
                if len(body) != size or (numbered and size >= NUMBER_DIGITS
                                         and body[:NUMBER_DIGITS] != b"%0*d" % (
                                             NUMBER_DIGITS, g)):
                    bad += 1
                    if len(bad_examples) < 5:
                        bad_examples.append([g, len(body)])
                if buf.find(b"\nredelivered:true", pos, hend) >= 0:
                    redelivered += 1
                if g == 0:
                    first_body = body[:NUMBER_DIGITS]
                if g == messages - 1:
                    last_body = body[:NUMBER_DIGITS]
                last_ack = header_value(buf, b"\nack:", pos, hend)
                received += 1
                pos = end + 1
            del buf[:pos]
            if last_ack is not None:
                wire.send(b"ACK\nid:" + last_ack + b"\n\n\x00")  # ack:client is cumulative
        wire.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
        wire.expect(b"RECEIPT", b"receipt-id:bye")
        error = None
    except (LoadError, OSError, ValueError) as e:
        error = f"drain: {e}"
    finally:
        wire.close()
    seconds = time.monotonic() - started
    lost = seen.count(0)
    duplicated = sum(c - 1 for c in seen if c > 1)
    return {
        "drained": received,
        "drain_s": round(seconds, 2),
        "drain_msgs_per_s": round(received / seconds, 1) if seconds else None,
        "first_ok": seen[0] == 1 and (not numbered or first_body == b"%0*d" % (
            NUMBER_DIGITS, 0)),
        "last_ok": seen[-1] == 1 and (not numbered or last_body == b"%0*d" % (
            NUMBER_DIGITS, messages - 1)),
        "lost": lost,
        "duplicated": duplicated,
        "misordered": misordered,
        "bad_bodies": bad,
        "bad_examples": bad_examples,
        "redelivered": redelivered,
        "drain_error": error,
    }


# --------------------------------------------------------------------------- measuring


def start_recovering_server(workdir: Path, flags: list[str], timeout: float) -> ServerProcess:
    """start_server's command line and log, with a longer wait for the port.

    start_server gives a server 20 s to listen, and recovering a large journal may
    take longer than that: the time is what this benchmark measures, so it waits
    up to `timeout` instead.
    """
    port = free_port()
    data_dir = workdir / f"data-{SERVER_NAME}"
    log_path = workdir / f"server-{SERVER_NAME}-{port}.log"
    cmd = [sys.executable, "-m", "pairmq", "server", "--name", SERVER_NAME,
           "--data-dir", str(data_dir), "--stomp", f"127.0.0.1:{port}", "--allow-anonymous",
           *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_port("127.0.0.1", port, proc, timeout=timeout)
    except (RuntimeError, TimeoutError) as e:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{e}: {log_path.read_text(errors='replace')[-2000:]}") from None
    return ServerProcess("127.0.0.1", port, proc, data_dir, log_path, cmd)


def log_time(log: str, pattern: str) -> float | None:
    """Wall-clock time (s since the epoch) of the first log line matching `pattern`."""
    found = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*" + pattern, log, re.M)
    if not found:
        return None
    stamp, _, millis = found.group(1).partition(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def measure(workdir: Path, args: argparse.Namespace, paging: int, check: bool,
            base: dict[str, Any]) -> dict[str, Any]:
    journal = workdir / f"data-{SERVER_NAME}" / "journal"
    segments, size = journal_usage(journal)
    if args.cold:
        evict_page_cache(journal)
    record: dict[str, Any] = {**base, "paging_bytes": paging, "cold_cache": args.cold,
                              "max_size_bytes": args.max_size_bytes,
                              "journal_bytes": size, "segments": segments}
    errors: list[str] = []
    started, started_wall, host0 = time.monotonic(), time.time(), host_busy_cpu()
    try:
        server = start_recovering_server(
            workdir, ["--paging-bytes", str(paging), "--segment-bytes", str(args.segment_bytes),
                      # 0: no per-destination cap, --paging alone decides what recovery
                      # loads; else the queue pages past it (the server's default: 64m)
                      "--max-size-bytes", str(args.max_size_bytes),
                      *(["--recovery-in-memory-bytes", str(args.recovery_in_memory_bytes)]
                        if args.recovery_in_memory_bytes is not None else []),
                      "--log-level", args.server_log_level], args.start_timeout)
    except (RuntimeError, TimeoutError) as e:
        record.update(ok=False, errors=[f"server did not start: {e}"])
        return record
    ready_s = time.monotonic() - started
    host1 = host_busy_cpu()
    try:
        proc = psutil.Process(server.proc.pid)
        rss = proc.memory_info().rss
        server_cpu = sum(proc.cpu_times()[:2])
        log = server.logs()
        found = RECOVERED_RE.search(log)
        starting = log_time(log, "Starting pairmq server")
        recovered = log_time(log, "Recovered ")
        ready = log_time(log, " ready: STOMP on")
        recovery_s = float(found.group(2)) if found else None
        record.update(
            ready_s=round(ready_s, 3),
            recovery_s=recovery_s,
            # process start .. "Starting" logged: interpreter and imports
            startup_s=round(starting - started_wall, 3) if starting else None,
            # store.recover done .. "Recovered" logged: broker.restore rebuilding the queues
            restore_s=(round(recovered - starting - recovery_s, 3)
                       if recovered and starting and recovery_s is not None else None),
            # "Recovered" .. "ready" logged: store.start accounting, listener
            listen_s=round(ready - recovered, 3) if ready and recovered else None,
            recovered_messages=int(found.group(1)) if found else None,
            bodies_left_on_disk=(int(found.group(1)) - int(found.group(4))
                                 if found and found.group(4) else 0 if found else None),
            segments_through_summaries=int(found.group(3) or 0) if found else None,
            server_rss_bytes=rss,
            server_cpu_s_to_ready=round(server_cpu, 3),
            # busy CPU of the host besides the server while it started: other load
            other_cpu_s=round(host1 - host0 - server_cpu, 3),
        )
        if not found:
            errors.append("no 'Recovered ...' line in the server log")
        elif int(found.group(1)) != args.messages:
            errors.append(f"recovered {found.group(1)} messages, {args.messages} were journaled")
        if check:
            result = drain(server, args.messages, args.size, base["build"] in ("api", "reused"),
                           args.timeout, base.get("build_producers", 1))
            record.update(result)
            if result["drain_error"]:
                errors.append(result["drain_error"])
            lost_as = ("not delivered before the drain stopped" if result["drain_error"]
                       else "lost (never delivered)")
            for key, what in (("lost", lost_as),
                              ("duplicated", "delivered twice"),
                              ("misordered", "delivered out of order"),
                              ("bad_bodies", "delivered with a wrong body (e.g. [number, "
                                             f"body length]: {result['bad_examples']})")):
                if result[key]:
                    errors.append(f"{result[key]} messages {what}")
            if not (result["first_ok"] and result["last_ok"]):
                errors.append("the first or the last message did not come back intact")
            record["server_rss_after_drain_bytes"] = proc.memory_info().rss
            time.sleep(1.0)  # let compaction drop what the drain released
            record["journal_after_drain_segments"], record["journal_after_drain_bytes"] = \
                journal_usage(journal)
        if not server.alive():
            errors.append("the server process died")
        record["server_log_problems"] = server_log_problems(server)
    finally:
        code = server.stop(timeout=30)
        if code not in (0, None):
            errors.append(f"server exited with code {code}")
    record.update(ok=not errors, errors=errors)
    return record


def parse_size(text: str) -> int:
    if text == "default":
        return DEFAULT_PAGING
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--build", choices=("api", "server"), default="api")
    ap.add_argument("--build-producers", type=int, default=2, help="with --build server")
    ap.add_argument("--window", type=int, default=100, help="with --build server")
    ap.add_argument("--paging", default="8g,default",
                    help="comma-separated --paging-bytes values, one server start each; "
                         "the last start also drains and checks the queue (default: "
                         "8g,default)")
    ap.add_argument("--max-size-bytes", default="0",
                    help="the queue's limit at each start: 0 (default) keeps every message's "
                         "index in memory, as before paging as a mode; 64m (the server's "
                         "default) pages past it, and a start reads sealed segments "
                         "through their summaries")
    ap.add_argument("--recovery-in-memory-bytes", type=int, default=None,
                    help="the server's [store] recovery_in_memory_bytes: what a start keeps in "
                         "memory of a paging queue (not given: the server's default, 4 MiB; "
                         "0: up to its limit)")
    ap.add_argument("--cold", action="store_true",
                    help="drop the journal from the page cache before each start")
    ap.add_argument("--server-log-level", default="info",
                    choices=("debug", "info", "warning", "error"))
    ap.add_argument("--no-check", action="store_true", help="do not drain the queue")
    ap.add_argument("--timeout", type=float, default=900.0, help="cap on building, draining")
    ap.add_argument("--start-timeout", type=float, default=300.0,
                    help="how long a recovering server may take to listen")
    ap.add_argument("--workdir", default=None, help="where the data directory goes")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--reuse", default=None, metavar="WORKDIR",
                    help="start on the journal a --keep run left in WORKDIR (--messages as "
                         "it was built; add --no-check to keep it for the next run)")
    args = ap.parse_args(argv)
    try:
        args.paging_values = [parse_size(v) for v in args.paging.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--paging: not a list of sizes: {args.paging!r}")
    try:
        args.max_size_bytes = parse_size(args.max_size_bytes)
    except ValueError:
        ap.error(f"--max-size-bytes: not a size: {args.max_size_bytes!r}")
    if args.messages < 1 or args.size < 0 or not args.paging_values:
        ap.error("--messages must be positive, --size not negative, --paging not empty")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(args.reuse) if args.reuse else \
        Path(tempfile.mkdtemp(prefix="pairmq-recovery-", dir=args.workdir))
    journal = workdir / f"data-{SERVER_NAME}" / "journal"
    failed = False
    try:
        print(f"building {args.messages} messages of {args.size} bytes ({args.build}) in "
              f"{journal}", file=sys.stderr, flush=True)
        if args.reuse:
            base = {"build": "reused", "build_s": 0.0}
        elif args.build == "api":
            base = build_with_api(journal, args.messages, args.size, args.segment_bytes)
        else:
            base = build_with_server(workdir, args)
        base = {"messages": args.messages, "size": args.size,
                "segment_bytes": args.segment_bytes, **base}
        print(f"built in {base['build_s']} s; starting servers", file=sys.stderr, flush=True)
        for i, paging in enumerate(args.paging_values):
            last = i == len(args.paging_values) - 1
            record = measure(workdir, args, paging, last and not args.no_check, base)
            print(json.dumps(record), flush=True)
            if not record["ok"]:
                failed = True
                for err in record["errors"]:
                    print(f"FAILED (paging {paging}): {err}", file=sys.stderr, flush=True)
                break
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"FAILED: {e}", file=sys.stderr, flush=True)
        failed = True
    finally:
        if failed or args.keep or args.reuse:
            print(f"data and logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
