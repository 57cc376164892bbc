"""A pair that holds a large backlog (issue 18), scaled down for `make test`: limits of 2 MiB
so that hundreds of thousands of 1 KiB messages already page. The pair, formed with the
default intervals (heartbeat 500 ms, activation 2000 ms), keeps its roles while the
backlog builds; both servers stay under a memory budget whatever waits (before paging as
a mode, each one's memory grew by about 1.1 KB per waiting message: 300,000 took each
past 600 MB); kill -9 of the active, then every message drained from the backup, once,
in order. `benchmarks/backlog.py` does the same at 10 million."""

from __future__ import annotations

import re
import time

import psutil
import pytest

import pairmq.client
from tests.ha.pair import Pair
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

MESSAGES = 300_000
BUDGET_MB = 250  # RSS of each server, whatever waits
LIMITS = ["--max-size-bytes", str(2 * 1024 * 1024), "--paging-bytes", str(2 * 1024 * 1024)]
QUEUE = "/queue/backlog"
BODY = b"x" * 1000


def rss_mb(pair: Pair, name: str) -> float:
    server = pair.servers[name]
    assert server is not None
    return psutil.Process(server.proc.pid).memory_info().rss / 2**20


def drain_in_order(pair: Pair, name: str, count: int) -> None:
    """Every message of QUEUE from server `name`, numbered 0..count-1: each once, in order,
    and nothing after them."""
    got: list[int] = []
    with pairmq.client.connect(f"stomp://{pair.stomp_address(name)}") as consumer:
        sub = consumer.subscribe(QUEUE, ack="client", headers={"prefetch-count": "2000"})
        while len(got) < count:
            message = sub.receive(10)
            assert message is not None, f"only {len(got)} of {count} came"
            got.append(int(message.headers["n"]))
            if len(got) % 1000 == 0:
                consumer.ack(message)  # cumulative: every one before it too
        assert sub.receive(1.0) is None, "nothing more"
    assert got == list(range(count)), "each once, in order"


@pytest.mark.long  # a campaign (35 s, 60 s on a shared machine): `make test-long`
@pytest.mark.timeout(600)
def test_a_backlog_keeps_the_pair_its_roles_and_each_server_under_budget_then_fails_over(
        pair_factory) -> None:
    pair: Pair = pair_factory(heartbeat_ms=500, activation_ms=2000, flags=LIMITS)
    pair.start(parallel=True)
    pair.wait_formed()
    switched = {n: pair.logs(n).count("Local server switched to") for n in ("primary",
                                                                            "backup")}
    url = f"stomp://{pair.stomp_address('primary')}"
    largest = {"primary": 0.0, "backup": 0.0}
    with pairmq.client.connect(url, send_window=16) as client:
        for first in range(0, MESSAGES, 1000):
            client.send_batch_async(QUEUE, [(BODY, {"n": str(first + i)})
                                            for i in range(1000)])
            if first % 50_000 == 0:
                client.flush()
                for name in largest:
                    largest[name] = max(largest[name], rss_mb(pair, name))
        client.flush()
    for name in largest:
        largest[name] = max(largest[name], rss_mb(pair, name))
    assert max(largest.values()) < BUDGET_MB, f"RSS (MB) with {MESSAGES} waiting: {largest}"
    assert (pair.state("primary"), pair.state("backup")) == ("ACTIVE", "PASSIVE")
    assert {n: pair.logs(n).count("Local server switched to") for n in switched} == switched, \
        "no role changed while the backlog built"
    status = pair.status("backup")
    assert status is not None
    paged = status["destinations"][QUEUE]["paged_messages"]
    assert paged > MESSAGES * 0.9, f"the backup keeps them in its paged log: {paged}"

    pair.kill("primary")
    pair.wait_active(15, "backup")
    started = time.monotonic()
    drain_in_order(pair, "backup", MESSAGES)
    wait_until(lambda: (pair.status("backup") or {}).get("destinations", {}).get(QUEUE, {})
               .get("messages") == 0, "the queue empty", 10)
    print(f"drained {MESSAGES} in {time.monotonic() - started:.1f} s; RSS MB {largest}")


READ_BACK = re.compile(r"The event loop was held for (\d+) ms \(busy in [^)]*"
                       r"(?:reading|replay|restore|recover)")


@pytest.mark.long  # 200,000 messages held by a pair (30 s): `make test-long`
@pytest.mark.timeout(300)
def test_an_active_that_steps_down_reads_its_backlog_back_off_the_event_loop(
        pair_factory) -> None:
    """A fail-back: the backup, active with a backlog of 200,000 messages held in memory,
    hands over to the returning primary and steps down. It reads its journal back into a
    new broker (the serving one had sessions) in a thread: its event loop, which carries
    the pair's heartbeats, is never held by that reading (before, it was, for about a
    second here and 5-9 s per million messages); then it follows the primary again and
    nothing is lost."""
    pair: Pair = pair_factory(heartbeat_ms=500, activation_ms=2000)
    pair.start(parallel=True)
    pair.wait_formed()
    pair.kill("primary")
    pair.wait_active(15, "backup")
    count = 200_000
    with pairmq.client.connect(f"stomp://{pair.stomp_address('backup')}",
                               send_window=16) as client:
        for first in range(0, count, 1000):
            client.send_batch_async(QUEUE, [(b"y" * 100, {"n": str(first + i)})
                                            for i in range(1000)])
        client.flush()
    pair.restart("primary")
    pair.wait_formed(60, active="primary")
    logs = pair.logs("backup")
    assert "Handing over to primary" in logs
    assert "Journal read back in" in logs, "the backup stepped down and read its journal"
    held = READ_BACK.findall(logs)
    assert not held, f"the event loop held by reading the journal back for {held} ms"
    drain_in_order(pair, "primary", count)
