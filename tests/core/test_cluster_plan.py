"""core/cluster.py: what a member wants from the others, on a real Broker (no I/O)."""

from __future__ import annotations

from pairmq.core import Broker
from pairmq.core.cluster import (
    HOPS,
    LOAD_BALANCED,
    ORIGIN,
    PRODUCER_DUP_ID,
    Interest,
    LoadBalancing,
    Want,
    carried,
    drains,
    fed_queues,
    feedable,
    interest_of,
    sf_parts,
    sf_queue,
    store_and_forward,
    wanted,
)
from pairmq.core.message import Entry, Message

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
    broker.subscribe(bridge, "s", sf_queue("west", "/queue/orders"), 0,
                     ack="client-individual")
    broker.send(app, "/queue/waiting", {}, b"x", 0)
    interest = interest_of(broker)
    # a store-and-forward queue is nobody's interest: never pulled on by another member
    assert interest.consumers == {"/queue/orders": 1, "/queue/bridged-only": 0,
                                  "/queue/waiting": 0}
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
    return Interest(consumers, frozenset(topics), 0)


def test_store_and_forward_names() -> None:
    assert sf_queue("east", "/queue/orders.eu") == "/queue/pairmq.sf:east:orders.eu"
    assert sf_parts("/queue/pairmq.sf:east:orders.eu") == ("east", "/queue/orders.eu")
    assert sf_parts("/queue/pairmq.sf:east:a:b") == ("east", "/queue/a:b")
    assert sf_parts("/queue/orders") is None
    assert sf_parts("/queue/pairmq.sf:east") is None


def test_on_demand_pulls_consumed_queues_and_subscribed_topics() -> None:
    local = _interest({"/queue/a": 2, "/queue/b": 0}, ("/topic/t",))
    sf = sf_queue("east", "/queue/a")
    assert wanted(LoadBalancing.ON_DEMAND, "east", local) == {
        sf: Want(sf, None, False, "/queue/a"),
        "/topic/t": Want("/topic/t", LOAD_BALANCED, True, "/topic/t")}


def test_modes() -> None:
    local = _interest({"/queue/a": 1, "/queue/none": 0}, ("/topic/t",))
    assert wanted(LoadBalancing.OFF, "east", local) == {}
    assert set(wanted(LoadBalancing.STRICT, "east", local)) == {
        sf_queue("east", "/queue/a"), sf_queue("east", "/queue/none"), "/topic/t"}
    assert set(wanted(LoadBalancing.OFF_WITH_REDISTRIBUTION, "east", local)) == {
        sf_queue("east", "/queue/a")}


def _entry(**headers: str) -> Entry:
    return Entry(Message("ID:1", "/queue/a", headers, b"", True))


def test_what_a_member_gives_away() -> None:
    fresh, carried_once = _entry(), _entry(**{HOPS: "1"})
    # its queue has a consumer of its own: only messages never carried (load balancing)
    lb = feedable(LoadBalancing.ON_DEMAND, 1000, None)
    assert lb is not None and lb(fresh) and not lb(carried_once)
    # no consumer of its own, not for long enough yet: the same
    early = feedable(LoadBalancing.ON_DEMAND, 1000, 400)
    assert early is not None and not early(carried_once)
    # long enough: everything (redistribution), -1: never
    late = feedable(LoadBalancing.ON_DEMAND, 1000, 1500)
    assert late is not None and late(carried_once)
    never = feedable(LoadBalancing.ON_DEMAND, -1, 10**9)
    assert never is not None and not never(carried_once)
    assert feedable(LoadBalancing.OFF, 0, 10**9) is None
    assert feedable(LoadBalancing.OFF_WITH_REDISTRIBUTION, 1000, None) is None
    assert feedable(LoadBalancing.OFF_WITH_REDISTRIBUTION, 1000, 400) is None
    whole = feedable(LoadBalancing.OFF_WITH_REDISTRIBUTION, 1000, 1000)
    assert whole is not None and whole(carried_once)


def test_what_a_member_asks_to_be_fed_and_what_it_drains() -> None:
    local = _interest({"/queue/a": 1, "/queue/b": 0}, ("/topic/t",))
    assert fed_queues(wanted(LoadBalancing.ON_DEMAND, "east", local)) == ["/queue/a"]
    assert fed_queues(wanted(LoadBalancing.STRICT, "east", local)) == ["/queue/a", "/queue/b"]
    sf = sf_queue("east", "/queue/b")
    assert drains("east", {"/queue/b": 3}) == {sf: Want(sf, None, False, "/queue/b")}


def test_store_and_forward_queues_holding_messages_by_member() -> None:
    broker, app, _bridge = _broker()
    broker.send(app, sf_queue("west", "/queue/a"), {}, b"x", 0)
    broker.send(app, sf_queue("west", "/queue/b"), {}, b"y", 0)
    broker.send(app, "/queue/plain", {}, b"z", 0)
    assert store_and_forward(broker) == {"west": {"/queue/a": 1, "/queue/b": 1}}


def test_feed_moves_what_is_accepted_and_keeps_the_rest_in_order() -> None:
    broker, app, _bridge = _broker()
    for k in range(6):
        broker.send(app, "/queue/a", {HOPS: "1"} if k % 2 else {}, f"m{k}".encode(), 0)
    sf = sf_queue("west", "/queue/a")
    moved = broker.feed("/queue/a", sf, 2, 0, feedable(LoadBalancing.ON_DEMAND, 1000, None)
                        or (lambda e: False), 10)
    assert moved == 2
    assert [m.body for m in broker.browse(sf, 10).messages] == [b"m0", b"m2"]
    assert [m.body for m in broker.browse("/queue/a", 10).messages] == [
        b"m1", b"m3", b"m4", b"m5"]


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
