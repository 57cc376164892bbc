"""A stream through a failover (docs/streams.md): what the active confirmed, the backup
serves with the same offsets, every confirmed message exactly once, and appends go on
from the next offset; a consumer group's commit survives too."""

from __future__ import annotations

import threading
import time

import pairmq.client
from pairmq.client import Outcome
from tests.ha.pair import NAMES, Pair
from tests.integration import rawstomp
from tests.support.streams import append, bodies, offsets, read, stream_info, subscribe


def test_the_backup_serves_the_stream_with_the_same_offsets(pair: Pair) -> None:
    servers = ",".join(f"stomp://{pair.stomp_address(n)}" for n in NAMES)
    url = f"failover:({servers})?retryInterval=50&maxRetryInterval=200"
    confirmed: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            with pairmq.client.connect(url) as producer:
                n = 0
                while not stop.is_set():
                    body = f"e-{n}"
                    result = producer.send("/stream/events", body)
                    assert result.outcome is Outcome.CONFIRMED
                    confirmed.append(body)
                    n += 1
                    if n == 50:
                        producer.send("/stream/events", b"", headers={
                            "x-stream-group": "spark", "x-stream-commit-offset": "20"})
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(confirmed) < 150 and time.monotonic() < deadline:
            time.sleep(0.02)
        host, port = pair.stomp_address("primary").rsplit(":", 1)
        before, _ = rawstomp.connect((host, int(port)))
        subscribe(before, "/stream/events", "first")
        seen_before = read(before, 100)
        pair.kill("primary")
        pair.wait_active(15, "backup")
        while len(confirmed) < 250 and time.monotonic() < deadline + 20:
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    host, port = pair.stomp_address("backup").rsplit(":", 1)
    client, _ = rawstomp.connect((host, int(port)))
    try:
        first, nxt = stream_info(client, "/stream/events")
        assert first == 0
        assert nxt == len(confirmed)  # nothing doubled by the resends, nothing lost
        subscribe(client, "/stream/events", "first")
        frames = read(client, nxt)
        assert offsets(frames) == list(range(nxt))
        assert bodies(frames) == confirmed
        # what a reader saw before the failover has the same offsets on the backup
        assert [(f.headers["x-stream-offset"], f.text) for f in seen_before] == \
            [(f.headers["x-stream-offset"], f.text) for f in frames[:100]]
        append(client, "/stream/events", ["after"])
        assert stream_info(client, "/stream/events") == (0, nxt + 1)
        group, _ = rawstomp.connect((host, int(port)))
        subscribe(group, "/stream/events", "group", **{"x-stream-group": "spark"})
        assert offsets(read(group, 1)) == [20]
        group.close()
    finally:
        client.close()
        before.close()
