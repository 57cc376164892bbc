"""What one transaction may hold until its COMMIT (core/broker/intake.py `_stage`, issue 20): at
most max_transaction_messages and max_transaction_bytes, refused with an error naming
the limit; its messages count in the server's memory until COMMIT or ABORT."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings

NOW = 1_000_000


def make(**settings) -> Broker:
    broker = Broker(CoreSettings(**settings))
    broker.open_session(1, "1.2")
    broker.begin(1, "tx")
    return broker


def test_a_transaction_holds_at_most_its_messages() -> None:
    broker = make(max_transaction_messages=3)
    for i in range(3):
        broker.send(1, "/queue/q", {"n": str(i)}, b"x", NOW, "tx")
    with pytest.raises(CoreError, match=r"transaction 'tx' would hold more than "
                                        r"max_transaction_messages \(3\) messages"):
        broker.send(1, "/queue/q", {}, b"x", NOW, "tx")
    with pytest.raises(CoreError, match="max_transaction_messages"):
        broker.send_batch(1, "/queue/q", {}, [({}, b"a")], NOW, "tx")
    broker.commit(1, "tx", NOW)
    assert broker.queues["/queue/q"].count == 3


def test_a_transaction_holds_at_most_its_bytes_and_they_count_in_memory() -> None:
    broker = make(max_transaction_bytes=10_000)
    before = broker.capacity.memory
    broker.send(1, "/queue/q", {}, b"x" * 8000, NOW, "tx")
    staged = broker.capacity.memory - before
    assert 8000 < staged < 8200, "the staged message counts in the server's memory"
    with pytest.raises(CoreError, match=r"more than max_transaction_bytes \(10000\) bytes"):
        broker.send(1, "/queue/q", {}, b"x" * 8000, NOW, "tx")
    broker.abort(1, "tx", NOW)
    assert broker.capacity.memory == before, "an ABORT gives it back"


def test_a_commit_hands_the_bytes_to_the_messages_and_a_close_gives_them_back() -> None:
    broker = make()
    before = broker.capacity.memory
    broker.send(1, "/queue/q", {}, b"x" * 5000, NOW, "tx")
    broker.commit(1, "tx", NOW)
    queued = broker.capacity.memory - before
    assert queued > 5000, "counted once, as a queued message now"
    broker.begin(1, "tx2")
    broker.send(1, "/queue/q", {}, b"y" * 5000, NOW, "tx2")
    broker.close_session(1, NOW)
    assert broker.capacity.memory - before == queued


def test_staged_messages_trip_the_memory_guard() -> None:
    broker = make(global_max_size_bytes=50_000)
    for _ in range(6):
        broker.send(1, "/queue/q", {}, b"x" * 9000, NOW, "tx")
    assert "memory" in {s.value for s in broker.capacity.shortages}
    events = [e.kind for e in broker.take_events()]
    assert "server-full" in events


def test_acknowledgements_count_in_max_transaction_messages_with_the_sends() -> None:
    """An ACK in a transaction gives its subscription credit back at once, so without a
    bound a transacted consumer could settle any number before its COMMIT applies them
    all in one turn."""
    broker = make(max_transaction_messages=5)
    for i in range(8):
        broker.send(1, "/queue/in", {}, b"%d" % i, NOW)
    broker.subscribe(1, "s", "/queue/in", NOW, ack="client-individual", prefetch=2)
    broker.send(1, "/queue/out", {}, b"sent", NOW, "tx")
    settled = 0
    with pytest.raises(CoreError, match=r"transaction 'tx' holds max_transaction_messages "
                                        r"\(5\) messages, sent or acknowledged"):
        while True:
            for delivery in broker.take_outbox().get(1, []):
                if settled % 2:
                    broker.ack(1, delivery.ack_id, NOW, "tx")
                else:
                    broker.nack(1, delivery.ack_id, NOW, "tx", requeue=False)
                settled += 1
    assert settled == 4, "one send and four settled: five"
    with pytest.raises(CoreError, match="max_transaction_messages"):
        broker.send(1, "/queue/out", {}, b"one more", NOW, "tx")
    broker.commit(1, "tx", NOW)
    assert broker.queues["/queue/out"].count == 1
