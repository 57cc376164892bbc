"""A bridge's acknowledgements on the member it takes from (server/cluster/bridge.py): one
cumulative ACK (mode client) for each run of messages confirmed on its own member, in the
order they were delivered; a message its member refuses stays the bridge's and is handed
again a second later. Two standalone members; the receiving one's queue is small and
refuses when full (address_full_policy fail), so refusals and acknowledgements interleave,
with persistent and non-persistent messages mixed (a non-persistent one is confirmed at
once, a persistent one only on disk: an ACK must never cover one not yet confirmed).
Before: a window of refusals stalled the bridge a second per refused message (116 of 200
in 90 s), and a refused message given back with a NACK counted as a failed delivery, so
that after a few refusals it went to the dead-letter queue of the store-and-forward
queue instead of to its consumer."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from pairmq.client import connect
from tests.support.cluster import StandaloneCluster

QUEUE = "/queue/narrow"
TOTAL = 200


def test_refusals_and_cumulative_acks_leave_each_message_once(tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path, 2, flags_for={
        0: ["--bridge-window", "64"],
        1: ["--bridge-window", "64", "--address-full-policy", "fail",
            "--max-size-bytes", "8000"]})
    try:
        cluster.start()
        consumer = connect(cluster.url(1))
        sub = consumer.subscribe(QUEUE, ack="client-individual",
                                 headers={"prefetch-count": "4"})
        producer = connect(cluster.url(0))
        body = "x" * 400
        for k in range(TOTAL):
            producer.send_async(QUEUE, f"m{k}:{body}",
                                headers={"dup-id": f"d-m{k}",
                                         "persistent": "true" if k % 2 == 0 else "false"})
        producer.flush()
        seen: Counter[str] = Counter()
        deadline = time.monotonic() + 90
        while sum(seen.values()) < TOTAL and time.monotonic() < deadline:
            message = sub.receive(0.5)
            if message is None:
                continue
            seen[message.text.split(":", 1)[0]] += 1
            consumer.ack(message)
            time.sleep(0.005)  # slower than the bridge brings them: member 1's queue fills
        assert len(seen) == TOTAL and set(seen.values()) == {1}, \
            f"{len(seen)} distinct of {TOTAL}, {sum(seen.values())} received"
        server = cluster.servers[1]
        assert server is not None
        refused = server.log_lines("not taken here now")
        assert refused, "member 1's queue never refused: the test did not test refusals"
        assert sub.receive(1.0) is None  # nothing comes twice, later
        for i in range(2):
            status = cluster.status(i)
            assert status is not None
            held = {d: s.get("messages", 0) for d, s in status["destinations"].items()
                    if d.startswith(QUEUE) or "pairmq.sf:" in d}
            assert not any(held.values()), f"member {i} still holds {held}"
        producer.close()
        consumer.close()
    finally:
        cluster.stop()
