"""What clients may make (issue 20, item 2): at most max_destinations, each empty one
small. The limit applies to clients' frames only: a recovery, or a backup following its
active server, rebuilds whatever the journal holds."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from pairmq.core import Broker, CoreError, CoreSettings

NOW = 1_000_000


def make(**settings) -> Broker:
    broker = Broker(CoreSettings(**settings))
    broker.open_session(1, "1.2")
    return broker


def test_clients_make_at_most_max_destinations() -> None:
    broker = make(max_destinations=3)
    broker.send(1, "/queue/a", {}, b"x", NOW)
    broker.subscribe(1, "s", "/topic/b", NOW)
    broker.subscribe_stream(1, "c", "/stream/c", {})
    message = r"too many destinations: the server holds max_destinations \(3\); "
    with pytest.raises(CoreError, match=message + "/queue/d is not made"):
        broker.send(1, "/queue/d", {}, b"x", NOW)
    with pytest.raises(CoreError, match=message + "/queue/d is not made"):
        broker.subscribe(1, "s2", "/queue/d", NOW)
    with pytest.raises(CoreError, match=message + "/queue/d is not made"):
        broker.send_batch(1, "/queue/d", {}, [({}, b"a")], NOW)
    with pytest.raises(CoreError, match=message + "/stream/e is not made"):
        broker.subscribe_stream(1, "e", "/stream/e", {})
    with pytest.raises(CoreError, match=message + "/temp-queue/replies is not made"):
        broker.subscribe(1, "t", "/temp-queue/replies", NOW)  # temporary ones count too
    broker.send(1, "/queue/a", {}, b"more", NOW)  # existing ones are used as ever
    assert sorted(broker.addresses) == ["/queue/a", "/stream/c", "/topic/b"]


def test_a_connection_holds_at_most_its_subscriptions() -> None:
    broker = make(max_subscriptions_per_connection=2)
    broker.subscribe(1, "a", "/queue/a", NOW)
    broker.subscribe_stream(1, "b", "/stream/b", {})
    message = r"too many subscriptions on this connection: max_subscriptions_per_connection \(2\)"
    with pytest.raises(CoreError, match=message):
        broker.subscribe(1, "c", "/queue/c", NOW)
    with pytest.raises(CoreError, match=message):
        broker.subscribe_stream(1, "d", "/stream/d", {})
    broker.unsubscribe(1, "a", NOW)
    broker.subscribe(1, "c", "/queue/c", NOW)  # room again


def test_an_empty_queue_takes_about_a_kilobyte() -> None:
    broker = make()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(2000):
            broker.subscribe(1, f"s{i}", f"/queue/empty.{i}", NOW)
        broker.records.clear()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    per_queue = sum(s.size_diff for s in after.compare_to(before, "filename")) / 2000
    assert per_queue < 1500, f"{per_queue:.0f} bytes per empty queue with its consumer " \
                             "(8,900 when each had a deque per priority level)"
