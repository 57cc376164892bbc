"""Producer sequences in the core (core/producers.py, docs/durability.md): a producer's
messages to a destination are numbered, the server keeps the highest number it took per
producer and destination, drops what is at or below it, refuses a gap or an older epoch,
journals the numbers with the messages, and forgets idle producers. Pure: no server."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core import records as rec
from pairmq.core.admission import Admission, Cause
from pairmq.core.producers import Producers, SequenceRefused
from pairmq.core.settings import AddressFullPolicy
from pairmq.protocol.stamps import Stamp
from tests.support.replay import replayed

NOW = 1_000_000
Q = "/queue/q"
P = {"persistent": "true"}
DAY = 24 * 3600 * 1000


def make(**settings) -> Broker:
    broker = Broker(CoreSettings(**settings))
    for conn in (1, 2):
        broker.open_session(conn, "1.2")
    return broker


def stamped(seq: int, producer: str = "p", epoch: int | None = None, **extra: str
            ) -> dict[str, str]:
    headers = {**P, "pairmq-producer": producer, "pairmq-seq": str(seq), **extra}
    if epoch is not None:
        headers["pairmq-producer-epoch"] = str(epoch)
    return headers


def send(broker: Broker, seq: int, body: bytes = b"x", destination: str = Q,
         now: int = NOW, **stamp):
    return broker.send(1, destination, stamped(seq, **stamp), body, now)


def batch(broker: Broker, first: int, bodies: list[bytes], destination: str = Q,
          now: int = NOW, **stamp):
    headers = {"pairmq-batch": str(len(bodies)), **stamped(first, **stamp)}
    return broker.send_batch(1, destination, headers, [({}, b) for b in bodies], now)


def drain(broker: Broker, destination: str = Q) -> list[bytes]:
    """The bodies waiting at `destination`, in order (taken by connection 2)."""
    broker.subscribe(2, f"drain-{broker.stats['delivered']}-{destination}", destination, NOW,
                     prefetch=100_000)
    bodies = [d.entry.message.body for d in broker.take_outbox().get(2, [])]
    while broker.take_capped(2):  # the server writes this turn's share, then asks for more
        broker.set_writable(2, True, NOW)
        bodies += [d.entry.message.body for d in broker.take_outbox().get(2, [])]
    return bodies


# ------------------------------------------------------------------------- the table alone


@pytest.mark.parametrize(("kept", "stamp", "count", "verdict"), [
    (None, Stamp("p", 0, 17), 1, 0),  # unknown: starts anywhere
    ((0, 5), Stamp("p", 0, 6), 1, 0),  # the next one
    ((0, 5), Stamp("p", 0, 5), 1, 1),  # at the highest: taken already
    ((0, 5), Stamp("p", 0, 0), 1, 1),  # below it
    ((0, 5), Stamp("p", 0, 3), 5, 3),  # a batch over the highest: 3, 4, 5 taken, 6, 7 new
    ((0, 5), Stamp("p", 0, 0), 4, 4),  # a batch wholly below it
    ((0, 5), Stamp("p", 1, 0), 1, 0),  # a new epoch starts anywhere
    ((2, 5), Stamp("p", 2, 6), 1, 0),
    ((0, 5), Stamp("p", 0, 7), 1, "never came"),  # a gap: 6 is missing
    ((3, 5), Stamp("p", 2, 6), 1, "fenced"),  # an older epoch
])
def test_the_rules_of_the_table(kept, stamp, count, verdict):
    producers = Producers()
    if kept is not None:
        producers.took("p", kept[0], kept[1], NOW)
    if isinstance(verdict, int):
        assert producers.duplicates(stamp, count, Q) == verdict
    else:
        with pytest.raises(SequenceRefused, match=verdict):
            producers.duplicates(stamp, count, Q)


def test_an_unknown_producer_is_not_another_producers_state():
    producers = Producers()
    producers.took("p", 0, 100, NOW)
    assert producers.duplicates(Stamp("q", 0, 0), 1, Q) == 0


def test_idle_producers_are_forgotten_oldest_first_and_the_limit_evicts_the_least_active():
    producers = Producers()
    producers.took("a", 0, 1, NOW)
    producers.took("b", 0, 1, NOW + 10)
    producers.took("a", 0, 2, NOW + 20)  # a is the most recently active now
    assert producers.expire(NOW + 15 + DAY, DAY) == ["b"]
    assert "a" in producers and "b" not in producers
    producers.took("c", 0, 0, NOW + 30)
    assert producers.took("d", 0, 0, NOW + 40, limit=2) == "a"
    assert [p for p, _ in producers.items()] == ["c", "d"]


# ------------------------------------------------------------------------- one message a SEND


def test_a_resent_message_is_answered_and_not_stored_again():
    broker = make()
    assert send(broker, 0, b"a").admission is Admission.ACCEPTED
    assert send(broker, 1, b"b").admission is Admission.ACCEPTED
    assert send(broker, 0, b"a").admission is Admission.DUPLICATE
    assert send(broker, 1, b"b").admission is Admission.DUPLICATE
    assert send(broker, 2, b"c").admission is Admission.ACCEPTED
    assert drain(broker) == [b"a", b"b", b"c"]
    assert broker.stats["duplicates"] == 2


def test_however_many_were_in_flight_a_resend_is_dropped():
    """What the dup-id cache could not do (issue 17): 50,000 messages in flight, more than
    its 20,000, all resent: none stored twice."""
    broker = make(dup_cache_size=100)
    for i in range(50_000):
        send(broker, i, b"%d" % i)
    broker.take_records()
    for i in range(50_000):
        assert send(broker, i, b"%d" % i).admission is Admission.DUPLICATE
    assert broker.take_records() == []
    assert len(drain(broker)) == 50_000


def test_a_gap_is_refused_with_an_error_naming_the_missing_numbers():
    broker = make()
    send(broker, 0)
    send(broker, 1)
    outcome = send(broker, 5)
    assert (outcome.admission, outcome.cause) == (Admission.FAILED, Cause.SEQUENCE)
    assert "producer 'p'" in outcome.reason and Q in outcome.reason
    assert "last one taken is 1: messages 2 to 4 never came" in outcome.reason
    assert len(drain(broker)) == 2


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_anywhere():
    broker = make()
    send(broker, 40, epoch=3)
    outcome = send(broker, 41, epoch=2)
    assert outcome.admission is Admission.FAILED and "fenced" in outcome.reason
    assert send(broker, 0, epoch=4).admission is Admission.ACCEPTED
    assert send(broker, 0, epoch=4).admission is Admission.DUPLICATE
    assert len(drain(broker)) == 2


def test_producers_and_destinations_are_numbered_apart():
    broker = make()
    send(broker, 0, b"p0")
    send(broker, 0, b"q0", producer="q")
    send(broker, 0, b"other", destination="/queue/other")
    assert drain(broker) == [b"p0", b"q0"]
    assert drain(broker, "/queue/other") == [b"other"]


def test_the_stamp_is_the_servers_business_and_not_stored_with_the_message():
    broker = make()
    send(broker, 0, epoch=2)
    broker.subscribe(2, "s", Q, NOW)
    (delivery,) = broker.take_outbox()[2]
    assert not any(name.startswith("pairmq-") for name in delivery.entry.message.headers)


def test_a_persistent_message_journals_its_producers_number_with_it():
    broker = make()
    send(broker, 7, epoch=1, now=NOW + 5)
    records = broker.take_records()
    assert records[-1] == (rec.PRODUCER, Q, "p", 1, 7, NOW + 5)
    assert [r[0] for r in records].count(rec.ADD) == 1
    broker.send(1, Q, {"pairmq-producer": "n", "pairmq-seq": "0"}, b"x", NOW)
    assert broker.take_records() == [], "a non-persistent message: nothing journaled"
    assert broker.send(1, Q, {"pairmq-producer": "n", "pairmq-seq": "0"}, b"x",
                       NOW).admission is Admission.DUPLICATE, "kept in memory all the same"


@pytest.mark.parametrize(("headers", "words"), [
    ({"pairmq-producer": "p"}, "needs a pairmq-seq"),
    ({"pairmq-seq": "1"}, "need a pairmq-producer"),
    ({"pairmq-producer": "p", "pairmq-seq": "-1"}, "pairmq-seq must be a whole number"),
    ({"pairmq-producer": "p", "pairmq-seq": "²"}, "pairmq-seq must be a whole number"),
    ({"pairmq-producer": "p", "pairmq-seq": "9" * 20}, "pairmq-seq must be a whole number"),
    ({"pairmq-producer": "p", "pairmq-seq": "1", "pairmq-producer-epoch": "x"},
     "pairmq-producer-epoch must be"),
    ({"pairmq-producer": "", "pairmq-seq": "1"}, "1 to 256 characters"),
    ({"pairmq-producer": "p" * 257, "pairmq-seq": "1"}, "1 to 256 characters"),
])
def test_a_malformed_stamp_is_an_error_naming_the_header(headers, words):
    broker = make()
    with pytest.raises(CoreError, match=words):
        broker.send(1, Q, {**P, **headers}, b"x", NOW)
    assert broker.stats["received"] == 0


def test_a_stamp_inside_a_transaction_is_an_error():
    broker = make()
    broker.begin(1, "t")
    with pytest.raises(CoreError, match="inside a transaction carries no producer stamp"):
        broker.send(1, Q, stamped(0), b"x", NOW, transaction="t")


def test_a_message_dropped_by_its_destinations_policy_counts_as_taken():
    """Drop answers it (RECEIPT): a resend is a duplicate, not a second chance."""
    broker = make(max_size_bytes=100, address_full_policy=AddressFullPolicy.DROP)
    send(broker, 0, b"x" * 200)  # passes the limit: the destination is full now
    assert send(broker, 1, b"y").admission is Admission.DROPPED
    assert send(broker, 1, b"y").admission is Admission.DUPLICATE
    assert send(broker, 2, b"z").admission is Admission.DROPPED


def test_a_held_or_refused_message_takes_no_number():
    broker = make(max_size_bytes=100, address_full_policy=AddressFullPolicy.FAIL)
    send(broker, 0, b"x" * 200)
    assert send(broker, 1).admission is Admission.FAILED
    drain(broker)  # room again: number 1 is still the next one
    assert send(broker, 1).admission is Admission.ACCEPTED


def test_a_temporary_queue_keeps_its_producers_in_memory_only():
    broker = make()
    broker.send(1, "/temp-queue/t", stamped(0), b"x", NOW)
    assert not [r for r in broker.take_records() if r[0] == rec.PRODUCER]
    assert broker.send(1, "/temp-queue/t", stamped(0), b"x",
                       NOW).admission is Admission.DUPLICATE


# ------------------------------------------------------------------------- batches, streams


def test_a_batch_partly_taken_before_stores_only_its_new_messages():
    broker = make()
    batch(broker, 0, [b"0", b"1", b"2"])
    outcome = batch(broker, 1, [b"1", b"2", b"3", b"4"])
    assert outcome.admission is Admission.ACCEPTED
    assert drain(broker) == [b"0", b"1", b"2", b"3", b"4"]
    assert broker.stats["duplicates"] == 2
    assert batch(broker, 0, [b"0", b"1"]).admission is Admission.DUPLICATE
    assert [r for r in broker.take_records() if r[0] == rec.PRODUCER][-1][4] == 4


def test_a_batch_after_a_gap_is_refused_whole():
    broker = make()
    batch(broker, 0, [b"0", b"1"])
    outcome = batch(broker, 3, [b"3", b"4"])
    assert outcome.admission is Admission.FAILED and "messages 2 to 2 never came" in \
        outcome.reason
    assert drain(broker) == [b"0", b"1"]


def test_a_record_of_a_batch_may_not_carry_a_stamp_of_its_own():
    broker = make()
    headers = {"pairmq-batch": "2", **stamped(0)}
    with pytest.raises(CoreError, match="message 2 of a batched SEND names its producer"):
        broker.send_batch(1, Q, headers, [({}, b"a"), ({"pairmq-seq": "9"}, b"b")], NOW)
    assert broker.stats["received"] == 0


def test_a_resent_batch_to_a_stream_never_takes_an_offset_twice():
    broker = make()
    stream = "/stream/s"
    batch(broker, 0, [b"a", b"b", b"c"], destination=stream)
    batch(broker, 0, [b"a", b"b", b"c", b"d"], destination=stream)  # resent, one more
    send(broker, 3, b"d", destination=stream)  # and again, alone
    log = broker.streams[stream]
    assert (log.first, log.next, log.count) == (0, 4, 4)
    broker.subscribe_stream(2, "r", stream, {"x-stream-offset": "first"})
    got = [d.entry.message for d in broker.take_outbox()[2]]
    assert [(m.body, m.headers["x-stream-offset"]) for m in got] == [
        (b"a", "0"), (b"b", "1"), (b"c", "2"), (b"d", "3")]


# ------------------------------------------------------------------------- memory over time


def test_a_producer_idle_for_producer_expiry_ms_is_forgotten_at_the_sweep():
    broker = make(producer_expiry_ms=DAY)
    send(broker, 5, b"old")
    send(broker, 0, b"active", producer="q", now=NOW + DAY // 2)
    broker.take_records()
    broker.sweep_expired(NOW + DAY)
    assert broker.take_records() == [(rec.PRODUCER_FORGET, Q, "p")]
    # forgotten: its next number is taken as a new start (not refused as a gap)
    assert send(broker, 9, b"back", now=NOW + DAY).admission is Admission.ACCEPTED
    assert send(broker, 0, b"active", producer="q").admission is Admission.DUPLICATE


def test_past_max_producers_the_least_recently_active_is_forgotten_and_it_is_said_once():
    broker = make(max_producers=2)
    for producer in ("a", "b", "c", "d"):
        send(broker, 0, producer=producer)
    records = broker.take_records()
    assert [r[2] for r in records if r[0] == rec.PRODUCER_FORGET] == ["a", "b"]
    assert broker.stats["producers_evicted"] == 2
    events = [e for e in broker.take_events() if e.kind == "producers-evicted"]
    assert len(events) == 1 and "max_producers (2)" in events[0].detail


# ------------------------------------------------------------------------- rebuilt from the journal


def test_a_broker_rebuilt_from_the_records_keeps_every_producers_number_and_order():
    broker = make()
    send(broker, 0, producer="a", now=NOW)
    send(broker, 0, producer="b", now=NOW + 1)
    send(broker, 1, producer="a", now=NOW + 2)  # a is the most recently active
    send(broker, 0, producer="c", now=NOW + 3)
    rebuilt = Broker(CoreSettings(max_producers=2))
    rebuilt.restore(replayed(broker.take_records()))
    rebuilt.open_session(1, "1.2")
    table = rebuilt.addresses[Q].producers
    assert [(p, s.seq) for p, s in table.items()] == [("b", 0), ("a", 1), ("c", 0)]
    assert send(rebuilt, 1, producer="a").admission is Admission.DUPLICATE
    assert send(rebuilt, 3, producer="a").admission is Admission.FAILED  # 2 never came
    send(rebuilt, 0, producer="d")  # past max_producers: b, the least active, goes
    assert "b" not in table
