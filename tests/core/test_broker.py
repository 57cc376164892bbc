"""The messaging model without any I/O: commands in, deliveries out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core.admission import Admission
from pairmq.core.settings import AddressFullPolicy
from pairmq.core.subscription import TURN_DELIVERIES

NOW = 1_000_000


def deliveries(broker: Broker, conn: int) -> list:
    return broker.take_outbox().get(conn, [])


def bodies(ds) -> list[bytes]:
    return [d.entry.message.body for d in ds]


@pytest.fixture
def broker() -> Broker:
    b = Broker(CoreSettings(default_prefetch=100, max_delivery_attempts=3))
    for conn in (1, 2, 3):
        b.open_session(conn, "1.2")
    return b


def test_queue_delivers_in_send_order_to_one_consumer(broker):
    for i in range(5):
        broker.send(1, "/queue/q", {}, b"%d" % i, NOW)
    broker.subscribe(2, "s", "/queue/q", NOW)
    assert bodies(deliveries(broker, 2)) == [b"0", b"1", b"2", b"3", b"4"]


def test_competing_consumers_are_served_round_robin(broker):
    broker.subscribe(2, "a", "/queue/q", NOW)
    broker.subscribe(3, "b", "/queue/q", NOW)
    for i in range(6):
        broker.send(1, "/queue/q", {}, b"%d" % i, NOW)
    out = broker.take_outbox()
    assert len(out[2]) == 3 and len(out[3]) == 3
    assert bodies(out[2]) + bodies(out[3]) != []
    assert sorted(bodies(out[2]) + bodies(out[3])) == [b"%d" % i for i in range(6)]


def test_topic_fans_out_and_drops_without_subscribers(broker):
    broker.send(1, "/topic/t", {}, b"lost", NOW)
    broker.subscribe(2, "a", "/topic/t", NOW)
    broker.subscribe(3, "b", "/topic/t", NOW)
    broker.send(1, "/topic/t", {}, b"x", NOW)
    out = broker.take_outbox()
    assert bodies(out[2]) == [b"x"] and bodies(out[3]) == [b"x"]
    assert broker.stats["unroutable_topic"] == 1


def test_prefetch_window_limits_unacked(broker):
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=2)
    for i in range(5):
        broker.send(1, "/queue/q", {}, b"%d" % i, NOW)
    first = deliveries(broker, 2)
    assert bodies(first) == [b"0", b"1"]
    broker.ack(2, first[0].ack_id, NOW)
    assert bodies(deliveries(broker, 2)) == [b"2"]


def test_a_large_window_is_handed_out_a_share_a_turn_in_order(broker):
    """A client-ack consumer that acknowledges its whole window of 2,000 at once gets at
    most TURN_DELIVERIES new messages in that turn (a server turn that encoded 2,000
    deliveries held every other client, and the pair's heartbeats, for 100 ms): the rest
    at the next turns, when the server asks (`take_capped`), in order."""
    for i in range(5000):
        broker.send(1, "/queue/q", {}, b"%d" % i, NOW)
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client", prefetch=2000)
    got = []
    turns = []
    while True:
        ds = deliveries(broker, 2)
        turns.append(len(ds))
        got += ds
        if not broker.take_capped(2):
            break
        broker.set_writable(2, True, NOW)
    assert max(turns) == TURN_DELIVERIES and len(got) == 2000
    assert bodies(got) == [b"%d" % i for i in range(2000)]
    broker.ack(2, got[-1].ack_id, NOW)  # the whole window at once
    after = deliveries(broker, 2)
    assert len(after) == TURN_DELIVERIES
    while broker.take_capped(2):
        broker.set_writable(2, True, NOW)
        after += deliveries(broker, 2)
    assert bodies(after) == [b"%d" % i for i in range(2000, 4000)]


def test_client_ack_is_cumulative(broker):
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client", prefetch=3)
    for i in range(4):
        broker.send(1, "/queue/q", {}, b"%d" % i, NOW)
    ds = deliveries(broker, 2)
    broker.ack(2, ds[1].ack_id, NOW)  # acks 0 and 1
    assert bodies(deliveries(broker, 2)) == [b"3"]
    with pytest.raises(CoreError):
        broker.ack(2, ds[0].ack_id, NOW)


def test_nack_redelivers_then_dead_letters(broker):
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual")
    broker.send(1, "/queue/q", {"k": "v"}, b"m", NOW)
    for attempt in (1, 2, 3):
        (d,) = deliveries(broker, 2)
        assert d.delivery_count == attempt
        broker.nack(2, d.ack_id, NOW)
    assert deliveries(broker, 2) == []
    broker.subscribe(3, "dlq", "/queue/DLQ.q", NOW)
    (dead,) = deliveries(broker, 3)
    assert dead.entry.message.headers["dead-letter-reason"] == "max-delivery-attempts"
    assert dead.entry.message.headers["original-destination"] == "/queue/q"
    assert dead.entry.message.headers["k"] == "v"


def test_closing_a_connection_returns_unacked_at_the_head(broker):
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual")
    for i in range(3):
        broker.send(1, "/queue/q", {}, b"%d" % i, NOW)
    deliveries(broker, 2)
    broker.close_session(2, NOW)
    broker.subscribe(3, "s", "/queue/q", NOW, ack="client-individual")
    ds = deliveries(broker, 3)
    assert bodies(ds) == [b"0", b"1", b"2"]
    assert all(d.delivery_count == 2 for d in ds)


def test_priority_higher_first_fifo_within(broker):
    for body, prio in ((b"a", "1"), (b"b", "9"), (b"c", "1"), (b"d", "9"), (b"e", "4")):
        broker.send(1, "/queue/q", {"priority": prio}, body, NOW)
    broker.subscribe(2, "s", "/queue/q", NOW)
    assert bodies(deliveries(broker, 2)) == [b"b", b"d", b"e", b"a", b"c"]


@pytest.mark.parametrize("bad", ["10", "-1", "high", "", "²", "٣", "1" * 5000])
def test_bad_priority_is_refused(broker, bad):
    # digits int() reads otherwise ("٣") or refuses ("²", 5000 of them) are named too,
    # never an internal error
    with pytest.raises(CoreError, match="priority"):
        broker.send(1, "/queue/q", {"priority": bad}, b"", NOW)


@pytest.mark.parametrize("bad", ["soon", "-5", "²", "1" * 5000])
def test_bad_expires_is_refused(broker, bad):
    with pytest.raises(CoreError, match="expires"):
        broker.send(1, "/queue/q", {"expires": bad}, b"", NOW)


def test_expired_messages_are_dead_lettered_or_dropped():
    for policy, expect_dlq in (("dead-letter", True), ("drop", False)):
        b = Broker(CoreSettings(expired_policy=policy))
        b.open_session(1, "1.2")
        b.send(1, "/queue/q", {"expires": str(NOW + 10)}, b"old", NOW)
        b.send(1, "/queue/q", {}, b"fresh", NOW)
        b.subscribe(1, "s", "/queue/q", NOW + 20)
        assert bodies(deliveries(b, 1)) == [b"fresh"]
        b.subscribe(1, "d", "/queue/DLQ.q", NOW + 20)
        assert bodies(deliveries(b, 1)) == ([b"old"] if expect_dlq else [])
        assert b.stats["expired"] == 1


def test_sweep_expires_waiting_messages(broker):
    broker.send(1, "/queue/q", {"expires": str(NOW + 5)}, b"x", NOW)
    assert broker.sweep_expired(NOW + 4) == 0
    assert broker.sweep_expired(NOW + 6) == 1
    assert broker.queues["/queue/q"].count == 0
    assert broker.queues["/queue/DLQ.q"].count == 1


def test_transaction_sends_and_acks_apply_at_commit(broker):
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual")
    broker.send(1, "/queue/q", {}, b"before", NOW)
    (d,) = deliveries(broker, 2)
    broker.begin(2, "t")
    broker.ack(2, d.ack_id, NOW, transaction="t")
    broker.send(2, "/queue/out", {}, b"in-tx", NOW, transaction="t")
    assert broker.queues.get("/queue/out") is None or broker.queues["/queue/out"].count == 0
    broker.commit(2, "t", NOW)
    assert broker.queues["/queue/out"].count == 1
    assert broker.addresses["/queue/q"].size == 0


def test_abort_discards_sends_and_returns_acked(broker):
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual")
    broker.send(1, "/queue/q", {}, b"m", NOW)
    (d,) = deliveries(broker, 2)
    broker.begin(2, "t")
    broker.ack(2, d.ack_id, NOW, transaction="t")
    broker.send(2, "/queue/out", {}, b"x", NOW, transaction="t")
    broker.abort(2, "t", NOW)
    (again,) = deliveries(broker, 2)
    assert again.entry.message.body == b"m" and again.delivery_count == 2
    assert "/queue/out" not in broker.queues


def test_disconnect_with_open_transaction_aborts_it(broker):
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual")
    broker.send(1, "/queue/q", {}, b"m", NOW)
    (d,) = deliveries(broker, 2)
    broker.begin(2, "t")
    broker.ack(2, d.ack_id, NOW, transaction="t")
    broker.close_session(2, NOW)
    assert broker.queues["/queue/q"].count == 1


def test_unknown_or_duplicate_transaction_is_an_error(broker):
    with pytest.raises(CoreError, match="unknown transaction"):
        broker.commit(1, "nope", NOW)
    broker.begin(1, "t")
    with pytest.raises(CoreError, match="already open"):
        broker.begin(1, "t")


def test_durable_subscription_keeps_messages_while_away():
    b = Broker()
    b.open_session(1, "1.2", client_id="c1")
    b.subscribe(1, "s", "/topic/t", NOW, durable_name="sub")
    b.close_session(1, NOW)
    b.open_session(2, "1.2")
    b.send(2, "/topic/t", {}, b"while-away", NOW)
    b.open_session(3, "1.2", client_id="c1")
    b.subscribe(3, "s2", "/topic/t", NOW, durable_name="sub")
    assert bodies(deliveries(b, 3)) == [b"while-away"]
    b.open_session(4, "1.2", client_id="c2")
    b.unsubscribe(3, "s2", NOW, delete_durable=True)
    assert "c1:sub" not in b.durables


def test_only_one_active_subscriber_per_durable_and_client_id():
    b = Broker()
    b.open_session(1, "1.2")
    b.subscribe(1, "x", "/topic/t", NOW, durable_name="d")
    b.open_session(2, "1.2")
    with pytest.raises(CoreError, match="already active"):
        b.subscribe(2, "x", "/topic/t", NOW, durable_name="d")
    b.open_session(3, "1.2", client_id="c")
    with pytest.raises(CoreError, match="client-id"):
        b.open_session(4, "1.2", client_id="c")


def test_temp_queue_reply_to_is_rewritten_and_private(broker):
    broker.subscribe(1, "r", "/temp-queue/replies", NOW)
    broker.send(1, "/queue/req", {"reply-to": "/temp-queue/replies"}, b"ask", NOW)
    broker.subscribe(2, "w", "/queue/req", NOW)
    (req,) = deliveries(broker, 2)
    reply_to = req.entry.message.headers["reply-to"]
    assert reply_to.startswith("/reply-queue/")
    with pytest.raises(CoreError, match="only the connection"):
        broker.subscribe(2, "steal", reply_to, NOW)
    broker.send(2, reply_to, {}, b"answer", NOW)
    assert bodies(deliveries(broker, 1)) == [b"answer"]
    broker.close_session(1, NOW)
    with pytest.raises(CoreError, match="no longer exists"):
        broker.send(2, reply_to, {}, b"late", NOW)


def test_full_destination_blocks_and_unblocks(broker):
    b = Broker(CoreSettings(max_size_bytes=5000, address_full_policy=AddressFullPolicy.BLOCK))
    b.open_session(1, "1.2")
    outcomes = [b.send(1, "/queue/q", {}, b"x" * 1000, NOW).admission for _ in range(7)]
    # 1,080 bytes each (body, timestamp, bookkeeping): the 5th passes the limit and is taken
    assert outcomes == [Admission.ACCEPTED] * 5 + [Admission.HELD] * 2
    assert [e.kind for e in b.take_events()] == ["address-full"]
    b.subscribe(1, "s", "/queue/q", NOW)
    assert [e.kind for e in b.take_events()] == ["address-resumed"]


def test_unknown_destination_kind_is_refused(broker):
    with pytest.raises(CoreError, match="unknown destination"):
        broker.send(1, "/exchange/x", {}, b"", NOW)


def test_legacy_ack_by_message_id(broker):
    b = Broker()
    b.open_session(1, "1.1")
    b.subscribe(1, "s", "/queue/q", NOW, ack="client-individual")
    b.send(1, "/queue/q", {}, b"m", NOW)
    (d,) = deliveries(b, 1)
    ack_id = b.legacy_ack_id(1, d.entry.message.message_id, "s")
    b.ack(1, ack_id, NOW)
    assert b.addresses["/queue/q"].size == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["send", "ack", "nack", "sub", "unsub", "close"]),
                          st.integers(0, 2), st.integers(0, 9)), max_size=60))
def test_no_message_is_lost_or_duplicated(ops):
    """Whatever clients do, every message sent to a queue is acked once or still held."""
    b = Broker(CoreSettings(max_delivery_attempts=0, default_prefetch=3))
    open_conns: set[int] = set()
    held: dict[int, list] = {0: [], 1: [], 2: []}
    sent: set[bytes] = set()
    acked: list[bytes] = []
    seq = 0
    for op, conn, prio in ops:
        if conn not in open_conns:
            b.open_session(conn, "1.2")
            open_conns.add(conn)
        if op == "send":
            seq += 1
            body = b"%d" % seq
            sent.add(body)
            b.send(conn, "/queue/q", {"priority": str(prio)}, body, NOW)
        elif op == "sub" and "s" not in b.sessions[conn].subs:
            b.subscribe(conn, "s", "/queue/q", NOW, ack="client-individual")
        elif op == "unsub" and "s" in b.sessions[conn].subs:
            b.unsubscribe(conn, "s", NOW)
            held[conn] = []
        elif op in ("ack", "nack") and held[conn]:
            d = held[conn].pop(0)
            if op == "ack":
                b.ack(conn, d.ack_id, NOW)
                acked.append(d.entry.message.body)
            else:
                b.nack(conn, d.ack_id, NOW)
        elif op == "close":
            b.close_session(conn, NOW)
            open_conns.discard(conn)
            held[conn] = []
        for c, ds in b.take_outbox().items():
            held[c].extend(ds)
    assert len(acked) == len(set(acked))
    q = b.queues.get("/queue/q")
    waiting = {e.message.body for e in q.entries()} if q else set()
    in_flight = {d.entry.message.body for ds in held.values() for d in ds}
    assert set(acked) | waiting | in_flight == sent
    assert not (set(acked) & (waiting | in_flight))
