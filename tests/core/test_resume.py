"""A parked session (its connection broke, its client may come back) without any I/O."""

from __future__ import annotations

from pairmq.core import Broker, CoreSettings

NOW = 1_000_000


def bodies_and_counts(broker: Broker, conn: int) -> list[tuple[bytes, int]]:
    return [(d.entry.message.body, d.delivery_count)
            for d in broker.take_outbox().get(conn, [])]


def test_a_parked_session_keeps_its_deliveries_gets_nothing_new_and_resumes():
    broker = Broker(CoreSettings(default_prefetch=100))
    broker.open_session(1, "1.2")
    broker.open_session(2, "1.2")
    broker.subscribe(1, "s", "/queue/q", NOW, ack="client-individual")
    for i in range(3):
        broker.send(2, "/queue/q", {}, b"%d" % i, NOW)
    assert bodies_and_counts(broker, 1) == [(b"0", 1), (b"1", 1), (b"2", 1)]
    broker.send(2, "/queue/q", {}, b"3", NOW)  # dispatched, never written: the socket broke
    broker.park_session(1)
    assert broker.take_outbox() == {}
    broker.send(2, "/queue/q", {}, b"4", NOW)
    assert broker.take_outbox() == {}  # nothing for a parked session: 4 waits in the queue
    # the client received ack ids up to 2 (messages 0 and 1): 2 and 3 go back, once more
    assert broker.resume_session(1, 2, NOW) == 2
    assert bodies_and_counts(broker, 1) == [(b"2", 2), (b"3", 2), (b"4", 1)]
    broker.ack(1, "1", NOW)  # an ack id given before the break still works
    broker.ack(1, "2", NOW)
    assert broker.stats["acknowledged"] == 2


def test_closing_a_parked_session_returns_everything():
    broker = Broker(CoreSettings(default_prefetch=100))
    broker.open_session(1, "1.2", client_id="app")
    broker.subscribe(1, "s", "/queue/q", NOW, ack="client-individual")
    broker.send(1, "/queue/q", {}, b"m", NOW)
    broker.take_outbox()
    broker.park_session(1)
    broker.close_session(1, NOW)
    broker.open_session(2, "1.2", client_id="app")  # the client-id is free again
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual")
    assert bodies_and_counts(broker, 2) == [(b"m", 2)]
