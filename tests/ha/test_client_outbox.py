"""A durable connection (outbox) through the worst: both servers down for 10 s while the
application keeps sending, the application process itself killed and restarted, then the
servers back. Everything arrives exactly once, in order."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pairmq.client
from tests.ha.pair import NAMES, Pair
from tests.support.waiting import wait_until

QUEUE = "/queue/durable-connection"


class Producer:
    """tests/support/outbox_producer.py in its own process; `stored` is the last message
    whose send() returned."""

    def __init__(self, url: str, outbox: Path, first: int, last: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.outbox_producer", url, str(outbox), QUEUE,
             "p", str(first), str(last), "0.005"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.stored = first - 1
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("stored "):
                self.stored = int(line.split()[1])

    def wait_stored(self, n: int, timeout: float) -> None:
        wait_until(lambda: self.stored >= n or self.proc.poll() is not None,
                   f"message {n} stored", timeout)
        assert self.stored >= n, self.lines[-20:]


def test_both_servers_down_and_the_application_killed_everything_arrives_once_in_order(
        pair: Pair, tmp_path: Path) -> None:
    url = "failover:(" + ",".join(f"stomp://{pair.stomp_address(n)}" for n in NAMES) + ")"
    outbox = tmp_path / "outbox.db"
    first = Producer(url, outbox, 0, 100_000)
    first.wait_stored(200, 20)  # sending through the pair
    for name in NAMES:
        pair.kill(name)
    down = time.monotonic()
    first.wait_stored(first.stored + 200, 10)  # no server: the outbox takes them
    time.sleep(2)
    first.proc.send_signal(signal.SIGKILL)  # the application dies too
    first.proc.wait(10)
    first.reader.join(5)
    killed_at = first.stored
    waiting = sqlite3.connect(outbox).execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
    assert waiting >= 200, "the messages stored while no server ran are not in the outbox"
    second = Producer(url, outbox, killed_at + 1, killed_at + 1500)
    second.wait_stored(killed_at + 200, 10)  # still no server
    time.sleep(max(0.0, 10 - (time.monotonic() - down)))
    assert time.monotonic() - down >= 10
    pair.start(parallel=True)
    pair.wait_active(30)
    assert second.proc.wait(120) == 0, second.lines[-20:]
    second.reader.join(5)
    assert second.lines[-1] == "done", second.lines[-5:]
    last = killed_at + 1500

    received = []
    with pairmq.client.connect(url) as consumer:
        sub = consumer.subscribe(QUEUE, headers={"prefetch-count": "500"})
        while (message := sub.receive(2)) is not None:
            received.append(int(message.text.split("-")[1]))
            consumer.ack(message)
    expected = list(range(last + 1))
    duplicates = len(received) - len(set(received))
    assert duplicates == 0, f"{duplicates} messages arrived twice"
    missing = sorted(set(expected) - set(received))
    assert not missing, f"{len(missing)} messages lost: {missing[:10]}"
    assert received == expected, "out of order"
