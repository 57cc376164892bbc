"""Persistent-message throughput and latency of pairmq's durable store.

Run from the repository root:

    .venv/bin/python benchmarks/persistent.py                   # 1p1c then 4p4c, 100,000 each
    .venv/bin/python benchmarks/persistent.py --scenario 1p1c --messages 200000 --size 4096
    .venv/bin/python benchmarks/persistent.py --scenario 1p1c --consumer-delay 10 \
        --messages 400000                       # consumers join 10 s late: the backlog pages
    .venv/bin/python benchmarks/persistent.py --scenario 1p1c --window 1 \
        --messages 5000 [--deliver-unconfirmed] # latency alone, with or without the gate
    .venv/bin/python benchmarks/persistent.py --tls  # clients on the STOMP TLS listener

Every scenario starts a fresh server (fresh data directory) and pushes --messages
persistent messages (header persistent:true) of --size bytes through one queue:

- each producer is its own process on a raw socket and keeps up to --window SENDs
  in flight, each carrying a receipt header; a RECEIPT comes back only once the
  message is on disk (group commit), so the window bounds what is unconfirmed;
- each consumer is its own process, subscribed with ack:client-individual and
  prefetch-count --prefetch; it ACKs every message (pipelined, no receipts), with
  competing consumers on the same queue in 4p4c;
- with --consumer-delay S the consumers are started S seconds after the producers (a
  consumer restart, a deploy): the backlog grows past the destination's max_size_bytes,
  and `producer_msgs_per_s` / `receipt_max_ms` show whether producers were held;
- with --deliver-unconfirmed the server hands messages to consumers before their record
  is on disk (the server's option of that name); by default a MESSAGE waits for the disk
  as a RECEIPT does, which the end-to-end latency shows.

Prints one JSON line per scenario: msgs/s received and acknowledged, receipt
latency p50/p99 (SEND written .. RECEIPT read), end-to-end p50/p99 (the ts header
set at send .. MESSAGE read), the server's CPU seconds and the load generator's,
and the journal directory (segment count, bytes) at its peak during the run and
once everything is acknowledged. A lost, duplicated or damaged message, an ERROR
frame, a stall or a dead server makes it say so on stderr and exit 1.

`run_load` and `JournalSampler` are reused by compaction.py and recovery.py.
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
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import ssl  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from array import array  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import psutil  # noqa: E402
from tests.serverproc import ServerProcess, free_port, start_server  # noqa: E402

from benchmarks.loadgen import (  # noqa: E402
    GeneratorPool,
    alive,
    cpu_seconds,
    host_busy_cpu,
    percentile_ms,
    process_cpu,
    split,
    thread_cpu,
)

SCENARIOS: dict[str, tuple[int, int]] = {"1p1c": (1, 1), "4p4c": (4, 4)}
CONNECT = b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\x00"
RECV_BYTES = 256 * 1024
POLL_S = 0.1  # blocked socket calls wake up this often to look at the stop flag
SETUP_TIMEOUT_S = 20.0
REPORT_TIMEOUT_S = 30.0  # generator processes reporting back once stopped
DUPLICATE_GRACE_S = 0.3  # keep consuming after the last expected message, to see extras
LATENCY_SAMPLES = 200_000  # per run, spread over all messages
NON_PERSISTENT_BATCH = 256  # SENDs per write when no window applies
SEGMENT_RE = re.compile(r"^journal-\d{8}\.seg$")
SERVER_LOG_PROBLEMS = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback")


class LoadError(Exception):
    """The server misbehaved: ERROR frame, closed connection, no progress in time."""


class Stopped(Exception):
    """The orchestrator asked every generator process to finish."""


# --------------------------------------------------------------------------- sockets


class Wire:
    """One raw STOMP connection with an input buffer; the stop flag is checked on every wait."""

    def __init__(self, host: str, port: int, stop: Any, deadline: float,
                 tls_ca: str | None = None) -> None:
        self.stop = stop
        self.deadline = deadline
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls_ca is not None:  # --tls: the server's STOMP TLS listener
            self.sock = ssl.create_default_context(cafile=tls_ca).wrap_socket(
                self.sock, server_hostname=host)
        self.sock.settimeout(POLL_S)
        self.buf = bytearray()
        self.send(CONNECT)
        self.expect(b"CONNECTED")

    def check(self) -> None:
        if self.stop.value == 2:  # 2 = abort at once; 1 = finish normally
            raise Stopped
        if time.monotonic() > self.deadline:
            raise LoadError("deadline passed")

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view):]
            except TimeoutError:
                self.check()

    def recv(self) -> bool:
        """Append what arrives to buf; False when nothing came within POLL_S."""
        try:
            data = self.sock.recv(RECV_BYTES)
        except TimeoutError:
            self.check()
            return False
        if not data:
            raise LoadError("the server closed the connection" + error_text(self.buf))
        self.buf += data
        return True

    def expect(self, command: bytes, header: bytes = b"") -> None:
        """Read frames until `command` (holding `header` if given) arrives; ERROR raises."""
        while True:
            end = self.buf.find(b"\x00")
            if end < 0:
                self.recv()
                continue
            frame = bytes(self.buf[:end]).lstrip(b"\r\n")
            del self.buf[:end + 1]
            if frame.startswith(b"ERROR"):
                raise LoadError("server sent " + frame[:400].decode(errors="replace"))
            if frame.startswith(command + b"\n") and header in frame:
                return

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def error_text(buf: bytearray) -> str:
    at = buf.find(b"ERROR\n")
    if at < 0:
        return ""
    return ": " + bytes(buf[at:at + 400]).replace(b"\x00", b"").decode(errors="replace")


def header_value(buf: bytearray, name: bytes, start: int, end: int) -> bytes | None:
    """The value of header `name` (b"\\nNAME:") in buf[start:end], or None."""
    at = buf.find(name, start, end)
    if at < 0:
        return None
    at += len(name)
    eol = buf.find(b"\n", at, end + 1)
    return bytes(buf[at:eol])


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Shared:
    events: Any  # Queue of (kind, role, index, payload)
    start: Any  # Event: producers begin
    stop: Any  # RawValue("b"): 1 = finish (consumers disconnect), 2 = abort
    progress: Any  # RawArray("q", consumers): messages received so far
    sent: Any  # RawArray("q", producers): messages confirmed by RECEIPT so far


@dataclass(frozen=True)
class Job:
    role: str
    index: int
    host: str
    port: int
    destination: str
    deadline: float
    total: int  # messages in the whole run (size of the seen-map)
    first: int = 0  # producer: global number of its first message
    count: int = 0  # producer: how many it sends
    size: int = 1024
    window: int = 100
    prefetch: int = 1000
    sample_every: int = 1
    late: bool = False  # consumer: messages are waiting already (no receipt to wait for)
    tls_ca: str | None = None  # --tls: connect over TLS, trusting this CA
    persistent: bool = True  # False: no persistent header, a receipt on the last SEND only


def generator_main(job: Job, shared: Shared) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator stops us via shared.stop
    wire = None
    result: dict[str, Any] = {}
    try:
        wire = Wire(job.host, job.port, shared.stop, job.deadline, job.tls_ca)
        if job.role == "producer":
            produce(job, shared, wire, result)
        else:
            consume(job, shared, wire, result)
    except Stopped:
        result.setdefault("error", None)
    except (LoadError, OSError, ValueError) as e:
        result["error"] = f"{job.role} {job.index}: {e}"
    finally:
        if wire is not None:
            wire.close()
        result["cpu_s"] = cpu_seconds()
        shared.events.put(("done", job.role, job.index, result))


def produce(job: Job, shared: Shared, wire: Wire, result: dict[str, Any]) -> None:
    latencies = array("q")  # SEND written .. RECEIPT read, every sample_every-th message
    result.update(sent=0, confirmed=0, first_send_ns=0, last_receipt_ns=0,
                  receipt_ns=latencies)
    shared.events.put(("ready", job.role, job.index, None))
    while not shared.start.wait(POLL_S):
        wire.check()
    wire.check()
    head = (f"SEND\ndestination:{job.destination}\n"
            + ("persistent:true\n" if job.persistent else "")
            + f"content-length:{job.size}\n").encode()
    tail = b"x" * job.size + b"\x00"
    count, window, first, every = job.count, job.window, job.first, job.sample_every
    written = array("q", bytes(8 * count))  # SEND write time per receipt id
    sent = confirmed = 0
    buf = wire.buf
    clock = time.monotonic_ns
    result["first_send_ns"] = clock()
    if not job.persistent:
        # As the shared bench's "receipts last": every SEND at once, a receipt on the last
        # (it comes once every earlier one of the connection was taken).
        for start in range(0, count, NON_PERSISTENT_BATCH):
            now = clock()
            stamp = b"\nts:%d\n\n" % now
            end = min(start + NON_PERSISTENT_BATCH, count)
            wire.send(b"".join([head + (b"receipt:%d\n" % k if k == count - 1 else b"")
                                + b"g:%d" % (first + k) + stamp + tail
                                for k in range(start, end)]))
            written[end - 1] = now
            sent = end
            result["sent"] = sent
        confirmed = count - 1  # the one receipt to come
    while confirmed < count:
        room = min(window - (sent - confirmed), count - sent)
        if room > 0:
            now = clock()
            stamp = b"\nts:%d\n\n" % now
            wire.send(b"".join([head + b"receipt:%d\ng:%d" % (k, first + k) + stamp + tail
                                for k in range(sent, sent + room)]))
            for k in range(sent, sent + room):
                written[k] = now
            sent += room
            result["sent"] = sent
        if not wire.recv():
            continue
        arrived = clock()
        pos = 0
        while True:
            end = buf.find(b"\x00", pos)
            if end < 0:
                break
            while buf[pos] in (10, 13):
                pos += 1
            if buf.startswith(b"RECEIPT\n", pos):
                rid = header_value(buf, b"\nreceipt-id:", pos, end)
                if rid is None:
                    raise LoadError("RECEIPT without receipt-id")
                k = int(rid)
                if k != confirmed:
                    raise LoadError(f"RECEIPT {k} arrived when {confirmed} was expected")
                if k % every == 0:
                    latencies.append(arrived - written[k])
                confirmed += 1
            elif buf.startswith(b"ERROR", pos):
                raise LoadError("server sent " + bytes(buf[pos:end][:400]).decode(
                    errors="replace"))
            pos = end + 1
        del buf[:pos]
        shared.sent[job.index] = confirmed
        result["confirmed"] = confirmed
        result["last_receipt_ns"] = arrived
    wire.send(b"DISCONNECT\n\n\x00")


def consume(job: Job, shared: Shared, wire: Wire, result: dict[str, Any]) -> None:
    seen = bytearray(job.total)  # how often each message number arrived
    latencies = array("q")  # ts header .. MESSAGE read, every sample_every-th message
    result.update(received=0, first_recv_ns=0, last_ack_ns=0, redelivered=0, bad=0,
                  e2e_ns=latencies, seen=seen)
    # A late consumer's MESSAGEs may come before a RECEIPT: it asks for none.
    receipt = "" if job.late else "receipt:sub\n"
    wire.send((f"SUBSCRIBE\nid:0\ndestination:{job.destination}\nack:client-individual\n"
               f"prefetch-count:{job.prefetch}\n{receipt}\n\x00").encode())
    if not job.late:
        wire.expect(b"RECEIPT", b"receipt-id:sub")
    shared.events.put(("ready", job.role, job.index, None))
    buf = wire.buf
    size, every, total = job.size, job.sample_every, job.total
    received = redelivered = bad = 0
    clock = time.monotonic_ns
    index = job.index
    progress = shared.progress
    while shared.stop.value == 0:
        if not wire.recv():
            continue
        arrived = clock()
        if not received:
            result["first_recv_ns"] = arrived
        acks = []
        pos, n = 0, len(buf)
        while pos < n:
            if buf[pos] in (10, 13):
                pos += 1
                continue
            hend = buf.find(b"\n\n", pos)
            if hend < 0:
                break
            if not buf.startswith(b"MESSAGE\n", pos):
                if buf.startswith(b"ERROR", pos):
                    end = buf.find(b"\x00", pos)
                    raise LoadError("server sent " + bytes(
                        buf[pos:end if end > 0 else n][:400]).decode(errors="replace"))
                raise LoadError("unexpected frame " + bytes(buf[pos:hend][:200]).decode(
                    errors="replace"))
            at = buf.rfind(b"\ncontent-length:", pos, hend)
            if at < 0:
                raise LoadError("MESSAGE without content-length")
            length = int(buf[at + 16:hend])
            end = hend + 2 + length
            if end >= n:
                break
            ack = header_value(buf, b"\nack:", pos, hend)
            g = header_value(buf, b"\ng:", pos, hend)
            if ack is None or g is None or buf[end] != 0:
                raise LoadError("malformed MESSAGE " + bytes(buf[pos:hend][:300]).decode(
                    errors="replace"))
            number = int(g)
            if not 0 <= number < total:
                raise LoadError(f"MESSAGE with unknown number g:{number}")
            if seen[number] < 255:
                seen[number] += 1
            if length != size:
                bad += 1
            if buf.find(b"\nredelivered:true", pos, hend) >= 0:
                redelivered += 1
            if number % every == 0:
                ts = header_value(buf, b"\nts:", pos, hend)
                if ts is not None:
                    latencies.append(arrived - int(ts))
            acks.append(b"ACK\nid:" + ack + b"\n\n\x00")
            received += 1
            pos = end + 1
        del buf[:pos]
        if acks:
            wire.send(b"".join(acks))
            result["last_ack_ns"] = clock()
            progress[index] = received
        result.update(received=received, redelivered=redelivered, bad=bad)
    if shared.stop.value == 1:
        # Its RECEIPT comes once every ACK before it is journaled and on disk.
        wire.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
        wire.expect(b"RECEIPT", b"receipt-id:bye")


# --------------------------------------------------------------------------- journal


def journal_usage(journal: Path) -> tuple[int, int]:
    """(segment files, bytes in them) of a journal directory."""
    segments, size, _ = journal_scan(journal)
    return segments, size


def journal_scan(journal: Path) -> tuple[int, int, int]:
    """(segment files, bytes in them, highest segment number) of a journal directory."""
    segments = size = highest = 0
    try:
        entries = list(os.scandir(journal))
    except FileNotFoundError:
        return 0, 0, 0
    for entry in entries:
        if SEGMENT_RE.match(entry.name):
            try:
                size += entry.stat().st_size
            except FileNotFoundError:
                continue
            segments += 1
            highest = max(highest, int(entry.name[8:16]))
    return segments, size, highest


class JournalSampler(threading.Thread):
    """Samples a journal directory's segment count and bytes every `interval` seconds."""

    def __init__(self, journal: Path, interval: float = 1.0, echo: bool = False) -> None:
        super().__init__(daemon=True)
        self.journal = journal
        self.interval = interval
        self.echo = echo
        self.samples: list[tuple[float, int, int]] = []  # (seconds, segments, bytes)
        self.highest_segment = 0  # segments are numbered from 1: how many were created
        self.extra: dict[str, Any] = {}  # caller's progress figures, echoed with each sample
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while True:
            self.sample()
            if self._halt.wait(self.interval):
                return

    def sample(self) -> tuple[int, int]:
        segments, size, highest = journal_scan(self.journal)
        self.highest_segment = max(self.highest_segment, highest)
        t = round(time.monotonic() - self._t0, 2)
        self.samples.append((t, segments, size))
        if self.echo:
            more = "".join(f" {k}={v}" for k, v in self.extra.items())
            print(f"  t={t:7.1f}s segments={segments:3d} bytes={size:>13,} "
                  f"newest=journal-{highest:08d}{more}",
                  file=sys.stderr, flush=True)
        return segments, size

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    @property
    def peak_segments(self) -> int:
        return max((s for _, s, _ in self.samples), default=0)

    @property
    def peak_bytes(self) -> int:
        return max((b for _, _, b in self.samples), default=0)


def settle_journal(journal: Path, segments_goal: int = 2, timeout: float = 15.0
                   ) -> tuple[int, int, float]:
    """Wait until compaction is done (at most `segments_goal` segments, or no change for 2 s)."""
    started = time.monotonic()
    last = journal_usage(journal)
    changed = started
    while time.monotonic() - started < timeout:
        if last[0] <= segments_goal:
            break
        time.sleep(0.2)
        now = journal_usage(journal)
        if now != last:
            last, changed = now, time.monotonic()
        elif time.monotonic() - changed > 2.0:
            break
    return last[0], last[1], round(time.monotonic() - started, 2)


# --------------------------------------------------------------------------- one run


@dataclass
class LoadResult:
    planned: int
    confirmed: int = 0  # SENDs acknowledged by RECEIPT
    received: int = 0
    lost: int = 0
    duplicated: int = 0
    redelivered: int = 0
    bad_bodies: int = 0
    seconds: float = 0.0  # first SEND .. last ACK written (or last RECEIPT, no consumers)
    msgs_per_s: float = 0.0
    receipt_p50_ms: float | None = None
    receipt_p99_ms: float | None = None
    receipt_max_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    e2e_max_ms: float | None = None
    server_cpu_s: float | None = None
    # The server's event-loop thread alone (the rest is the journal writer thread and
    # any short-lived helpers): near `seconds`, the event loop is the bottleneck.
    server_loop_cpu_s: float | None = None
    loadgen_cpu_s: float = 0.0
    # Busy CPU of the whole machine minus server and generator during the run: other
    # work on the host (or loopback softirq time) that makes the figures noisy.
    other_cpu_s: float | None = None
    busiest_generator_cpu_util: float = 0.0  # CPU s of the busiest generator / seconds
    producer_seconds: float = 0.0  # first SEND .. last RECEIPT
    producer_msgs_per_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def run_load(host: str, port: int, producers: int, consumers: int, total: int, *,
             size: int = 1024, window: int = 100, prefetch: int = 1000,
             destination: str | None = None, timeout: float = 600.0,
             idle_timeout: float = 30.0, server: psutil.Process | None = None,
             on_tick: Any = None, consumer_delay: float = 0.0,
             tls_ca: str | None = None, persistent: bool = True,
             consumer_port: int | None = None) -> LoadResult:
    """Producers send `total` persistent messages with receipts; consumers ACK each one.
    With `persistent` False the messages are not persistent and only each producer's last
    SEND asks for a receipt (the window does not apply).

    With no consumers the run ends when every SEND is confirmed (a journal builder).
    `on_tick(confirmed, received)` is called about every 50 ms from this process.
    With `consumer_delay` the consumers start that many seconds after the producers.
    `consumer_port`: the consumers' server, when not the producers' (a cluster's other
    member: benchmarks/cluster.py).
    """
    res = LoadResult(planned=total)
    destination = destination or f"/queue/persistent.{uuid.uuid4().hex[:10]}"
    deadline = time.monotonic() + SETUP_TIMEOUT_S + timeout
    ctx = mp.get_context("fork")
    shared = Shared(ctx.Queue(), ctx.Event(), ctx.RawValue("b", 0),
                    ctx.RawArray("q", max(consumers, 1)), ctx.RawArray("q", producers))
    every = max(1, total // LATENCY_SAMPLES)
    pool = GeneratorPool(ctx, shared.events, res.errors)
    cpu0 = cpu_seconds()
    server_cpu0 = None
    threads0: dict[int, float] = {}
    host0 = host1 = 0.0
    t0 = time.monotonic()

    def launch_consumers() -> None:
        for i in range(consumers):
            pool.launch("consumer", i, generator_main, (
                Job("consumer", i, host, consumer_port or port, destination, deadline, total,
                    size=size,
                    prefetch=prefetch, sample_every=every, late=consumer_delay > 0,
                    tls_ca=tls_ca), shared))

    try:
        if consumer_delay <= 0:
            launch_consumers()
        if consumer_delay > 0 or pool.wait_ready("consumer", consumers, SETUP_TIMEOUT_S):
            first = 0
            for i, count in enumerate(split(total, producers)):
                pool.launch("producer", i, generator_main, (
                    Job("producer", i, host, port, destination, deadline, total, first, count,
                        size, window, sample_every=every, tls_ca=tls_ca,
                        persistent=persistent), shared))
                first += count
            if pool.wait_ready("producer", producers, SETUP_TIMEOUT_S):
                server_cpu0 = process_cpu(server)
                threads0 = thread_cpu(server)
                host0 = host_busy_cpu()
                t0 = time.monotonic()
                shared.start.set()
                late = (t0 + consumer_delay, launch_consumers) if consumer_delay > 0 else None
                _watch(res, shared, pool, producers, consumers, total, deadline,
                       idle_timeout, server, on_tick, late)
    finally:
        if server_cpu0 is not None:
            host1 = host_busy_cpu()
            after = process_cpu(server)
            res.server_cpu_s = None if after is None else round(after - server_cpu0, 3)
            threads = thread_cpu(server)
            if server is not None and server.pid in threads:
                res.server_loop_cpu_s = round(threads[server.pid] - threads0.get(server.pid, 0),
                                              3)
        shared.stop.value = 2 if res.errors else 1
        shared.start.set()
        pool.collect(REPORT_TIMEOUT_S)
        res.loadgen_cpu_s = cpu_seconds() - cpu0
    _summarise(res, pool.results, total, consumers, time.monotonic() - t0)
    if host1 and res.server_cpu_s is not None:
        # Generator CPU after the start signal is about all of it (setup is cheap).
        res.other_cpu_s = round(host1 - host0 - res.server_cpu_s - res.loadgen_cpu_s, 3)
    return res


def _watch(res: LoadResult, shared: Shared, pool: GeneratorPool, producers: int,
           consumers: int, total: int, deadline: float, idle_timeout: float,
           server: psutil.Process | None, on_tick: Any, late: Any = None) -> None:
    """`late`: (monotonic time, launch) to start the consumers at that time."""
    last, changed = (-1, -1), time.monotonic()
    complete_at = None
    next_tick = 0.0
    while True:
        pool.take(0.01)
        if res.errors:
            return
        now = time.monotonic()
        if late is not None and now >= late[0]:
            late[1]()
            late, changed = None, now
        confirmed = sum(shared.sent)
        received = sum(shared.progress) if consumers else 0
        if on_tick is not None and now >= next_tick:
            on_tick(confirmed, received)
            next_tick = now + 0.05
        if (confirmed, received) != last:
            last, changed = (confirmed, received), now
        if consumers:
            finished = received >= total
        else:
            finished = len(pool.role_results("producer")) == producers
        if finished:
            complete_at = complete_at or now
            if not consumers or now - complete_at >= DUPLICATE_GRACE_S:
                return
            continue
        if now - changed > idle_timeout:
            res.errors.append(f"stalled: no progress for {idle_timeout:.0f}s (confirmed "
                              f"{confirmed}, received {received} of {total})")
            return
        if now > deadline:
            res.errors.append(f"timed out: confirmed {confirmed}, received {received} of "
                              f"{total}")
            return
        if server is not None and not alive(server):
            res.errors.append("the server process died")
            return


def _summarise(res: LoadResult, results: dict, total: int, consumers: int,
               wall: float) -> None:
    prods = [r for (role, _), r in results.items() if role == "producer"]
    cons = [r for (role, _), r in results.items() if role == "consumer"]
    res.confirmed = sum(r.get("confirmed", 0) for r in prods)
    res.received = sum(r.get("received", 0) for r in cons)
    res.redelivered = sum(r.get("redelivered", 0) for r in cons)
    res.bad_bodies = sum(r.get("bad", 0) for r in cons)
    cpus = [r.get("cpu_s", 0.0) for r in prods + cons]
    res.loadgen_cpu_s = round(res.loadgen_cpu_s + sum(cpus), 3)
    firsts = [r["first_send_ns"] for r in prods if r.get("first_send_ns")]
    receipted = [r["last_receipt_ns"] for r in prods if r.get("last_receipt_ns")]
    if firsts and receipted and max(receipted) > min(firsts):
        res.producer_seconds = round((max(receipted) - min(firsts)) / 1e9, 3)
        res.producer_msgs_per_s = round(res.confirmed / res.producer_seconds, 1)
    if consumers:
        lasts = [r["last_ack_ns"] for r in cons if r.get("last_ack_ns")]
        done = res.received
    else:
        lasts = [r["last_receipt_ns"] for r in prods if r.get("last_receipt_ns")]
        done = res.confirmed
    if firsts and lasts and max(lasts) > min(firsts):
        res.seconds = round((max(lasts) - min(firsts)) / 1e9, 3)
        res.msgs_per_s = round(done / res.seconds, 1)
    busy = res.seconds or wall
    if busy > 0 and cpus:
        res.busiest_generator_cpu_util = round(max(cpus) / busy, 3)
    receipts = array("q")
    for r in prods:
        receipts.extend(r.get("receipt_ns", ()))
    ordered = sorted(receipts)
    res.receipt_p50_ms = percentile_ms(ordered, 0.50)
    res.receipt_p99_ms = percentile_ms(ordered, 0.99)
    res.receipt_max_ms = percentile_ms(ordered, 1.0)
    e2e = array("q")
    for r in cons:
        e2e.extend(r.get("e2e_ns", ()))
    ordered = sorted(e2e)
    res.e2e_p50_ms = percentile_ms(ordered, 0.50)
    res.e2e_p99_ms = percentile_ms(ordered, 0.99)
    res.e2e_max_ms = percentile_ms(ordered, 1.0)
    if res.confirmed != total and not res.errors:
        res.errors.append(f"only {res.confirmed} of {total} SENDs were confirmed")
    if consumers:
        maps = [r["seen"] for r in cons if "seen" in r]
        if len(maps) != len(cons) or len(cons) != consumers:
            res.errors.append("a consumer did not report which messages it saw")
            return
        counts = bytearray(total)
        for seen in maps:
            for i in _nonzero(seen):
                counts[i] = min(255, counts[i] + seen[i])
        res.lost = counts.count(0)
        res.duplicated = sum(c - 1 for c in counts if c > 1)
        if res.lost:
            res.errors.append(f"{res.lost} messages lost (never received by any consumer)")
        if res.duplicated:
            res.errors.append(f"{res.duplicated} duplicate deliveries")
        if res.bad_bodies:
            res.errors.append(f"{res.bad_bodies} messages with a wrong body length")


def _nonzero(seen: bytes):
    """Indexes of non-zero bytes, found with C-speed scans over long runs of zeros."""
    translated = seen.translate(bytes([0] + [1] * 255))
    i = translated.find(1)
    while i >= 0:
        yield i
        i = translated.find(1, i + 1)


def server_log_problems(server: ServerProcess, limit: int = 10) -> list[str]:
    """Warnings, errors and tracebacks in the server's log."""
    try:
        lines = server.logs().splitlines()
    except OSError:
        return []
    found = [line for line in lines if SERVER_LOG_PROBLEMS.search(line)]
    return found[:limit] + ([f"... and {len(found) - limit} more"] if len(found) > limit else [])


# --------------------------------------------------------------------------- scenarios


def wait_serving(server: ServerProcess, timeout: float = 20.0) -> None:
    """Until the server accepts a STOMP client (a pair member serves after taking over)."""
    from pairmq.client.plain import BlockingConnection, StompError

    deadline = time.monotonic() + timeout
    while True:
        try:
            BlockingConnection(server.host, server.port, timeout=2.0).close()
            return
        except (StompError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_listening(server: ServerProcess, port: int) -> None:
    """The TLS listener opens just after the plaintext one the helper waited for."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex((server.host, port)) == 0:
                return
        time.sleep(0.05)
    raise LoadError(f"the TLS listener on port {port} did not open")


def run_scenario(args: argparse.Namespace, name: str) -> dict[str, Any]:
    n_producers, n_consumers = SCENARIOS[name]
    workdir = Path(tempfile.mkdtemp(prefix=f"pairmq-persistent-{name}-", dir=args.workdir))
    flags = ["--segment-bytes", str(args.segment_bytes), "--log-level", "info"]
    if args.address_full_policy:
        flags += ["--address-full-policy", args.address_full_policy]
    if args.deliver_unconfirmed:
        flags.append("--deliver-unconfirmed")
    journal_home = None
    if args.shared_store:
        # a shared-store server with no backup running: the lock verification and the
        # journal writer's fence are on the path being measured
        journal_home = workdir / "shared"
        journal_home.mkdir()
        flags += ["--policy", "shared-store", "--shared-dir", str(journal_home),
                  "--listen", f"127.0.0.1:{free_port()}", "--peer", f"127.0.0.1:{free_port()}",
                  "--secret", "bench", "--heartbeat-interval-ms", "100",
                  "--activation-interval-ms", "400"]
    tls_ca = None
    port = None
    if args.tls:  # clients on the STOMP TLS listener, with a CA made for the run
        from pairmq.cli.local_ca import LocalCA

        ca = LocalCA(workdir / "tls")
        issued = ca.issue("server")
        port = free_port()
        flags += ["--stomp-tls", f"127.0.0.1:{port}", "--tls-cert", str(issued.cert),
                  "--tls-key", str(issued.key)]
        tls_ca = str(ca.cert_path)
    server = start_server(workdir, *flags, name="persistent")
    if journal_home is not None:
        wait_serving(server)
    journal = (journal_home or server.data_dir) / "journal"
    sampler = JournalSampler(journal, interval=0.5)
    started = time.monotonic()
    record: dict[str, Any] = {}
    try:
        sampler.start()
        if port is not None:
            wait_listening(server, port)
        res = run_load(server.host, port or server.port, n_producers, n_consumers,
                       args.messages, size=args.size, window=args.window,
                       prefetch=args.prefetch, timeout=args.timeout,
                       server=psutil.Process(server.proc.pid),
                       consumer_delay=args.consumer_delay, tls_ca=tls_ca)
        sampler.stop()
        segments, size, settle_s = settle_journal(journal)
        rss = psutil.Process(server.proc.pid).memory_info().rss if server.alive() else None
        errors = list(res.errors)
        if not server.alive():
            errors.append("the server process died")
        record = {
            "scenario": name,
            "producers": n_producers,
            "consumers": n_consumers,
            "messages": args.messages,
            "size": args.size,
            "window": args.window,
            "prefetch": args.prefetch,
            "msgs_per_s": res.msgs_per_s,
            "seconds": res.seconds,
            "consumer_delay_s": args.consumer_delay,
            "address_full_policy": args.address_full_policy or "server default",
            "deliver_unconfirmed": args.deliver_unconfirmed,
            "tls": args.tls,
            "producer_msgs_per_s": res.producer_msgs_per_s,
            "producer_seconds": res.producer_seconds,
            "received": res.received,
            "confirmed": res.confirmed,
            "lost": res.lost,
            "duplicated": res.duplicated,
            "redelivered": res.redelivered,
            "receipt_p50_ms": res.receipt_p50_ms,
            "receipt_p99_ms": res.receipt_p99_ms,
            "receipt_max_ms": res.receipt_max_ms,
            "e2e_p50_ms": res.e2e_p50_ms,
            "e2e_p99_ms": res.e2e_p99_ms,
            "e2e_max_ms": res.e2e_max_ms,
            "server_cpu_s": res.server_cpu_s,
            "server_cpu_util": (round(res.server_cpu_s / res.seconds, 3)
                                if res.server_cpu_s and res.seconds else None),
            "server_cpu_us_per_msg": (round(res.server_cpu_s / res.received * 1e6, 1)
                                      if res.server_cpu_s and res.received else None),
            "server_loop_cpu_s": res.server_loop_cpu_s,
            "server_loop_cpu_util": (round(res.server_loop_cpu_s / res.seconds, 3)
                                     if res.server_loop_cpu_s and res.seconds else None),
            "loadgen_cpu_s": res.loadgen_cpu_s,
            "busiest_generator_cpu_util": res.busiest_generator_cpu_util,
            "other_cpu_s": res.other_cpu_s,
            "server_rss_bytes": rss,
            "journal_peak_segments": sampler.peak_segments,
            "journal_peak_bytes": sampler.peak_bytes,
            "journal_segments_created": sampler.highest_segment,
            "journal_after_segments": segments,
            "journal_after_bytes": size,
            "journal_settle_s": settle_s,
            "segment_bytes": args.segment_bytes,
            "host_cpus": psutil.cpu_count(),
            "wall_s": round(time.monotonic() - started, 3),
        }
        if segments > 2 and not errors:
            errors.append(f"journal did not shrink back: {segments} segments, {size} bytes "
                          "after everything was acknowledged")
        record["server_log_problems"] = server_log_problems(server)
        record["ok"] = not errors
        record["errors"] = errors
    finally:
        sampler.stop()
        code = server.stop()
        if code not in (0, None):
            record.setdefault("errors", []).append(f"server exited with code {code}")
            record["ok"] = False
        if record.get("ok") and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            record["workdir"] = str(workdir)
    return record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    ap.add_argument("--messages", type=int, default=100_000, help="in total, all producers")
    ap.add_argument("--size", type=int, default=1024, help="body bytes per message")
    ap.add_argument("--window", type=int, default=100, help="receipts in flight per producer")
    ap.add_argument("--prefetch", type=int, default=1000, help="prefetch-count per consumer")
    ap.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024,
                    help="the server's journal segment size")
    ap.add_argument("--shared-store", action="store_true",
                    help="run the server as a shared-store pair member (alone, serving)")
    ap.add_argument("--timeout", type=float, default=300.0, help="cap on one scenario, seconds")
    ap.add_argument("--workdir", default=None, help="where data directories go (default: tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the data directory and log")
    ap.add_argument("--tls", action="store_true",
                    help="producers and consumers on the server's STOMP TLS listener")
    ap.add_argument("--consumer-delay", type=float, default=0.0,
                    help="start the consumers this many seconds after the producers")
    ap.add_argument("--address-full-policy", choices=["page", "block", "fail", "drop"],
                    default=None, help="the server's address_full_policy (default: its own)")
    ap.add_argument("--deliver-unconfirmed", action="store_true",
                    help="the server delivers before the disk confirms (its option)")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.size < 0 or args.window < 1 or args.prefetch < 1:
        ap.error("--messages, --window and --prefetch must be positive, --size not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    failed = False
    for name in names:
        try:
            record = run_scenario(args, name)
        except (RuntimeError, TimeoutError) as e:
            print(f"FAILED {name}: {e}", file=sys.stderr, flush=True)
            failed = True
            continue
        print(json.dumps(record), flush=True)
        if not record["ok"]:
            failed = True
            for err in record["errors"]:
                print(f"FAILED {name}: {err}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
