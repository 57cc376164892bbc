"""An operator's purge and move in the core (core/broker/operations.py): what is waiting goes,
what a consumer holds stays, every change is a journal record, and a dead-letter queue's
messages go back where they came from."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core import records as rec

NOW = 1_000_000
P = {"persistent": "true"}


def make(**settings) -> Broker:
    broker = Broker(CoreSettings(**settings))
    for conn in (1, 2):
        broker.open_session(conn, "1.2")
    return broker


def waiting(broker: Broker, destination: str) -> list[str]:
    return [m.headers["n"] for m in broker.browse(destination, 100).messages]


def test_a_purge_takes_what_waits_and_leaves_what_a_consumer_holds() -> None:
    broker = make()
    for i in range(5):
        broker.send(1, "/queue/q", {"n": str(i), **P}, b"x", NOW)
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=2)
    broker.records.clear()
    done = broker.purge("/queue/q")
    assert (done.count, done.paged_left) == (3, 0)
    assert waiting(broker, "/queue/q") == []
    assert [r[0] for r in broker.records] == [rec.DEL] * 3, "each purged message journaled"
    assert broker.addresses["/queue/q"].dequeued == 3
    # the two delivered stay the consumer's, to acknowledge or give back
    assert len(broker.take_outbox()[2]) == 2


def test_a_dead_letter_queue_is_retried_to_where_each_message_came_from() -> None:
    broker = make(max_delivery_attempts=1)
    broker.send(1, "/queue/a", {"n": "a", **P}, b"x", NOW)
    broker.send(1, "/queue/b", {"n": "b", **P}, b"x", NOW)
    for queue in ("/queue/a", "/queue/b"):
        broker.subscribe(2, queue, queue, NOW, ack="client-individual")
        [delivery] = broker.take_outbox()[2]
        broker.nack(2, delivery.ack_id, NOW)
        broker.unsubscribe(2, queue, NOW)
    assert waiting(broker, "/queue/DLQ.a") == ["a"]
    broker.records.clear()
    for dlq in ("/queue/DLQ.a", "/queue/DLQ.b"):
        assert broker.move(dlq, None, 10, NOW).count == 1
    assert waiting(broker, "/queue/a") == ["a"] and waiting(broker, "/queue/b") == ["b"]
    [back] = broker.browse("/queue/a", 1).messages
    assert "original-destination" not in back.headers
    assert "dead-letter-reason" not in back.headers
    kinds = [r[0] for r in broker.records]
    assert kinds.count(rec.DEL) == 2 and kinds.count(rec.ADD) == 2


def test_a_move_to_a_named_queue_takes_from_the_head_up_to_the_limit() -> None:
    broker = make()
    for i in range(5):
        broker.send(1, "/queue/src", {"n": str(i)}, b"x", NOW)
    assert broker.move("/queue/src", "/queue/dst", 3, NOW).count == 3
    assert waiting(broker, "/queue/dst") == ["0", "1", "2"]
    assert waiting(broker, "/queue/src") == ["3", "4"]


def test_a_message_with_nowhere_to_go_stays_and_says_why() -> None:
    broker = make()
    broker.send(1, "/queue/plain", {"n": "0"}, b"x", NOW)
    with pytest.raises(CoreError, match="no original-destination"):
        broker.move("/queue/plain", None, 10, NOW)
    assert waiting(broker, "/queue/plain") == ["0"]


@pytest.mark.parametrize("destination", ["/queue/unknown", "/topic/t"])
def test_only_a_queue_the_server_holds_is_purged(destination: str) -> None:
    with pytest.raises(CoreError, match="no queue"):
        make().purge(destination)


def test_a_move_onto_itself_or_a_topic_is_refused() -> None:
    broker = make()
    broker.send(1, "/queue/q", {"n": "0"}, b"x", NOW)
    for target in ("/queue/q", "/topic/t"):
        with pytest.raises(CoreError, match="cannot move"):
            broker.move("/queue/q", target, 1, NOW)


def test_a_retry_stops_at_a_message_with_nowhere_to_go_and_says_why() -> None:
    broker = make(max_delivery_attempts=1)
    broker.send(1, "/queue/a", {"n": "a", **P}, b"x", NOW)
    broker.subscribe(2, "w", "/queue/a", NOW, ack="client-individual")
    [delivery] = broker.take_outbox()[2]
    broker.nack(2, delivery.ack_id, NOW)
    broker.unsubscribe(2, "w", NOW)
    broker.send(1, "/queue/DLQ.a", {"n": "stray"}, b"x", NOW)  # sent there by hand
    done = broker.move("/queue/DLQ.a", None, 10, NOW)
    assert done.count == 1 and done.stopped and "no original-destination" in done.stopped
    assert waiting(broker, "/queue/DLQ.a") == ["stray"] and waiting(broker, "/queue/a") == ["a"]
