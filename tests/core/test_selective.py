"""Selectors in the broker, without I/O: queue consumers with a selector beside others
(nothing lost, nothing twice, only what matches), their index's cost, topic filtering, and
what a stream subscription keeps (selector, RabbitMQ's x-stream-filter)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core.selective import stream_match

NOW = 1_000_000


def bodies(out) -> list[bytes]:
    return [d.entry.message.body for d in out]


@pytest.fixture
def broker() -> Broker:
    b = Broker(CoreSettings(default_prefetch=1000))
    for conn in (1, 2, 3, 4):
        b.open_session(conn, "1.2")
    return b


def test_selective_consumer_takes_matches_from_anywhere_in_the_queue(broker):
    for i in range(20):
        broker.send(1, "/queue/q", {"n": str(i)}, b"%d" % i, NOW)
    broker.subscribe(2, "s", "/queue/q", NOW, selector="n >= 15")
    assert bodies(broker.take_outbox()[2]) == [b"15", b"16", b"17", b"18", b"19"]
    broker.subscribe(3, "p", "/queue/q", NOW)
    assert bodies(broker.take_outbox()[3]) == [b"%d" % i for i in range(15)]


def test_priority_order_holds_for_a_selective_consumer(broker):
    for i, priority in enumerate([1, 9, 4, 9, 1]):
        broker.send(1, "/queue/q", {"priority": str(priority), "k": "x"}, b"%d" % i, NOW)
    broker.subscribe(2, "s", "/queue/q", NOW, selector="k = 'x'")
    assert bodies(broker.take_outbox()[2]) == [b"1", b"3", b"2", b"0", b"4"]


def test_a_bad_selector_changes_nothing(broker):
    with pytest.raises(CoreError, match="selector"):
        broker.subscribe(2, "s", "/queue/q", NOW, selector="a = = 1")
    broker.subscribe(2, "s", "/queue/q", NOW)  # the id is still free


def test_topic_subscription_keeps_only_what_matches(broker):
    broker.subscribe(2, "red", "/topic/t", NOW, selector="color = 'red'")
    broker.subscribe(3, "all", "/topic/t", NOW)
    for colour in ("red", "blue", "red"):
        broker.send(1, "/topic/t", {"color": colour}, colour.encode(), NOW)
    out = broker.take_outbox()
    assert bodies(out[2]) == [b"red", b"red"]
    assert bodies(out[3]) == [b"red", b"blue", b"red"]


def test_taken_entries_and_stale_index_references_stay_bounded(broker):
    """A selective consumer taking from deep in a queue of 50,000 that a plain consumer
    drains too: the queue's dropped entries and the index's references stay bounded."""
    for i in range(50_000):
        broker.send(1, "/queue/q", {"c": "red" if i % 10 == 0 else "blue"}, b"", NOW)
    sub = broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual",
                           selector="c = 'red'")
    q = sub.queue
    taken = 0
    while True:
        out = broker.take_outbox().get(2, [])
        if not out:
            break
        for d in out:
            broker.ack(2, d.ack_id, NOW)
        taken += len(out)
        assert q.taken <= max(1024, q.count) + 1
    assert taken == 5_000 and q.count == 45_000
    assert sub.index is not None and sub.index.size == 0
    broker.subscribe(3, "p", "/queue/q", NOW, ack="client-individual", prefetch=100)
    for _ in range(20):  # the plain consumer drains some; new reds keep coming
        for d in broker.take_outbox().get(3, []):
            broker.ack(3, d.ack_id, NOW)
    assert sub.index.size <= 2 * q.count + 1024


def test_what_a_selective_consumer_took_is_dropped_and_holds_no_body(broker):
    """Mostly matches in a queue of 5,000: the taken entries pass the waiting ones, so the
    queue drops them (compaction runs), and meanwhile no tombstone, in the queue or in a
    selector's index, holds the body of a message acknowledged (and no longer counted)."""
    body = b"x" * 1000
    for i in range(5_000):
        broker.send(1, "/queue/q", {"c": "blue" if i % 10 == 0 else "red"}, body, NOW)
    sub = broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual",
                           selector="c = 'red'")
    other = broker.subscribe(3, "o", "/queue/q", NOW, ack="client-individual",
                             selector="c = 'red'", prefetch=1)  # an index with stale refs
    q = sub.queue
    while True:
        out = broker.take_outbox()
        if not out:
            break
        for conn, deliveries in out.items():
            for d in deliveries:
                broker.ack(conn, d.ack_id, NOW)
        held = sum(len(e.message.body or b"") for level in q._levels if level for e in level)
        held += sum(len(e.message.body or b"") for index in (sub.index, other.index)
                    if index is not None for level in index._levels if level for e in level
                    if not e.waiting)
        assert held <= q.count * len(body), "tombstones hold acknowledged bodies"
    in_levels = sum(len(level) for level in q._levels if level)
    assert q.count == 500 and in_levels <= q.count + 1025, \
        f"the taken entries were dropped from the levels ({in_levels} left)"


OPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(["red", "blue", "green"]),
              st.integers(0, 9), st.integers(0, 9)),
    st.tuples(st.just("ack"), st.sampled_from([2, 3, 4])),
    st.tuples(st.just("nack"), st.sampled_from([2, 3, 4])),
    st.tuples(st.just("plain"), st.just(4)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_every_message_is_consumed_once_by_a_consumer_it_matches(ops):
    """Two selective consumers and (from some point on) a plain one, with random sends,
    ACKs and NACKs: every message is acknowledged exactly once, and a selective consumer
    is only ever given messages its selector matches."""
    broker = Broker(CoreSettings(default_prefetch=2))
    for conn in (1, 2, 3, 4):
        broker.open_session(conn, "1.2")
    selectors = {2: "color = 'red'", 3: "weight > 4 AND color <> 'green'"}
    checks = {2: lambda h: h["color"] == "red",
              3: lambda h: int(h["weight"]) > 4 and h["color"] != "green"}
    for conn, text in selectors.items():
        broker.subscribe(conn, f"s{conn}", "/queue/q", NOW, ack="client-individual",
                         selector=text)
    held: dict[int, list] = {2: [], 3: [], 4: []}
    acked: list[bytes] = []
    sent = 0
    plain = False

    def collect() -> None:
        for conn, out in broker.take_outbox().items():
            for d in out:
                headers = d.entry.message.headers
                if conn in checks:
                    assert checks[conn](headers), (conn, headers)
                held[conn].append(d)

    for op in ops:
        if op[0] == "send":
            _, colour, weight, priority = op
            broker.send(1, "/queue/q", {"color": colour, "weight": str(weight),
                                        "priority": str(priority)}, b"%d" % sent, NOW)
            sent += 1
        elif op[0] == "plain" and not plain:
            broker.subscribe(4, "p", "/queue/q", NOW, ack="client-individual")
            plain = True
        elif op[0] in ("ack", "nack") and held[op[1]]:
            d = held[op[1]].pop(0)
            if op[0] == "ack":
                broker.ack(op[1], d.ack_id, NOW)
                acked.append(d.entry.message.body)
            else:
                broker.nack(op[1], d.ack_id, NOW)
        collect()
    if not plain:
        broker.subscribe(4, "p", "/queue/q", NOW, ack="client-individual")
    collect()
    while any(held.values()):
        for conn in (2, 3, 4):
            while held[conn]:
                d = held[conn].pop(0)
                broker.ack(conn, d.ack_id, NOW)
                acked.append(d.entry.message.body)
        collect()
    assert sorted(acked) == sorted(b"%d" % i for i in range(sent))


def test_stream_match_by_filter_value_and_selector():
    keep = stream_match({"x-stream-filter": "california, texas"})
    assert keep is not None
    assert keep({"x-stream-filter-value": "texas"})
    assert not keep({"x-stream-filter-value": "oregon"})
    assert not keep({})  # unfiltered records only with match-unfiltered
    loose = stream_match({"x-stream-filter": "california",
                          "x-stream-match-unfiltered": "true"})
    assert loose is not None and loose({}) and not loose({"x-stream-filter-value": "texas"})
    both = stream_match({"x-stream-filter": "california", "selector": "size > 2"})
    assert both is not None
    assert both({"x-stream-filter-value": "california", "size": "3"})
    assert not both({"x-stream-filter-value": "california", "size": "1"})
    assert stream_match({"x-stream-offset": "first"}) is None
    for headers, named in (({"x-stream-filter": " , "}, "x-stream-filter"),
                           ({"x-stream-filter": "a", "x-stream-match-unfiltered": "yes"},
                            "x-stream-match-unfiltered"),
                           ({"selector": "size >"}, "selector")):
        with pytest.raises(CoreError, match=named):
            stream_match(headers)


def test_jms_message_id_and_destination_read_the_message(broker):
    """JMSMessageID and JMSDestination are not among a message's stored headers: the
    selector reads them from the message, on a queue and on a topic subscription."""
    broker.send(1, "/queue/q", {}, b"first", NOW)
    broker.send(1, "/queue/q", {}, b"second", NOW)
    first_id = next(broker.queues["/queue/q"].entries()).message.message_id
    broker.subscribe(2, "s", "/queue/q", NOW, selector=f"JMSMessageID = '{first_id}'")
    assert bodies(broker.take_outbox()[2]) == [b"first"]
    broker.subscribe(3, "t", "/topic/t", NOW, selector="JMSDestination LIKE '/topic/%'")
    broker.subscribe(3, "u", "/topic/t", NOW, selector="JMSDestination = '/queue/q'")
    broker.send(1, "/topic/t", {}, b"to the topic", NOW)
    out = broker.take_outbox()[3]
    assert [(d.subscription.id, d.entry.message.body) for d in out] == [("t", b"to the topic")]
