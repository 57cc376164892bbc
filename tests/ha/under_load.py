"""A failover under load: a producer and a checking consumer on one queue of a pair, and
what every such test ends with (stop the load, drain, check exactly once)."""

from __future__ import annotations

from types import TracebackType

from tests.ha.clients import FailoverConsumer, Load, check_exactly_once
from tests.ha.pair import Pair

QUEUE = "/queue/ha-load"


def queue_depth(pair: Pair, name: str) -> int | None:
    """The messages `name` holds on the load's queue (and on any destination named after
    it), or None while it does not answer."""
    st = pair.status(name)
    if st is None:
        return None
    return sum(d["messages"] for key, d in st["destinations"].items() if "ha-load" in key)


class UnderLoad:
    """A Load sending to QUEUE and a FailoverConsumer consuming it, through whatever the
    test does to the pair:

        with UnderLoad(pair) as run:
            run.load.wait_receipts(300, 20)
            pair.kill("primary")
            ...
            run.drain()

    `drain()`, once the test is done with the pair, stops the load and waits until every
    receipted message is consumed and the consumer is idle. Leaving the block stops both,
    whatever happened; after a block that ended well, it checks that every receipted message
    was consumed exactly once (so a test cannot forget to)."""

    def __init__(self, pair: Pair, destination: str = QUEUE) -> None:
        self.pair = pair
        self.addresses = pair.client_addresses()
        self.destination = destination
        self.receipted: list[str] | None = None

    def __enter__(self) -> UnderLoad:
        self.consumer = FailoverConsumer(self.addresses, self.destination).start()
        self.load = Load(self.addresses, self.destination).start()
        return self

    def drain(self, timeout: float = 30.0) -> list[str]:
        """Stop the load (every send receipted), then wait until the consumer has consumed
        all that was receipted and nothing more comes; returns the receipted dup-ids."""
        receipted = self.load.stop()
        missing = self.consumer.wait_consumed(set(receipted), timeout)
        assert not missing, self._missing_report(missing, receipted)
        self.consumer.wait_idle(0.5)
        self.receipted = receipted
        return receipted

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.load.stop_event.set()
        self.consumer.stop()
        if kind is None:
            assert self.receipted is not None, "the block ended without drain()"
            check_exactly_once(self.receipted, self.consumer)

    def _missing_report(self, missing: set[str], receipted: list[str]) -> str:
        order = {d: i for i, d in enumerate(receipted)}
        ids = sorted(missing, key=lambda d: order[d])
        producer, consumer = self.load.producer, self.consumer
        return (f"{len(missing)} of {len(receipted)} receipted messages never consumed: "
                f"{ids[:5]} ... {ids[-5:]} (receipt #{order[ids[0]]}..#{order[ids[-1]]}); "
                f"producer connected to {producer.connected_to}, failures "
                f"{producer.failures}, resent {producer.resent}; consumer connected to "
                f"{consumer.connected_to}, failures {consumer.failures}, delivered "
                f"{sum(consumer.delivered.values())}\n{self.pair.describe()}")
