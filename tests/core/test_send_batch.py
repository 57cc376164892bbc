"""The batched SEND in the core (`pairmq-batch`, docs/stomp.md; Broker.send_batch): each record
is one message to the frame's destination with the frame's headers and its own over them;
taken as a COMMIT takes its sends (held or refused as a whole, else every message routed,
duplicates answered and skipped one by one, page and drop per message); inside a transaction
the messages wait for COMMIT. And the dup-id cache it fills keeps its order: oldest evicted
first, the same again in a broker rebuilt from the records."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core import records as rec
from pairmq.core.admission import Admission, Cause
from pairmq.core.message import Message
from pairmq.core.settings import AddressFullPolicy, Retention
from tests.support.pages import Pages
from tests.support.replay import replayed

NOW = 1_000_000
Q = "/queue/q"
S = "/stream/s"
P = {"persistent": "true"}
BODY = b"x" * 1000  # about 1,100 bytes counted, with headers and bookkeeping
LIMIT = 5000  # the 5th message passes it

Records = list[tuple[dict[str, str], bytes]]


def make(**settings) -> Broker:
    broker = Broker(CoreSettings(**settings))
    for conn in (1, 2):
        broker.open_session(conn, "1.2")
    return broker


def frame(count: int, **headers: str) -> dict[str, str]:
    """A batched SEND's headers, as the server hands them over (pairmq-batch among them)."""
    return {"pairmq-batch": str(count), **headers}


def numbered(count: int, start: int = 0, body: bytes = BODY, **own: str) -> Records:
    """Records n=start.., each with its own dup-id d<n> unless `own` says otherwise."""
    return [({"n": str(i), "dup-id": f"d{i}", **own}, body) for i in range(start, start + count)]


def batch(broker: Broker, records: Records, destination: str = Q, transaction: str | None = None,
          journal_full: str | None = None, **headers: str):
    return broker.send_batch(1, destination, frame(len(records), **headers), records, NOW,
                             transaction=transaction, journal_full=journal_full)


def drain(broker: Broker, destination: str = Q) -> list[Message]:
    """Every message waiting at `destination`, in delivery order (taken by connection 2)."""
    broker.subscribe(2, f"drain-{broker.stats['received']}", destination, NOW)
    return [d.entry.message for d in broker.take_outbox().get(2, [])]


def ns(messages: list[Message]) -> list[str]:
    return [m.headers.get("n", "") for m in messages]


def depth(broker: Broker, destination: str = Q) -> int:
    address = broker.addresses.get(destination)
    return sum(q.count for q in address.queues) if address is not None else 0


def kinds(records: list[tuple], *wanted: int) -> list[tuple]:
    return [r for r in records if r[0] in wanted]


# ----------------------------------------------------------------------------- routing


def test_each_record_is_one_message_in_order_with_the_frame_headers_under_its_own():
    broker = make()
    records: Records = [
        ({"k": "own", "n": "0"}, b"a"),
        ({"n": "1"}, b"b"),
        ({}, b"c"),  # nothing of its own: the frame's headers only
    ]
    outcome = batch(broker, records, k="frame", shared="s", receipt="r-1", persistent="true")
    assert outcome.admission is Admission.ACCEPTED
    got = drain(broker)
    assert [m.body for m in got] == [b"a", b"b", b"c"]
    assert [m.headers.get("k") for m in got] == ["own", "frame", "frame"]
    assert [m.headers.get("n") for m in got] == ["0", "1", None]
    for m in got:
        assert m.headers["shared"] == "s" and m.persistent and m.destination == Q
        assert "pairmq-batch" not in m.headers, "pairmq-batch describes the frame, not a message"
        assert "receipt" not in m.headers
    assert len({m.message_id for m in got}) == 3
    assert broker.stats["received"] == 3


def test_a_record_overrides_persistence_and_priority_for_itself_only():
    broker = make()
    records: Records = [({}, b"low"), ({"priority": "9", "persistent": "false"}, b"high")]
    batch(broker, records, persistent="true", priority="1")
    got = drain(broker)
    assert [m.body for m in got] == [b"high", b"low"]  # priority 9 first
    assert [m.persistent for m in got] == [False, True]
    added = kinds(broker.take_records(), rec.ADD)
    assert [r[1].body for r in added] == [b"low"], "only the persistent one is journaled"


def test_a_batch_to_a_topic_fans_each_message_out_to_every_subscriber():
    broker = make()
    broker.open_session(3, "1.2")
    broker.subscribe(2, "a", "/topic/t", NOW)
    broker.subscribe(3, "b", "/topic/t", NOW)
    batch(broker, numbered(3), destination="/topic/t")
    out = broker.take_outbox()
    assert [d.entry.message.headers["n"] for d in out[2]] == ["0", "1", "2"]
    assert [d.entry.message.headers["n"] for d in out[3]] == ["0", "1", "2"]


def test_a_persistent_batch_journals_one_add_per_message_and_one_dup_per_dup_id():
    broker = make()
    records: Records = [({"dup-id": "a"}, b"0"), ({}, b"1"), ({"dup-id": "b"}, b"2")]
    batch(broker, records, persistent="true")
    written = broker.take_records()
    added = kinds(written, rec.ADD)
    assert [r[1].body for r in added] == [b"0", b"1", b"2"]
    assert all(r[2] == [Q] and r[1].persistent for r in added)
    assert len({r[1].message_id for r in added}) == 3
    assert [r[1:] for r in kinds(written, rec.DUP)] == [(Q, "a"), (Q, "b")]
    assert kinds(written, rec.DUP_EVICT) == []


def test_a_non_persistent_batch_journals_no_message():
    broker = make()
    batch(broker, numbered(3))
    written = broker.take_records()
    assert kinds(written, rec.ADD) == []
    assert len(kinds(written, rec.DUP)) == 3, "its dup-ids are remembered all the same"
    assert depth(broker) == 3


# ----------------------------------------------------------------------------- duplicates


def test_the_same_batch_again_routes_nothing():
    broker = make()
    batch(broker, numbered(4), persistent="true")
    broker.take_records()
    again = batch(broker, numbered(4), persistent="true")
    assert again.admission is Admission.ACCEPTED  # answered: the producer may go on
    assert broker.stats["received"] == 4 and broker.stats["duplicates"] == 4
    assert depth(broker) == 4
    assert broker.take_records() == [], "a duplicate journals nothing"
    assert ns(drain(broker)) == ["0", "1", "2", "3"]


def test_a_half_seen_batch_routes_only_its_new_messages_in_order():
    broker = make()
    batch(broker, numbered(2), persistent="true")  # d0, d1
    broker.take_records()
    mixed = [numbered(1, 0)[0], numbered(1, 2)[0], numbered(1, 1)[0], numbered(1, 3)[0]]
    assert batch(broker, mixed, persistent="true").admission is Admission.ACCEPTED
    assert broker.stats["duplicates"] == 2
    written = broker.take_records()
    assert [r[1].headers["n"] for r in kinds(written, rec.ADD)] == ["2", "3"]
    assert [r[2] for r in kinds(written, rec.DUP)] == ["d2", "d3"]
    assert ns(drain(broker)) == ["0", "1", "2", "3"]


def test_a_dup_id_twice_in_one_batch_is_taken_once():
    broker = make()
    records: Records = [({"dup-id": "x"}, b"first"), ({"dup-id": "x"}, b"second"),
                        ({}, b"third")]
    batch(broker, records)
    assert [m.body for m in drain(broker)] == [b"first", b"third"]
    assert broker.stats["duplicates"] == 1


# ----------------------------------------------------------------------------- full


def full_broker(policy: AddressFullPolicy, **settings) -> Broker:
    """/queue/q past its limit (5 persistent messages), records and events taken."""
    broker = make(address_full_policy=policy, max_size_bytes=LIMIT, **settings)
    for i in range(5):
        assert broker.send(1, Q, {**P, "n": f"f{i}"}, BODY, NOW).admission \
            is Admission.ACCEPTED
    assert broker.addresses[Q].full
    broker.take_records()
    broker.take_events()
    return broker


def test_block_holds_a_batch_to_a_full_destination_whole_and_changes_nothing():
    broker = full_broker(AddressFullPolicy.BLOCK)
    address = broker.addresses[Q]
    size, received = address.size, broker.stats["received"]
    outcome = batch(broker, numbered(3), persistent="true")
    assert outcome.admission is Admission.HELD
    assert outcome.cause is Cause.DESTINATION and outcome.address is address
    assert depth(broker) == 5 and address.size == size
    assert broker.stats["received"] == received
    assert broker.take_records() == [], "a held batch journals nothing"
    assert not any(f"d{i}" in address.dups for i in range(3)), "nor remembers its dup-ids"
    assert ns(drain(broker)) == [f"f{i}" for i in range(5)]
    # Room again: the same batch is taken, whole (its dup-ids were never remembered).
    assert batch(broker, numbered(3), persistent="true").admission is Admission.ACCEPTED
    assert broker.stats["received"] == received + 3 and broker.stats["duplicates"] == 0


def test_a_batch_with_one_new_message_is_held_even_if_the_rest_are_duplicates():
    broker = make(address_full_policy=AddressFullPolicy.BLOCK, max_size_bytes=LIMIT)
    batch(broker, numbered(5), persistent="true")  # d0..d4, passing the limit
    assert broker.addresses[Q].full
    broker.take_records()
    outcome = batch(broker, numbered(6), persistent="true")  # d0..d4 seen, d5 new
    assert outcome.admission is Admission.HELD
    assert broker.stats["duplicates"] == 0 and broker.stats["received"] == 5
    assert broker.take_records() == []
    # Only duplicates: answered, even to a full destination (nothing to hold).
    assert batch(broker, numbered(5), persistent="true").admission is Admission.ACCEPTED
    assert broker.stats["duplicates"] == 5 and depth(broker) == 5


def test_fail_refuses_a_batch_to_a_full_destination_whole_naming_it():
    broker = full_broker(AddressFullPolicy.FAIL)
    size = broker.addresses[Q].size
    outcome = batch(broker, numbered(3), persistent="true")
    assert outcome.admission is Admission.FAILED and outcome.cause is Cause.DESTINATION
    assert Q in outcome.reason and str(LIMIT) in outcome.reason
    assert depth(broker) == 5 and broker.addresses[Q].size == size
    assert broker.stats["received"] == 5 and broker.take_records() == []


@pytest.mark.parametrize(("full_policy", "admission"), [
    ("block", Admission.HELD), ("fail", Admission.FAILED)])
def test_a_full_journal_holds_or_refuses_a_persistent_batch_whole(full_policy, admission):
    broker = make(full_policy=full_policy)
    why = "journal is full (200000 bytes)"
    outcome = batch(broker, numbered(3), persistent="true", journal_full=why)
    assert (outcome.admission, outcome.cause) == (admission, Cause.JOURNAL)
    if admission is Admission.FAILED:
        assert outcome.reason.startswith(why)
    assert depth(broker) == 0 and broker.stats["received"] == 0
    assert kinds(broker.take_records(), rec.ADD, rec.DUP) == []


@pytest.mark.parametrize("full_policy", ["block", "fail"])
def test_a_full_journal_takes_a_non_persistent_batch(full_policy):
    broker = make(full_policy=full_policy)
    outcome = batch(broker, numbered(3), journal_full="journal is full")
    assert outcome.admission is Admission.ACCEPTED
    assert ns(drain(broker)) == ["0", "1", "2"]


def test_a_full_journal_holds_a_batch_when_one_record_is_persistent():
    broker = make(full_policy="block")
    records = numbered(3)
    records[1] = ({**records[1][0], "persistent": "true"}, records[1][1])
    outcome = batch(broker, records, journal_full="journal is full")
    assert outcome.admission is Admission.HELD
    assert depth(broker) == 0, "not even the non-persistent ones are taken"


def test_a_batch_that_passes_the_limit_midway_is_taken_whole_like_a_commit():
    broker = make(address_full_policy=AddressFullPolicy.BLOCK, max_size_bytes=LIMIT)
    for i in range(3):
        broker.send(1, Q, {**P, "n": f"f{i}"}, BODY, NOW)
    assert not broker.addresses[Q].full
    outcome = batch(broker, numbered(5), persistent="true")  # the limit falls inside
    assert outcome.admission is Admission.ACCEPTED
    assert broker.stats["received"] == 8 and depth(broker) == 8
    assert broker.addresses[Q].full
    assert [e.kind for e in broker.take_events()] == ["address-full"]
    assert len(kinds(broker.take_records(), rec.ADD)) == 8
    assert batch(broker, numbered(1, 10), persistent="true").admission is Admission.HELD


def test_drop_applies_message_by_message_inside_a_batch():
    broker = make(address_full_policy=AddressFullPolicy.DROP, max_size_bytes=LIMIT)
    assert batch(broker, numbered(8)).admission is Admission.ACCEPTED
    assert broker.stats["dropped"] == 3 and broker.addresses[Q].dropped == 3
    assert ns(drain(broker)) == [str(i) for i in range(5)]


def test_page_sends_the_persistent_messages_past_the_limit_inside_a_batch_to_the_log():
    broker = make(address_full_policy=AddressFullPolicy.PAGE, max_size_bytes=LIMIT)
    assert batch(broker, numbered(8), persistent="true").admission is Admission.ACCEPTED
    added = [r[1] for r in kinds(broker.take_records(), rec.ADD)]
    assert [m.log is not None for m in added] == [False] * 5 + [True] * 3
    broker.subscribe(2, "drain", Q, NOW)
    Pages().serve(broker, NOW)
    assert ns([d.entry.message for d in broker.take_outbox()[2]]) == [str(i) for i in range(8)]


# ----------------------------------------------------------------------------- transactions


def test_a_batch_in_a_transaction_waits_for_commit():
    broker = make()
    broker.subscribe(2, "s", Q, NOW)
    broker.begin(1, "t")
    records: Records = [({"k": "own"}, b"a"), ({}, b"b"), ({}, b"c")]
    outcome = batch(broker, records, transaction="t", persistent="true", k="frame")
    assert outcome.admission is Admission.ACCEPTED
    assert broker.take_outbox().get(2, []) == []
    assert depth(broker) == 0 and broker.stats["received"] == 0
    assert kinds(broker.take_records(), rec.ADD, rec.DUP) == []
    assert broker.commit(1, "t", NOW).admission is Admission.ACCEPTED
    got = [d.entry.message for d in broker.take_outbox()[2]]
    assert [m.body for m in got] == [b"a", b"b", b"c"]
    assert [m.headers["k"] for m in got] == ["own", "frame", "frame"]
    assert all("pairmq-batch" not in m.headers and m.persistent for m in got)
    assert len(kinds(broker.take_records(), rec.ADD)) == 3


def test_an_aborted_transaction_routes_none_of_its_batch():
    broker = make()
    broker.begin(1, "t")
    batch(broker, numbered(3), transaction="t", persistent="true")
    broker.abort(1, "t", NOW)
    assert depth(broker) == 0 and broker.stats["received"] == 0
    assert kinds(broker.take_records(), rec.ADD, rec.DUP) == []
    assert broker.addresses.get(Q) is None or not broker.addresses[Q].dups
    # Its dup-ids were never taken: the same batch outside the transaction is new.
    batch(broker, numbered(3), persistent="true")
    assert broker.stats["duplicates"] == 0 and ns(drain(broker)) == ["0", "1", "2"]


def test_a_commit_holding_a_batch_for_a_full_destination_holds_it_whole():
    broker = full_broker(AddressFullPolicy.BLOCK)
    broker.begin(1, "t")
    batch(broker, numbered(3), transaction="t", persistent="true")
    assert broker.commit(1, "t", NOW).admission is Admission.HELD
    assert depth(broker) == 5 and broker.take_records() == []
    drain(broker)
    assert broker.commit(1, "t", NOW).admission is Admission.ACCEPTED
    assert broker.stats["received"] == 8


# ----------------------------------------------------------------------------- errors


def test_a_dup_id_on_the_frame_is_an_error_and_routes_nothing():
    broker = make()
    with pytest.raises(CoreError, match="dup-id"):
        batch(broker, numbered(2), **{"dup-id": "frame-level"})
    assert depth(broker) == 0 and broker.stats["received"] == 0
    assert kinds(broker.take_records(), rec.ADD, rec.DUP) == []


def test_a_bad_header_in_any_record_refuses_the_batch_before_routing_any():
    broker = make()
    records = numbered(3)
    records[2] = ({"priority": "high"}, b"bad")
    with pytest.raises(CoreError, match="priority"):
        batch(broker, records, persistent="true")
    assert depth(broker) == 0 and broker.stats["received"] == 0
    assert kinds(broker.take_records(), rec.ADD, rec.DUP) == []


def test_a_batch_to_a_reply_queue_that_is_gone_is_an_error():
    broker = make()
    broker.send(2, "/temp-queue/r", {}, b"made", NOW)
    temp = broker.sessions[2].temp_queues["r"]
    reply = temp.address.name
    assert reply.startswith("/reply-queue/")
    batch(broker, numbered(2), destination=reply)
    assert temp.count == 3  # "made" and the batch
    broker.close_session(2, NOW)
    with pytest.raises(CoreError, match="no longer exists"):
        batch(broker, numbered(2, 5), destination=reply)


# ----------------------------------------------------------------------------- streams


def stream_broker() -> Broker:
    broker = Broker(CoreSettings(stream_retention=Retention(max_bytes=0)))
    broker.open_session(1, "1.2")
    return broker


def test_a_batch_to_a_stream_takes_consecutive_offsets():
    broker = stream_broker()
    broker.send(1, S, {"n": "single"}, b"s", NOW)  # offset 0
    records: Records = [({"n": str(i), "dup-id": f"d{i}"}, b"m%d" % i) for i in range(4)]
    assert batch(broker, records, destination=S, k="frame").admission is Admission.ACCEPTED
    log = broker.streams[S]
    assert (log.first, log.next, log.count) == (0, 5, 5)
    broker.subscribe_stream(1, "r", S, {"x-stream-offset": "first"})
    got = [d.entry.message for d in broker.take_outbox()[1]]
    assert [int(m.headers["x-stream-offset"]) for m in got] == [0, 1, 2, 3, 4]
    assert [m.body for m in got] == [b"s", b"m0", b"m1", b"m2", b"m3"]
    assert [m.headers.get("k") for m in got] == [None] + ["frame"] * 4
    assert all("pairmq-batch" not in m.headers for m in got)
    assert [r[1].headers["x-stream-offset"] for r in kinds(broker.take_records(), rec.ADD)] \
        == ["0", "1", "2", "3", "4"]


def test_duplicates_in_a_stream_batch_take_no_offset():
    broker = stream_broker()
    batch(broker, [({"dup-id": "a"}, b"a")], destination=S)
    records: Records = [({"dup-id": "a"}, b"a"), ({"dup-id": "b"}, b"b"),
                        ({"dup-id": "b"}, b"b"), ({"dup-id": "c"}, b"c")]
    batch(broker, records, destination=S)
    log = broker.streams[S]
    assert log.next == 3 and broker.stats["duplicates"] == 2
    assert [log.at(i).body for i in range(3)] == [b"a", b"b", b"c"]  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- dup cache


def ids(records: Records) -> list[str]:
    return [own["dup-id"] for own, _ in records]


def one(dup_id: str) -> Records:
    return [({"dup-id": dup_id}, dup_id.encode())]


def test_the_dup_cache_forgets_the_oldest_first_through_batches():
    broker = make(dup_cache_size=3)
    journal: list[tuple] = []
    batch(broker, one("a") + one("b"), persistent="true")
    batch(broker, one("c") + one("d") + one("e"), persistent="true")
    dups = broker.addresses[Q].dups
    assert list(dups) == ["c", "d", "e"]
    journal += broker.take_records()
    assert [r[2] for r in kinds(journal, rec.DUP_EVICT)] == ["a", "b"]
    # A forgotten id is new again (and goes in last); a remembered one is still answered,
    # without moving up.
    batch(broker, one("a") + one("e"), persistent="true")
    assert broker.stats["duplicates"] == 1
    assert [m.body for m in drain(broker)][-1:] == [b"a"]
    assert list(dups) == ["d", "e", "a"]
    journal += broker.take_records()
    assert [r[2] for r in kinds(journal, rec.DUP_EVICT)] == ["a", "b", "c"]
    assert broker.stats["received"] == 6


def test_a_broker_rebuilt_from_the_records_keeps_the_dup_cache_and_its_order():
    broker = make(dup_cache_size=3)
    journal: list[tuple] = []
    for records in (one("a") + one("b") + one("c"), one("d") + one("a") + one("e"),
                    one("b") + one("e")):
        batch(broker, records, persistent="true")
        journal += broker.take_records()
    kept = list(broker.addresses[Q].dups)
    assert kept == ["a", "e", "b"]
    replay = replayed(journal, dup_cache_size=3)
    assert list(replay.dups[Q]) == kept
    again = Broker(broker.settings)
    again.restore(replay)
    assert list(again.addresses[Q].dups) == kept
    again.open_session(1, "1.2")
    # The same ids are duplicates, and the next one evicts the same oldest id in both.
    batch(again, one("e") + one("a") + one("b"), persistent="true")
    assert again.stats["duplicates"] == 3 and again.stats["received"] == 0
    batch(again, one("c"), persistent="true")
    batch(broker, one("c"), persistent="true")
    assert list(again.addresses[Q].dups) == list(broker.addresses[Q].dups) == ["e", "b", "c"]
    assert [r[2] for r in kinds(again.take_records(), rec.DUP_EVICT)] == ["a"]


# ----------------------------------------------------------------------------- in slices


def test_a_big_batch_is_routed_a_slice_at_a_time_and_its_numbers_taken_as_it_goes():
    """The server routes a batch of more than a slice over several turns (a turn stays
    short); what another connection resends meanwhile is not routed twice."""
    broker = make()
    records: Records = [({"n": str(i)}, b"m") for i in range(10)]
    headers = frame(10, **{"persistent": "true", "pairmq-producer": "p", "pairmq-seq": "0"})
    outcome = broker.send_batch(1, Q, headers, records, NOW, slice_size=4)
    assert outcome.admission is Admission.ACCEPTED and broker.batch_open(1)
    assert ns(drain(broker)) == ["0", "1", "2", "3"]
    # meanwhile the producer, failed over, resends numbers 0 to 5 on another connection
    again = frame(6, **{"persistent": "true", "pairmq-producer": "p", "pairmq-seq": "0"})
    broker.send_batch(2, Q, again, records[:6], NOW)
    # 4 and 5 were taken from the other connection: skipped; 6 to 9 routed, and done
    assert broker.continue_batch(1, 4, NOW) and not broker.batch_open(1)
    assert ns(drain(broker)) == ["4", "5", "6", "7", "8", "9"]
    assert broker.addresses[Q].producers.get("p").seq == 9
