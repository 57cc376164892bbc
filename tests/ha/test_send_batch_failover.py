"""Batched SENDs (`pairmq-batch`, docs/stomp.md) through a real failover (kill -9 of the
active): the client resends every unconfirmed batch frame to the new active, whose copy
of the journal already holds some of their messages, and each message ends up there once,
in order: a batch's messages are checked one by one against their dup-ids."""

from __future__ import annotations

import threading
import time

import pairmq.client
from pairmq.client import EventKind, FailoverEvent, Outcome, SendResult
from tests.ha.pair import NAMES, Pair
from tests.integration import rawstomp
from tests.support.streams import bodies, offsets, read, stream_info, subscribe

PER_FRAME = 200


def test_pipelined_batches_resent_after_a_failover_leave_each_message_once(
        pair: Pair) -> None:
    servers = ",".join(f"stomp://{pair.stomp_address(n)}" for n in NAMES)
    url = f"failover:({servers})?retryInterval=50&maxRetryInterval=200"
    events: list[FailoverEvent] = []
    sent: list[list[str]] = []  # the bodies of each frame, in the order sent
    results: list[SendResult] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            with pairmq.client.connect(url, failover_listener=events.append,
                                       send_window=8) as producer:
                frame = 0
                while not stop.is_set():
                    batch = [f"f{frame}-m{i}" for i in range(PER_FRAME)]
                    results.append(producer.send_batch_async("/stream/batched", batch))
                    sent.append(batch)
                    frame += 1
                producer.flush(30)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while sum(r.outcome is Outcome.CONFIRMED for r in results) < 10 \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        pair.kill("primary")  # frames are in flight: the producer never waits for one
        pair.wait_active(15, "backup")
        confirmed_then = sum(r.outcome is Outcome.CONFIRMED for r in results)
        while sum(r.outcome is Outcome.CONFIRMED for r in results) < confirmed_then + 10 \
                and time.monotonic() < deadline + 20:
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert [r.outcome for r in results] == [Outcome.CONFIRMED] * len(results)
    failovers = [e for e in events if e.kind is EventKind.FAILOVER]
    assert len(failovers) == 1 and failovers[0].resent >= 1, failovers
    expected = [body for batch in sent for body in batch]

    host, port = pair.stomp_address("backup").rsplit(":", 1)
    client, _ = rawstomp.connect((host, int(port)))
    try:
        first, nxt = stream_info(client, "/stream/batched")
        assert (first, nxt) == (0, len(expected))  # nothing doubled, nothing lost
        subscribe(client, "/stream/batched", "first", **{"prefetch-count": "5000"})
        frames = read(client, nxt, timeout=30)
        assert offsets(frames) == list(range(nxt))
        assert bodies(frames) == expected
    finally:
        client.close()
