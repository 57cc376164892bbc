"""core/cluster.py: what a member wants from the others, on a real Broker (no I/O)."""

from __future__ import annotations

from pairmq.core import Broker
from pairmq.core.cluster import (
    HOPS,
    LOAD_BALANCED,
    ORIGIN,
    PRODUCER_DUP_ID,
    IdleClock,
    Interest,
    LoadBalancing,
    Want,
    carried,
    interest_of,
    wanted,
)

BRIDGE = "pairmq-bridge.west"


def _broker() -> tuple[Broker, int, int]:
    broker = Broker()
    broker.open_session(1, "1.2")  # an application
    broker.open_session(2, "1.2", BRIDGE)  # another member's bridge
    return broker, 1, 2


def test_interest_counts_the_members_own_consumers_not_bridges() -> None:
    broker, app, bridge = _broker()
    broker.subscribe(app, "a", "/queue/orders", 0, ack="client-individual")
    broker.subscribe(bridge, "b", "/queue/orders", 0, ack="client-individual")
    broker.subscribe(bridge, "c", "/queue/bridged-only", 0, ack="client-individual")
    broker.send(app, "/queue/waiting", {}, b"x", 0)
    interest = interest_of(broker)
    assert interest.consumers == {"/queue/orders": 1, "/queue/bridged-only": 0,
                                  "/queue/waiting": 0}
    assert interest.idle == {"/queue/waiting": 1}
    assert interest.waiting == 1


def test_interest_in_topics_counts_live_and_durable_subscribers_not_bridges() -> None:
    broker, app, bridge = _broker()
    broker.subscribe(app, "a", "/topic/live", 0)
    broker.subscribe(bridge, "b", "/topic/bridged", 0, durable_name="/topic/bridged")
    broker.open_session(3, "1.2", "app-durable")
    broker.subscribe(3, "d", "/topic/kept", 0, durable_name="kept")
    broker.close_session(3, 0)  # the durable subscription stays, its subscriber gone
    assert interest_of(broker).topics == frozenset({"/topic/live", "/topic/kept"})


def _interest(consumers: dict[str, int], topics: tuple[str, ...] = ()) -> Interest:
    return Interest(consumers, frozenset(topics), {}, 0)


def test_on_demand_takes_unforwarded_messages_of_consumed_queues_and_subscribed_topics() -> None:
    local = _interest({"/queue/a": 2, "/queue/b": 0}, ("/topic/t",))
    assert wanted(LoadBalancing.ON_DEMAND, local, {}, 1000) == {
        "/queue/a": Want("/queue/a", LOAD_BALANCED, False),
        "/topic/t": Want("/topic/t", LOAD_BALANCED, True)}


def test_redistribution_takes_everything_from_a_queue_idle_long_enough() -> None:
    local = _interest({"/queue/a": 1, "/queue/b": 1})
    remote_idle = {"/queue/a": 1500, "/queue/b": 200}
    assert wanted(LoadBalancing.ON_DEMAND, local, remote_idle, 1000) == {
        "/queue/a": Want("/queue/a", None, False),  # carried messages too
        "/queue/b": Want("/queue/b", LOAD_BALANCED, False)}
    # -1: never redistributed
    assert wanted(LoadBalancing.ON_DEMAND, local, remote_idle, -1)["/queue/a"].selector \
        == LOAD_BALANCED


def test_modes() -> None:
    local = _interest({"/queue/a": 1, "/queue/none": 0}, ("/topic/t",))
    idle = {"/queue/a": 5000}
    assert wanted(LoadBalancing.OFF, local, idle, 0) == {}
    strict = wanted(LoadBalancing.STRICT, local, {}, 1000)
    assert set(strict) == {"/queue/a", "/queue/none", "/topic/t"}
    assert wanted(LoadBalancing.OFF_WITH_REDISTRIBUTION, local, {}, 1000) == {}
    assert wanted(LoadBalancing.OFF_WITH_REDISTRIBUTION, local, idle, 1000) == {
        "/queue/a": Want("/queue/a", None, False)}


def test_carried_headers_count_a_hop_keep_the_origin_and_name_the_message() -> None:
    delivered = {"message-id": "ID:east-1-7", "subscription": "bridge:/queue/a", "ack": "9",
                 "destination": "/queue/a", "redelivered": "true", "persistent": "true",
                 "app": "x", "dup-id": "producer-42"}
    out = carried(delivered, "east")
    assert out == {"persistent": "true", "app": "x", HOPS: "1", ORIGIN: "east",
                   PRODUCER_DUP_ID: "producer-42", "dup-id": "cluster:ID:east-1-7"}
    # carried on again (redistributed): a new dup-id, the message-id of the member it
    # leaves; the producer's dup-id and the origin stay
    again = carried({**out, "message-id": "ID:west-2-1"}, "west")
    assert again[HOPS] == "2" and again[ORIGIN] == "east"
    assert again["dup-id"] == "cluster:ID:west-2-1"
    assert again[PRODUCER_DUP_ID] == "producer-42"
    assert PRODUCER_DUP_ID not in carried({"message-id": "m"}, "east")


def test_idle_clock_counts_from_when_a_queue_first_looked_idle() -> None:
    clock = IdleClock()
    busy = Interest({}, frozenset(), {"/queue/a": 3}, 3)
    assert clock.update(busy, 1000) == {"/queue/a": 0}
    assert clock.update(busy, 1700) == {"/queue/a": 700}
    assert clock.update(Interest({}, frozenset(), {}, 0), 1800) == {}
    assert clock.update(busy, 1900) == {"/queue/a": 0}
