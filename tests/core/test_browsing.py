"""A queue browser in the core (core/browsing.py): the first messages waiting, in the order
consumers would get them, in memory then paged, with nothing taken or changed."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core.settings import AddressFullPolicy
from tests.support.pages import Pages

NOW = 1_000_000


def make(**settings) -> Broker:
    broker = Broker(CoreSettings(**settings))
    for conn in (1, 2):
        broker.open_session(conn, "1.2")
    return broker


def numbers(messages) -> list[str]:
    return [m.headers["n"] for m in messages]


def test_a_browse_shows_the_head_in_delivery_order_and_takes_nothing() -> None:
    broker = make()
    for i in range(6):
        broker.send(1, "/queue/q", {"n": str(i), "priority": "9" if i == 4 else "4"},
                    b"x", NOW)
    seen = broker.browse("/queue/q", 3)
    assert numbers(seen.messages) == ["4", "0", "1"]  # priority first, then FIFO
    assert seen.log is None
    broker.records.clear()
    broker.browse("/queue/q", 10)
    assert broker.records == [], "a browse journals nothing"
    broker.subscribe(2, "s", "/queue/q", NOW)
    deliveries = broker.take_outbox()[2]
    assert [d.entry.message.headers["n"] for d in deliveries] == ["4", "0", "1", "2", "3", "5"]
    assert {d.delivery_count for d in deliveries} == {1}, "browsing counted no delivery"


def test_messages_delivered_and_not_acknowledged_are_not_shown() -> None:
    broker = make()
    for i in range(3):
        broker.send(1, "/queue/q", {"n": str(i)}, b"x", NOW)
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=2)
    assert numbers(broker.browse("/queue/q", 10).messages) == ["2"]


def test_an_unknown_queue_is_empty_and_not_created() -> None:
    broker = make()
    assert broker.browse("/queue/nobody", 10).messages == []
    assert "/queue/nobody" not in broker.queues


@pytest.mark.parametrize("destination", ["/topic/t", "/stream/s", "/temp-queue/t"])
def test_only_queues_are_browsed(destination: str) -> None:
    with pytest.raises(CoreError, match="only a /queue/ destination can be browsed"):
        make().browse(destination, 10)


def test_a_paging_queue_shows_its_journal_only_messages_after_those_in_memory() -> None:
    broker, pages = make(max_size_bytes=5000,
                         address_full_policy=AddressFullPolicy.PAGE), Pages()
    for i in range(50):
        broker.send(1, "/queue/q", {"persistent": "true", "n": str(i)}, b"x" * 1000, NOW)
    pages.sync(broker)
    seen = broker.browse("/queue/q", 20)
    assert numbers(seen.messages) == ["0", "1", "2", "3", "4"]  # in memory
    assert seen.log is not None and len(seen.numbers) == 15
    read_back = [pages.record(seen.log, n) for n in seen.numbers]
    assert numbers(read_back) == [str(i) for i in range(5, 20)]
    assert broker.paged_waiting(broker.queues["/queue/q"]) == 45, "nothing was paged in"
