"""The replication stream is flow-controlled (issue 18): while the backup takes records more
slowly than a producer sends them (frozen here with SIGSTOP, within the activation
interval), the active stops reading from clients once the stream is REPLICATION_HIGH
behind, instead of holding it all in memory; the producer waits, nothing is lost, and it
goes on when the backup catches up."""

from __future__ import annotations

import socket
import threading
import time

import psutil

from tests.ha.pair import Pair
from tests.integration.rawstomp import connect as raw_connect
from tests.support.waiting import wait_until

BODY = 256 * 1024
FRAMES = 400  # 100 MiB, three times what the stream may be behind


def send_blindly(address: tuple[str, int], written: list[int], done: threading.Event) -> None:
    """Persistent SENDs without receipts, as fast as the socket takes them."""
    client, _ = raw_connect(address)
    frame = (b"SEND\ndestination:/queue/flow\npersistent:true\ncontent-length:%d\n\n"
             % BODY) + b"x" * BODY + b"\x00"
    sock: socket.socket = client.sock
    sock.settimeout(None)  # it may wait as long as the server makes it
    try:
        for _ in range(FRAMES):
            sock.sendall(frame)
            written[0] += len(frame)
    finally:
        done.set()


def test_a_slow_backup_makes_the_active_stop_reading_clients_not_grow(pair_factory) -> None:
    pair: Pair = pair_factory(heartbeat_ms=250, activation_ms=6000)
    pair.start(parallel=True)
    pair.wait_formed()
    host, _, port = pair.stomp_address("primary").rpartition(":")
    active = psutil.Process(pair.servers["primary"].proc.pid)  # type: ignore[union-attr]
    before = active.memory_info().rss
    written = [0]
    done = threading.Event()
    with pair.frozen("backup"):
        producer = threading.Thread(target=send_blindly, args=((host, int(port)), written,
                                                               done), daemon=True)
        producer.start()
        time.sleep(3.0)
        held = written[0]
        grown = (active.memory_info().rss - before) / 2**20
        assert not done.is_set(), "the producer was never made to wait"
        assert held < 64 * 2**20, f"the producer wrote {held / 2**20:.0f} MiB"
        # what the queue holds in memory (its 64 MiB limit) and the stream's 32 MiB, not the
        # 100 MiB sent
        assert grown < 180, f"the active grew {grown:.0f} MiB while the backup was frozen"
    done.wait(60)
    assert written[0] >= FRAMES * BODY, "it went on once the backup caught up"
    wait_until(lambda: (pair.status("primary") or {}).get("destinations", {})
               .get("/queue/flow", {}).get("messages") == FRAMES, "every message taken", 30)
    assert (pair.state("primary"), pair.state("backup")) == ("ACTIVE", "PASSIVE")
