#!/usr/bin/env python3
"""Crash campaign: SIGKILL a real pairmq server again and again while it takes messages.

    python benchmarks/crash_campaign.py --kills 100 --seed 7

One server (small journal segments, so they roll and get compacted) is started on a
fixed port. A producer sends persistent messages with receipts, each with its own
`dup-id`, keeping a window of them outstanding. Meanwhile the server is killed with
SIGKILL at random moments (the seed fixes the schedule) and restarted at once on the
same data directory and port. After every lost connection the producer reconnects and
resends every message it has not seen receipted, with the same dup-id, exactly as a
careful client would.

Most messages go to the main queue, which nobody reads while the kills happen: every
receipted message must be consumed exactly once (at least once because it was
receipted, at most once because of its dup-id). The others go to a "churn" queue that a
consumer drains and acknowledges during the kills, so segments die and are compacted
under fire; a consumer gets at-least-once delivery, so there only losses count.

The kills come in rounds (--round-kills). At the end of a round the producer stops
taking new messages until everything it sent is receipted, the server is killed once
more and restarted, and the main queue is drained and checked; then the next round
starts. (This keeps the journal, and the time a restart takes, bounded in a long run.)
At the end the churn queue is drained too.

It prints one JSON line (the summary) and exits 1 on any loss, duplicate, protocol
error or failed restart. tests/integration/test_crash.py runs a short campaign of it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.integration.rawstomp import ConnectionClosed, RawStomp, StompError  # noqa: E402
from tests.integration.rawstomp import connect as stomp_connect  # noqa: E402
from tests.serverproc import ServerProcess, free_port, start_server  # noqa: E402

MAIN_QUEUE = "/queue/crash-main"
CHURN_QUEUE = "/queue/crash-churn"
RECONNECT_TIMEOUT = 60.0  # the restarted server must accept connections within this
STALL_TIMEOUT = 20.0  # a live connection with receipts outstanding must answer within this
DRAIN_IDLE = 5.0  # a drain gives up after this long without a message
DRAIN_QUIET = 1.0  # ... and, once it saw everything expected, waits this long for extras
NETWORK_ERRORS = (OSError, ConnectionClosed, StompError)


@dataclass
class Settings:
    kills: int = 20
    seed: int = 1
    min_interval: float = 0.2  # seconds between a restart and the next kill
    max_interval: float = 1.5
    round_kills: int = 10  # kills between two drains of the main queue (0: one round)
    rate: float = 2000.0  # new messages per second at most (0 = as fast as possible)
    window: int = 32  # SENDs outstanding (without their receipt) at a time
    body_bytes: int = 300
    churn_percent: int = 30  # share of messages sent to the churn queue
    segment_bytes: int = 65536
    dup_ids: bool = True  # off only to see what a producer without them gets: duplicates
    extra_flags: tuple[str, ...] = ()


@dataclass
class Summary:
    seed: int = 0
    kills: int = 0  # SIGKILLs at random moments while producing
    kills_with_sends_outstanding: int = 0  # ... that cut a connection waiting for receipts
    restarts: int = 0  # every restart, the ones before each drain included
    rounds: int = 0
    sent: int = 0  # SEND frames written, resends included
    resent: int = 0
    messages: int = 0  # distinct messages (dup-ids)
    receipted: int = 0
    consumed: int = 0  # main queue deliveries at the drains, duplicates included
    duplicates: int = 0
    lost: int = 0  # receipted but never consumed (main and churn queues)
    main_lost: int = 0
    churn_lost: int = 0
    unexpected: int = 0  # consumed but never sent, or from the wrong queue
    churn_receipted: int = 0
    churn_consumed: int = 0
    churn_redelivered: int = 0  # at-least-once repeats on the churn queue: allowed
    summarised_restarts: int = 0  # restarts that read sealed segments through summaries
    torn_tails: int = 0  # restarts that cut a torn write (logged)
    torn_bytes_dropped: int = 0
    slowest_restart_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ok: bool = False


def is_churn(message_id: int, percent: int) -> bool:
    return (message_id * 7919) % 100 < percent


class Server:
    """The one server of the campaign: same name, data directory and port across restarts."""

    TORN = re.compile(r"torn (?:write|header).*?(\d+) bytes")
    SUMMARISED = re.compile(r"\(\d+ of the segments through their summaries\)")

    def __init__(self, workdir: Path, flags: list[str], summary: Summary) -> None:
        self.workdir = workdir
        self.flags = flags
        self.port = free_port()
        self.summary = summary
        self.srv: ServerProcess = self._start()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def _start(self) -> ServerProcess:
        began = time.monotonic()
        srv = start_server(self.workdir, *self.flags, name="crash", port=self.port)
        took = time.monotonic() - began
        self.summary.slowest_restart_s = round(max(self.summary.slowest_restart_s, took), 2)
        if self.SUMMARISED.search(srv.logs()):
            self.summary.summarised_restarts += 1
        for match in self.TORN.finditer(srv.logs()):
            self.summary.torn_tails += 1
            self.summary.torn_bytes_dropped += int(match.group(1))
        return srv

    def crash_and_restart(self) -> None:
        self.srv.kill()
        self.summary.restarts += 1
        self.srv = self._start()  # raises (with the server's output) if it refuses to start

    def stop(self) -> None:
        self.srv.stop()


def connect(address: tuple[str, int], deadline: float) -> RawStomp:
    """CONNECT, retrying while the server restarts."""
    while True:
        try:
            client, _ = stomp_connect(address, timeout=5.0)
            return client
        except (*NETWORK_ERRORS, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Producer(threading.Thread):
    """Sends persistent messages with dup-ids and receipts; resends the unreceipted."""

    def __init__(self, address: tuple[str, int], settings: Settings, summary: Summary) -> None:
        super().__init__(name="producer", daemon=True)
        self.address = address
        self.settings = settings
        self.summary = summary
        self.paused = threading.Event()  # no new messages (resends still go out)
        self.quit = threading.Event()  # return once everything sent is receipted
        self.confirmed: set[int] = set()
        self.unconfirmed: set[int] = set()  # sent at least once, no receipt seen yet
        self.next_id = 0
        self.attempt = 0
        self.failed: str | None = None
        self.body_pad = b"." * settings.body_bytes
        self.began = time.monotonic()

    @property
    def idle(self) -> bool:
        return self.paused.is_set() and not self.unconfirmed

    def pause(self) -> None:
        self.paused.set()

    def resume(self) -> None:
        if self.settings.rate:  # no burst to catch up with the time spent paused
            self.began = time.monotonic() - self.next_id / self.settings.rate
        self.paused.clear()

    def run(self) -> None:
        try:
            while not (self.quit.is_set() and not self.unconfirmed):
                client = connect(self.address, time.monotonic() + RECONNECT_TIMEOUT)
                try:
                    self._session(client)
                except NETWORK_ERRORS:
                    pass  # the server died: reconnect and resend what is unconfirmed
                finally:
                    client.close()
        except Exception as e:  # anything else ends the campaign with a finding
            self.failed = f"producer: {type(e).__name__}: {e}"

    def _next_new(self) -> int | None:
        if self.paused.is_set() or self.quit.is_set():
            return None
        rate = self.settings.rate
        if rate:
            ahead = self.began + self.next_id / rate - time.monotonic()
            if ahead > 0.002:
                return None  # come back after reading a frame
        message_id = self.next_id
        self.next_id += 1
        self.unconfirmed.add(message_id)
        return message_id

    def _send(self, client: RawStomp, message_id: int) -> str:
        self.attempt += 1
        receipt = f"{message_id}.{self.attempt}"
        churn = is_churn(message_id, self.settings.churn_percent)
        headers = {"destination": CHURN_QUEUE if churn else MAIN_QUEUE, "persistent": "true",
                   "x-id": str(message_id), "receipt": receipt}
        if self.settings.dup_ids:
            headers["dup-id"] = f"msg-{message_id}"
        client.send_frame("SEND", headers, b"%d:" % message_id + self.body_pad)
        self.summary.sent += 1
        return receipt

    def _session(self, client: RawStomp) -> None:
        outstanding: dict[str, int] = {}  # receipt id -> message id
        resend = sorted(self.unconfirmed)
        last_answer = time.monotonic()
        while True:
            while len(outstanding) < self.settings.window:
                if resend:
                    message_id = resend.pop(0)
                    self.summary.resent += 1
                else:
                    message_id = self._next_new()
                    if message_id is None:
                        break
                if not outstanding:
                    last_answer = time.monotonic()
                outstanding[self._send(client, message_id)] = message_id
            if not outstanding:
                if self.quit.is_set():
                    return  # everything sent was receipted
                time.sleep(0.001 if not self.paused.is_set() else 0.01)
                continue
            more_due = self.settings.rate and not self.paused.is_set()
            try:
                frame = client.read_frame(0.005 if more_due else 1.0)
            except TimeoutError:
                if time.monotonic() - last_answer > STALL_TIMEOUT:
                    raise RuntimeError(f"no receipt for {len(outstanding)} SENDs within "
                                       f"{STALL_TIMEOUT} s on a live connection") from None
                continue
            if frame.command == "RECEIPT":
                message_id = outstanding.pop(frame.headers["receipt-id"])
                self.confirmed.add(message_id)
                self.unconfirmed.discard(message_id)
                last_answer = time.monotonic()
            elif frame.command == "ERROR":
                self.summary.errors.append(f"ERROR to the producer: {frame.headers}")
                raise ConnectionClosed("ERROR")


class ChurnConsumer(threading.Thread):
    """Consumes and acknowledges the churn queue while the server is being killed."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(name="churn", daemon=True)
        self.address = address
        self.done = threading.Event()
        self.seen: list[int] = []
        self.failed: str | None = None

    def run(self) -> None:
        try:
            while not self.done.is_set():
                client = connect(self.address, time.monotonic() + RECONNECT_TIMEOUT)
                try:
                    client.send_frame("SUBSCRIBE", {"destination": CHURN_QUEUE, "id": "churn",
                                                    "ack": "client-individual",
                                                    "prefetch-count": "50"})
                    while not self.done.is_set():
                        try:
                            frame = client.read_frame(0.2)
                        except TimeoutError:
                            continue
                        if frame.command == "MESSAGE":
                            self.seen.append(int(frame.headers["x-id"]))
                            client.send_frame("ACK", {"id": frame.headers["ack"]})
                        elif frame.command == "ERROR":
                            self.failed = f"ERROR to the churn consumer: {frame.headers}"
                            return
                except NETWORK_ERRORS:
                    pass
                finally:
                    client.close()
        except Exception as e:
            self.failed = f"churn consumer: {type(e).__name__}: {e}"


def drain(address: tuple[str, int], destination: str, expected: set[int]) -> list[int]:
    """Every message left on `destination` (auto ack). Ends DRAIN_QUIET after the last of
    `expected` arrived, or DRAIN_IDLE after the last message when some never come."""
    client = connect(address, time.monotonic() + RECONNECT_TIMEOUT)
    got: list[int] = []
    missing = set(expected)
    try:
        client.send_frame("SUBSCRIBE", {"destination": destination, "id": "drain"})
        while True:
            try:
                frame = client.read_frame(DRAIN_QUIET if not missing else DRAIN_IDLE)
            except TimeoutError:
                break
            if frame.command == "MESSAGE":
                message_id = int(frame.headers["x-id"])
                got.append(message_id)
                missing.discard(message_id)
                if not frame.body.startswith(b"%d:" % message_id):
                    raise AssertionError(f"message {message_id} has another's body")
            elif frame.command == "ERROR":
                raise StompError(frame)
    finally:
        client.close()
    return got


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_campaign(settings: Settings, workdir: Path,
                 log: Callable[[str], None] | None = None) -> Summary:
    """Run one campaign in `workdir`; `log(text)` is told of progress."""
    say = log or (lambda text: None)
    summary = Summary(seed=settings.seed)
    rng = random.Random(settings.seed)
    started = time.monotonic()
    flags = ["--segment-bytes", str(settings.segment_bytes), "--heartbeat-ms", "0",
             *settings.extra_flags]
    server = Server(workdir, flags, summary)
    producer = Producer(server.address, settings, summary)
    churn = ChurnConsumer(server.address)
    consumed: list[int] = []
    drained_rest: list[int] = []
    per_round = settings.round_kills or settings.kills
    try:
        producer.start()
        churn.start()
        while summary.kills < settings.kills:
            summary.rounds += 1
            producer.resume()
            for _ in range(min(per_round, settings.kills - summary.kills)):
                progress = len(producer.confirmed)
                # Kill a server at work: after it confirmed something since its restart.
                wait_for(lambda p=progress: len(producer.confirmed) > p or producer.failed,
                         RECONNECT_TIMEOUT)
                time.sleep(rng.uniform(settings.min_interval, settings.max_interval))
                if producer.failed or churn.failed:
                    raise RuntimeError(producer.failed or churn.failed)
                if producer.unconfirmed:
                    summary.kills_with_sends_outstanding += 1
                server.crash_and_restart()
                summary.kills += 1
                say(f"kill {summary.kills}/{settings.kills}: {len(producer.confirmed)} "
                    f"receipted, {len(producer.unconfirmed)} to resend")
            time.sleep(rng.uniform(settings.min_interval, settings.max_interval))
            producer.pause()
            if not wait_for(lambda: producer.idle or producer.failed, RECONNECT_TIMEOUT):
                raise RuntimeError("the producer never got all its receipts")
            # What is drained comes from the journal, not from memory.
            server.crash_and_restart()
            expected = {m for m in producer.confirmed
                        if not is_churn(m, settings.churn_percent)} - set(consumed)
            say(f"round {summary.rounds}: draining {len(expected)} messages")
            consumed += drain(server.address, MAIN_QUEUE, expected)
        producer.quit.set()
        producer.join(RECONNECT_TIMEOUT)
        churn_expected = {m for m in producer.confirmed if is_churn(m, settings.churn_percent)}
        wait_for(lambda: churn_expected <= set(churn.seen) or bool(churn.failed), 30)
        churn.done.set()
        churn.join(10)
        server.crash_and_restart()
        drained_rest = drain(server.address, CHURN_QUEUE, set())
        consumed += drain(server.address, MAIN_QUEUE, set())  # nothing may be left
    except Exception as e:  # a server that does not come back, a drain that fails, ...
        summary.errors.append(f"campaign: {type(e).__name__}: {e}")
    finally:
        producer.quit.set()
        producer.paused.set()
        churn.done.set()
        server.stop()
    for failure in (producer.failed, churn.failed):
        if failure and failure not in " ".join(summary.errors):
            summary.errors.append(failure)

    churn_percent = settings.churn_percent
    sent_ids = set(range(producer.next_id))
    main_expected = {m for m in producer.confirmed if not is_churn(m, churn_percent)}
    churn_expected = set(producer.confirmed) - main_expected
    churn_seen = set(churn.seen) | set(drained_rest)
    consumed_set = set(consumed)
    summary.messages = producer.next_id
    summary.receipted = len(producer.confirmed)
    summary.consumed = len(consumed)
    summary.duplicates = len(consumed) - len(consumed_set)
    summary.main_lost = len(main_expected - consumed_set)
    summary.churn_lost = len(churn_expected - churn_seen)
    summary.lost = summary.main_lost + summary.churn_lost
    summary.unexpected = (len((consumed_set | churn_seen) - sent_ids)
                          + len({m for m in consumed_set if is_churn(m, churn_percent)})
                          + len({m for m in churn_seen if not is_churn(m, churn_percent)}))
    summary.churn_receipted = len(churn_expected)
    summary.churn_consumed = len(churn_seen)
    summary.churn_redelivered = len(churn.seen) + len(drained_rest) - len(churn_seen)
    summary.seconds = round(time.monotonic() - started, 2)
    summary.ok = (not summary.errors and summary.lost == 0 and summary.duplicates == 0
                  and summary.unexpected == 0 and summary.kills == settings.kills
                  and summary.receipted == summary.messages)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs while producing")
    parser.add_argument("--seed", type=int, default=1, help="fixes the kill schedule")
    parser.add_argument("--min-interval", type=float, default=0.2,
                        help="shortest time (s) between a restart and the next kill")
    parser.add_argument("--max-interval", type=float, default=1.5, help="longest such time")
    parser.add_argument("--round-kills", type=int, default=10,
                        help="kills between two drains of the main queue (0: one round)")
    parser.add_argument("--rate", type=float, default=2000.0,
                        help="new messages per second at most (0: no limit)")
    parser.add_argument("--window", type=int, default=32, help="SENDs awaiting receipts")
    parser.add_argument("--body-bytes", type=int, default=300)
    parser.add_argument("--churn-percent", type=int, default=30,
                        help="share of messages for the concurrently drained queue")
    parser.add_argument("--segment-bytes", type=int, default=65536)
    parser.add_argument("--without-dup-ids", action="store_true",
                        help="send no dup-id headers (shows the duplicates resends then make)")
    parser.add_argument("--workdir", type=Path, help="keep the server's files here")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    args = parser.parse_args(argv)
    settings = Settings(kills=args.kills, seed=args.seed, min_interval=args.min_interval,
                        max_interval=args.max_interval, round_kills=args.round_kills,
                        rate=args.rate, window=args.window, body_bytes=args.body_bytes,
                        churn_percent=args.churn_percent, segment_bytes=args.segment_bytes,
                        dup_ids=not args.without_dup_ids)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pairmq-crash-"))
    log = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    try:
        summary = run_campaign(settings, workdir, log)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(vars(summary)), flush=True)
    return 0 if summary.ok else 1


def exit_on_sigterm() -> None:
    """As a command, a SIGTERM ends the campaign with SystemExit, so that the finally
    clauses still stop the server. Only as a command: main() called in another process
    (tests/integration/test_crash.py, in pytest's) leaves that process's handler alone."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
