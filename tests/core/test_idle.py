"""Empty, unused destinations go away (core/broker/idle.py, issue 20): after auto_delete_delay_ms
idle, with an UNDEST record for a queue; never one that holds messages, has a consumer or
a durable subscription, remembers a dup-id or a producer, nor a stream."""

from __future__ import annotations

from pairmq.core import Broker, CoreSettings
from pairmq.core import records as rec
from pairmq.core.broker.idle import IDLE_CHECKS

NOW = 1_000_000
DELAY = 1000


def make(**settings) -> Broker:
    settings.setdefault("auto_delete_delay_ms", DELAY)
    broker = Broker(CoreSettings(**settings))
    broker.open_session(1, "1.2")
    broker.open_session(2, "1.2", "app")
    return broker


def looks(broker: Broker, *times: int) -> list[str]:
    deleted: list[str] = []
    for now in times:
        deleted += broker.delete_idle(now)
    return deleted


def test_a_queue_left_empty_and_unused_is_deleted_after_the_delay() -> None:
    broker = make()
    broker.subscribe(1, "s", "/queue/junk", NOW)
    broker.unsubscribe(1, "s", NOW)
    broker.records.clear()
    assert looks(broker, NOW, NOW + DELAY - 1) == []
    assert looks(broker, NOW + DELAY) == ["/queue/junk"]
    assert "/queue/junk" not in broker.addresses and "/queue/junk" not in broker.queues
    assert broker.records == [(rec.UNDEST, "/queue/junk")]
    assert [e.kind for e in broker.take_events()] == ["destinations-deleted"]
    broker.send(1, "/queue/junk", {}, b"back", NOW + DELAY + 1)  # made again on use
    assert broker.queues["/queue/junk"].count == 1


def test_use_between_two_looks_starts_the_delay_again() -> None:
    broker = make()
    broker.subscribe(1, "s", "/queue/q", NOW)
    broker.unsubscribe(1, "s", NOW)
    looks(broker, NOW)
    broker.subscribe(1, "s", "/queue/q", NOW + 10)
    looks(broker, NOW + 20)  # busy: forgotten as idle
    broker.unsubscribe(1, "s", NOW + 30)
    assert looks(broker, NOW + DELAY + 1) == []  # idle since this look only
    assert looks(broker, NOW + 2 * DELAY + 1) == ["/queue/q"]


def test_what_is_kept() -> None:
    broker = make()
    broker.send(1, "/queue/holding", {}, b"x", NOW)
    broker.subscribe(1, "c", "/queue/consumed", NOW)
    broker.send(1, "/queue/deduped", {"dup-id": "d1"}, b"x", NOW)
    broker.subscribe(2, "d", "/topic/feed", NOW, durable_name="feed")
    broker.unsubscribe(2, "d", NOW)  # detached: the durable subscription stays
    broker.subscribe_stream(1, "st", "/stream/log", {})
    broker.unsubscribe(1, "st", NOW)
    broker.subscribe(1, "x", "/queue/deduped", NOW, ack="client-individual")
    for d in broker.take_outbox().get(1, []):
        broker.ack(1, d.ack_id, NOW)
    broker.unsubscribe(1, "x", NOW)
    assert looks(broker, NOW, NOW + 10 * DELAY) == []
    assert {"/queue/holding", "/queue/consumed", "/queue/deduped", "/topic/feed",
            "/stream/log"} <= set(broker.addresses)


def test_a_topic_nobody_subscribes_to_any_more_goes_too() -> None:
    broker = make()
    broker.subscribe(1, "t", "/topic/news", NOW)
    broker.send(1, "/topic/news", {}, b"x", NOW)
    broker.unsubscribe(1, "t", NOW)
    assert looks(broker, NOW, NOW + DELAY) == ["/topic/news"]
    assert broker.records[-1:] != [(rec.UNDEST, "/topic/news")], "a topic has no DEST record"


def test_each_look_is_a_bounded_slice_of_a_round() -> None:
    broker = make(max_subscriptions_per_connection=0)
    count = IDLE_CHECKS * 2 + 10
    for i in range(count):
        broker.subscribe(1, f"s{i}", f"/queue/junk.{i}", NOW)
        broker.unsubscribe(1, f"s{i}", NOW)
    # one round takes three looks; the next round deletes what was seen idle long enough
    assert looks(broker, NOW, NOW, NOW) == []
    first = broker.delete_idle(NOW + DELAY)
    assert len(first) == IDLE_CHECKS
    assert len(looks(broker, NOW + DELAY, NOW + DELAY)) == count - IDLE_CHECKS
    assert not broker.addresses


def test_a_negative_delay_turns_it_off() -> None:
    broker = make(auto_delete_delay_ms=-1)
    broker.subscribe(1, "s", "/queue/q", NOW)
    broker.unsubscribe(1, "s", NOW)
    assert looks(broker, NOW, NOW + 10**9) == []


def test_a_backup_follows_the_deletion() -> None:
    backup = make()
    backup.follow_destination("/queue/q")
    backup.follow_undestination("/queue/q")
    assert "/queue/q" not in backup.addresses and "/queue/q" not in backup.queues
