"""What the exactly-once tests of clusters share: producers that send numbered messages in
threads while servers die, and the check an application relies on (every receipted message
consumed, none twice, nothing no producer sent).

    load = NumberedLoad(producers, "from live")   # FailoverProducers, one thread each
    load.start(); ...kill something...; load.finish()
    assert_consumed_once(consumer, load.receipted(), load.sent_ids())
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from tests.ha.clients import FailoverConsumer, FailoverProducer


class NumberedLoad:
    """Producer i sends `m{i}-{k}` for k = 0, 1, ... (at most `limit`), a 10 ms pause every
    20 messages, until `finish`; then waits until all it sent is confirmed."""

    def __init__(self, producers: Sequence[FailoverProducer], what: str,
                 limit: int = 4000) -> None:
        self.producers = producers
        self.what = what
        self.limit = limit
        self.sent: list[set[str]] = [set() for _ in producers]
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, args=(i,))
                         for i in range(len(producers))]

    def _produce(self, i: int) -> None:
        k = 0
        try:
            while not self._stop.is_set() and k < self.limit:
                dup_id = f"m{i}-{k}"
                self.producers[i].send(dup_id, f"{self.what} {i}: {k}".encode())
                self.sent[i].add(dup_id)
                k += 1
                if k % 20 == 0:
                    time.sleep(0.01)
            self.producers[i].flush()
        except BaseException as e:
            self.errors.append(e)

    def start(self) -> NumberedLoad:
        for t in self._threads:
            t.start()
        return self

    def finish(self, timeout: float = 120.0) -> None:
        """Stop sending, wait for every confirmation; the application saw no error."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        assert not self.errors, self.errors

    def receipted(self) -> set[str]:
        return {d for p in self.producers for d in p.receipted}

    def sent_ids(self) -> set[str]:
        return set().union(*self.sent)


def assert_consumed_once(consumer: FailoverConsumer, receipted: set[str], sent: set[str],
                         timeout: float = 90.0) -> None:
    """Every receipted message consumed, none twice, none that no producer sent."""
    missing = consumer.wait_consumed(receipted, timeout)
    consumer.wait_idle(2.0)
    assert not missing, f"{len(missing)} receipted messages never consumed, e.g. " \
                        f"{sorted(missing)[:5]}"
    twice = {d: n for d, n in consumer.consumed.items() if n > 1}
    assert not twice, f"consumed twice: {sorted(twice)[:10]}"
    unknown = set(consumer.consumed) - sent
    assert not unknown, sorted(unknown)[:10]
