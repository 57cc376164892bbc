"""An application process that sends through a durable connection (an outbox), for tests
that kill it: `python -m tests.support.outbox_producer URL OUTBOX DESTINATION PREFIX FIRST
LAST PAUSE_S`.

It sends PREFIX-FIRST .. PREFIX-LAST (inclusive), each with its own id as dup-id (what an
idempotent application does: a message sent again after a crash is the same message), and
prints `stored N` once send() returned for message N, then `done` once every message is
confirmed by a server (or `unconfirmed K` if some are not within 60 s).
"""

from __future__ import annotations

import sys
import time

import pairmq.client


def main(argv: list[str]) -> int:
    url, outbox, destination, prefix, first, last, pause = argv
    client = pairmq.client.connect(url, outbox=outbox, retry_interval=50,
                                   max_retry_interval=200, connection_ttl=0)
    for n in range(int(first), int(last) + 1):
        message_id = f"{prefix}-{n}"
        client.send(destination, message_id, headers={"dup-id": message_id})
        print(f"stored {n}", flush=True)
        time.sleep(float(pause))
    deadline = time.monotonic() + 60
    while client.stats()["outbox"]["depth"] and time.monotonic() < deadline:
        time.sleep(0.05)
    depth = client.stats()["outbox"]["depth"]
    print("done" if not depth else f"unconfirmed {depth}", flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
