"""A well-behaved client beside a hostile one (issue 20): it sends a persistent message
with a receipt every `interval` seconds and receives it back, from a thread, and records
each round's latency. A test starts it, runs the attack, stops it, and asserts on its
worst round and on nothing being lost.

    with Canary(srv) as canary:
        attack()
    assert canary.worst < 0.2 and canary.lost == []
"""

from __future__ import annotations

import threading
import time
import uuid

import pairmq.client

WORST_S = 0.2  # a canary round may take this long, at most, during an attack


class Canary:
    def __init__(self, srv, interval: float = 0.05) -> None:
        self.url = f"stomp://{srv.host}:{srv.port}"
        self.interval = interval
        self.queue = f"/queue/canary-{uuid.uuid4().hex[:8]}"
        self.rounds: list[float] = []
        self.lost: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="canary")

    def __enter__(self) -> Canary:
        self._ready = threading.Event()
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the canary did not start: {self.error}")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise RuntimeError(f"the canary failed: {self.error!r}") from self.error

    @property
    def worst(self) -> float:
        return max(self.rounds, default=0.0)

    def _run(self) -> None:
        try:
            with pairmq.client.connect(self.url, reconnect_attempts=0) as client:
                sub = client.subscribe(self.queue, ack="client-individual")
                self._ready.set()
                n = 0
                while not self._stop.is_set():
                    started = time.monotonic()
                    client.send(self.queue, str(n).encode(), persistent=True)
                    message = sub.receive(10)
                    if message is None or message.body != str(n).encode():
                        self.lost.append(n)
                    else:
                        client.ack(message)
                    self.rounds.append(time.monotonic() - started)
                    n += 1
                    self._stop.wait(self.interval)
        except BaseException as e:
            self.error = e
            self._ready.set()
