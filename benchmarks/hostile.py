"""What hostile and careless clients cost everyone else (issue 20), measured beside a
well-behaved canary client: one JSON line per attack.

Run from the repository root:

    .venv/bin/python benchmarks/hostile.py
    .venv/bin/python benchmarks/hostile.py --queues 240000
    .venv/bin/python benchmarks/hostile.py --only commit --commit-messages 100000

A standalone server with its management port. A canary client sends a persistent message
with a receipt every 20 ms and receives it back; each line gives the canary's worst and
median round during the attack, the server's RSS before and after, and the attack's own
figures:

- `junk_queues`: connections subscribe to --queues new queue names, 10,000 each (the issue's
  100,000 in 1.6 s), then GET /metrics five times (the per-destination series are off
  past max_destination_metrics, 10,000 by default) and GET /api/destinations five times
  (the console's view: the first 1,000 by name);
- `unfinished_connects`: 30 sockets each send a CONNECT without its NUL and 15 MiB;
- `login_timing`: 20 wrong passwords for an existing user and 20 unknown users, over
  STOMP, alternated (medians, and their ratio);
- `commit`: one transaction of --commit-messages SENDs (100,000 by default, the default
  max_transaction_messages; 100-byte persistent bodies, pipelined, a receipt every 5,000),
  then its COMMIT, applied in slices over many turns: the seconds to stage it and from
  the COMMIT to its RECEIPT, and the messages then in the queue (the canary's worst
  round is the one during the COMMIT: the canary starts 0.5 s before it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tests.serverproc import free_port, start_server  # noqa: E402
from tests.support.admin import admin_request, admin_user_flags  # noqa: E402
from tests.support.canary import Canary  # noqa: E402
from tests.support.commits import stage  # noqa: E402

from pairmq.client.plain import BlockingConnection  # noqa: E402
from pairmq.protocol import Frame, serialize  # noqa: E402

MiB = 1024 * 1024
CONFIG = """
[auth]
allow_anonymous = true
failed_login_delay_max_ms = 0

[auth.users.alice]
password = "right"
"""


def canary_figures(canary: Canary) -> dict[str, float]:
    rounds = canary.rounds or [0.0]
    return {"canary_worst_ms": round(max(rounds) * 1000, 1),
            "canary_median_ms": round(statistics.median(rounds) * 1000, 1),
            "canary_lost": len(canary.lost)}


def junk_queues(srv, admin: str, count: int) -> dict[str, object]:
    """`count` new queue names subscribed to, 10,000 a connection (the most one may hold,
    max_subscriptions_per_connection), each connection closed once it has them."""
    started = time.monotonic()
    for start in range(0, count, 10_000):
        conn = BlockingConnection(srv.host, srv.port)
        try:
            for first in range(start, min(count, start + 10_000), 1000):
                last = min(count, first + 1000)
                conn.sock.sendall(b"".join(serialize(Frame("SUBSCRIBE", {
                    "destination": f"/queue/junk.{i}", "id": str(i)}), "1.2")
                    for i in range(first, last - 1)))
                conn.request(Frame("SUBSCRIBE", {"destination": f"/queue/junk.{last - 1}",
                                                 "id": str(last - 1)}), timeout=60)
        finally:
            conn.close()
    made = time.monotonic() - started
    times, size = [], 0
    for _ in range(5):
        t = time.monotonic()
        code, _, body = admin_request(admin, "/metrics", timeout=60)
        times.append(time.monotonic() - t)
        size = len(str(body))
        assert code == 200
    listed = []  # what the console asks every 2 s (the first 1,000 by name, their rates)
    for _ in range(5):
        t = time.monotonic()
        code, _, body = admin_request(admin, "/api/destinations", timeout=60)
        listed.append(time.monotonic() - t)
        assert code == 200 and body["total"] >= count
    return {"queues": count, "made_s": round(made, 2),
            "metrics_s": round(max(times), 3), "metrics_bytes": size,
            "api_destinations_s": round(max(listed), 3)}


def unfinished_connects(srv) -> dict[str, object]:
    sockets, refused = [], 0
    for _ in range(30):
        sock = socket.create_connection(srv.address, timeout=10)
        sockets.append(sock)
        try:
            sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n" + b"x" * (15 * MiB))
        except OSError:
            refused += 1
    for sock in sockets:
        sock.close()
    return {"sockets": 30, "refused_while_sending": refused}


def login_time(srv, login: str, passcode: str) -> float:
    with socket.create_connection(srv.address, timeout=10) as sock:
        started = time.perf_counter()
        sock.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:{login}\n"
                     f"passcode:{passcode}\n\n\x00".encode())
        sock.recv(4096)
        return time.perf_counter() - started


def login_timing(srv) -> dict[str, object]:
    wrong, unknown = [], []
    for i in range(20):
        wrong.append(login_time(srv, "alice", f"guess{i}"))
        unknown.append(login_time(srv, f"nobody{i}", f"guess{i}"))
    w, u = statistics.median(wrong), statistics.median(unknown)
    return {"wrong_password_ms": round(w * 1000, 2), "unknown_user_ms": round(u * 1000, 2),
            "ratio": round(u / w, 2)}


def commit(admin: str, messages: int, conn: BlockingConnection, staged_s: float
           ) -> dict[str, object]:
    """COMMIT the transaction `prepare_commit` staged on `conn`; its RECEIPT waited for."""
    try:
        started = time.monotonic()
        conn.request(Frame("COMMIT", {"transaction": "t"}), timeout=600)
        took = time.monotonic() - started
    finally:
        conn.close()
    _, _, status = admin_request(admin, "/status", timeout=60)
    queued = status["destinations"].get("/queue/committed", {}).get("messages", 0)
    return {"messages": messages, "stage_s": round(staged_s, 3), "commit_s": round(took, 3),
            "queued": queued}


def prepare_commit(srv, messages: int) -> tuple[BlockingConnection, float]:
    """A connection with transaction "t" of `messages` SENDs staged (before the canary
    starts: the staging is not the COMMIT), and the seconds that took."""
    conn = BlockingConnection(srv.host, srv.port, timeout=60)
    started = time.monotonic()
    stage(conn, "t", "/queue/committed", messages, timeout=60)
    return conn, time.monotonic() - started


ATTACKS = ("junk_queues", "unfinished_connects", "login_timing", "commit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--commit-messages", type=int, default=100_000,
                        help="SENDs in the committed transaction (default 100,000)")
    parser.add_argument("--only", action="append", choices=ATTACKS,
                        help="run this attack only (repeatable; default: all of them)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-hostile-"))
    admin = f"127.0.0.1:{free_port()}"
    srv = start_server(workdir, "--admin", admin, *admin_user_flags(),
                       "--max-destinations", str(args.queues + 1000),
                       "--auto-delete-delay-ms", "600000",
                       "--max-transaction-messages", str(max(args.commit_messages, 1)),
                       config_text=CONFIG, name="hostile")
    staged: dict[str, tuple[BlockingConnection, float]] = {}
    attacks = [("junk_queues", lambda: junk_queues(srv, admin, args.queues)),
               ("unfinished_connects", lambda: unfinished_connects(srv)),
               ("login_timing", lambda: login_timing(srv)),
               ("commit", lambda: commit(admin, args.commit_messages, *staged["commit"]))]
    preparations = {"commit": lambda: prepare_commit(srv, args.commit_messages)}
    try:
        for name, attack in attacks:
            if args.only and name not in args.only:
                continue
            if name in preparations:
                staged[name] = preparations[name]()
            before = srv.rss()
            with Canary(srv, interval=0.02) as canary:
                time.sleep(0.5)
                figures = attack()
                time.sleep(0.5)
            print(json.dumps({"attack": name, **figures, **canary_figures(canary),
                              "rss_before_mb": round(before / MiB),
                              "rss_after_mb": round(srv.rss() / MiB)}), flush=True)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
