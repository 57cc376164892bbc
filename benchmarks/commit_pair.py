#!/usr/bin/env python3
"""A large COMMIT on the active server of a replicated pair, with a canary client beside it.

    .venv/bin/python benchmarks/commit_pair.py --messages 100000 --runs 3

A replicated pair with its witness (the tests' timings: heartbeats every 100 ms,
activation after 400 ms), the backup in sync. A transaction of --messages persistent
SENDs (100-byte bodies) is staged, then a canary client (a persistent message with a
receipt every 10 ms, received back) starts, and the transaction is committed: applied in
slices over many turns (core/broker/committing.py), each confirmed by the backup. One JSON line
per run: the seconds from the COMMIT to its RECEIPT, the canary's worst and 99th
percentile round, what it lost, and the active's state after. An older build may lose
its lease during the COMMIT: the canary then fails, and the line says so.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from tests.ha.pair import Pair, wait_for  # noqa: E402
from tests.support.canary import Canary  # noqa: E402
from tests.support.commits import Replies, send_commit, stage  # noqa: E402


class _Address:
    def __init__(self, port: int) -> None:
        self.host, self.port = "127.0.0.1", port


def run(messages: int) -> dict[str, object]:
    pair = Pair(Path(tempfile.mkdtemp(prefix="pairmq-commit-pair-")),
                flags=["--max-transaction-messages", str(messages)])
    try:
        pair.start(parallel=True)
        pair.wait_formed()
        wait_for(lambda: (pair.status("primary") or {}).get("ha", {})
                 .get("synchronized-with-backup"), 20, "the backup in sync")
        conn = pair.connect("primary", timeout=30)
        stage(conn, "big", "/queue/committed", messages)
        try:
            with Canary(_Address(pair.stomp_port["primary"]), interval=0.01) as canary:
                time.sleep(0.3)
                replies = Replies(conn)
                started = time.monotonic()
                receipt = send_commit(conn, "big")
                got = replies.wait(receipt, 120)
                took = time.monotonic() - started
                time.sleep(0.3)
        except RuntimeError as e:  # the canary found no server
            return {"messages": messages, "failed": str(e)[:160],
                    "state": pair.state("primary")}
        rounds = sorted(canary.rounds)
        return {"messages": messages, "commit_s": round(took, 3), "receipt": bool(got),
                "canary_worst_ms": round(canary.worst * 1000, 1),
                "canary_p99_ms": round(rounds[int(len(rounds) * 0.99)] * 1000, 1),
                "canary_lost": len(canary.lost), "state": pair.state("primary")}
    finally:
        pair.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps(run(args.messages)), flush=True)


if __name__ == "__main__":
    main()
