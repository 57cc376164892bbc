"""What happens to a SEND when its destination or the server is full: the decision is pure
core (no I/O), so every policy and guard is checked here command by command."""

from __future__ import annotations

import pytest

from pairmq.core import Broker, CoreError, CoreSettings
from pairmq.core import records as rec
from pairmq.core.admission import Admission, Cause, decide
from pairmq.core.capacity import INDEX_BYTES, Shortage
from pairmq.core.replay import Replay
from pairmq.core.settings import (
    AddressFullPolicy,
    DestinationOverride,
    pattern_problem,
    sorted_overrides,
)
from tests.support.pages import Pages

NOW = 1_000_000
P = {"persistent": "true"}
BODY = b"x" * 1000  # about 1,100 bytes counted, with headers and bookkeeping
LIMIT = 5000  # the 5th message passes it


def make(policy: AddressFullPolicy, **settings) -> Broker:
    settings.setdefault("max_size_bytes", LIMIT)
    broker = Broker(CoreSettings(address_full_policy=policy, **settings))
    for conn in (1, 2):
        broker.open_session(conn, "1.2")
    return broker


def fill(broker: Broker, destination: str = "/queue/q", count: int = 5,
         headers: dict[str, str] | None = None) -> list[Admission]:
    return [broker.send(1, destination, dict(headers or P, **{"n": str(i)}), BODY, NOW).admission
            for i in range(count)]


def drain(broker: Broker, destination: str = "/queue/q") -> list[str]:
    """What the destination holds, in delivery order, paged messages read back as the
    store would (tests/support/pages.py)."""
    broker.subscribe(2, "drain", destination, NOW)
    Pages().serve(broker, NOW)
    return [d.entry.message.headers.get("n", "") for d in broker.take_outbox().get(2, [])]


# ----------------------------------------------------------------------------- decide


@pytest.mark.parametrize("policy", list(AddressFullPolicy))
def test_a_duplicate_is_never_held_refused_or_dropped(policy):
    for shortages in (frozenset(), frozenset(Shortage)):
        for full_policy in ("block", "fail"):
            assert decide(duplicate=True, persistent=True, pageable=True, destination_full=True,
                          policy=policy, shortages=shortages, full_policy=full_policy) \
                == (Admission.DUPLICATE, Cause.NONE)


@pytest.mark.parametrize(("policy", "persistent", "pageable", "expected"), [
    (AddressFullPolicy.PAGE, True, True, Admission.PAGED),
    (AddressFullPolicy.PAGE, True, False, Admission.ACCEPTED),  # e.g. a non-durable subscriber
    (AddressFullPolicy.PAGE, False, False, Admission.ACCEPTED),  # counts against the budget
    (AddressFullPolicy.BLOCK, True, True, Admission.HELD),
    (AddressFullPolicy.FAIL, False, False, Admission.FAILED),
    (AddressFullPolicy.DROP, True, True, Admission.DROPPED),
])
def test_a_full_destination_applies_its_policy(policy, persistent, pageable, expected):
    assert decide(duplicate=False, persistent=persistent, pageable=pageable,
                  destination_full=True, policy=policy, shortages=frozenset(),
                  full_policy="fail") == (expected, Cause.DESTINATION)
    assert decide(duplicate=False, persistent=persistent, pageable=pageable,
                  destination_full=False, policy=policy, shortages=frozenset(),
                  full_policy="fail") == (Admission.ACCEPTED, Cause.NONE)


@pytest.mark.parametrize(("shortage", "persistent", "expected"), [
    (Shortage.MEMORY, False, Cause.MEMORY),  # memory: every message
    (Shortage.MEMORY, True, Cause.MEMORY),
    (Shortage.DISK, True, Cause.DISK),  # disk and journal: only what goes to disk
    (Shortage.DISK, False, Cause.NONE),
    (Shortage.JOURNAL, True, Cause.JOURNAL),
    (Shortage.JOURNAL, False, Cause.NONE),
])
def test_server_wide_shortages_hold_or_refuse_what_they_concern(shortage, persistent, expected):
    for full_policy, admission in (("block", Admission.HELD), ("fail", Admission.FAILED)):
        got = decide(duplicate=False, persistent=persistent, pageable=persistent,
                     destination_full=False, policy=AddressFullPolicy.PAGE,
                     shortages=frozenset({shortage}), full_policy=full_policy)
        assert got == ((admission, expected) if expected is not Cause.NONE
                       else (Admission.ACCEPTED, Cause.NONE))


# ----------------------------------------------------------------------------- policies


def test_page_sends_persistent_messages_past_the_limit_to_the_log_in_order():
    broker = make(AddressFullPolicy.PAGE)
    assert fill(broker, count=8) == [Admission.ACCEPTED] * 5 + [Admission.PAGED] * 3
    added = [r[1] for r in broker.take_records() if r[0] == rec.ADD]
    assert [m.log is not None for m in added] == [False] * 5 + [True] * 3
    q = broker.queues["/queue/q"]
    assert (q.count, broker.paged_waiting(q)) == (5, 3)
    # Non-persistent ones cannot be paged: they are taken into memory, never held, and
    # come out before the paged ones (only the journal holds those).
    assert fill(broker, count=2, headers={"x": "np"}) == [Admission.ACCEPTED] * 2
    assert [e.kind for e in broker.take_events()] == ["address-full"]
    assert drain(broker) == [str(i) for i in range(5)] + ["0", "1"] + ["5", "6", "7"]


def test_block_holds_without_changing_anything():
    broker = make(AddressFullPolicy.BLOCK)
    assert fill(broker) == [Admission.ACCEPTED] * 5  # the 5th passes the limit: taken
    broker.take_records()
    outcome = broker.send(1, "/queue/q", {**P, "dup-id": "d1"}, BODY, NOW)
    assert outcome.admission is Admission.HELD and outcome.address is broker.addresses["/queue/q"]
    assert broker.take_records() == [], "a held SEND journals nothing"
    assert "d1" not in broker.addresses["/queue/q"].dups, "nor remembers its dup-id"
    drain(broker)
    assert [e.kind for e in broker.take_events()] == ["address-full", "address-resumed"]
    assert broker.send(1, "/queue/q", {**P, "dup-id": "d1"}, BODY, NOW).admission \
        is Admission.ACCEPTED


def test_a_full_destination_resumes_only_below_90_percent_of_its_limit():
    broker = make(AddressFullPolicy.BLOCK)
    small = b"y" * 100
    sizes = 0
    while broker.send(1, "/queue/q", {}, small, NOW).admission is Admission.ACCEPTED:
        sizes = broker.addresses["/queue/q"].size
    each = sizes // broker.stats["received"]
    assert sizes > LIMIT
    broker.subscribe(2, "s", "/queue/q", NOW, ack="client-individual", prefetch=1)
    broker.take_events()
    acked = 0
    while broker.take_events() == []:
        (delivery,) = broker.take_outbox()[2]
        broker.ack(2, delivery.ack_id, NOW)
        acked += 1
        held = broker.addresses["/queue/q"].size
        if held > LIMIT * 0.9:
            assert broker.send(1, "/queue/q", {}, small, NOW).admission is Admission.HELD
    assert held <= LIMIT * 0.9 < held + each, "resumed at the first ack under 90%"


def test_fail_refuses_naming_the_destination_and_its_limit():
    broker = make(AddressFullPolicy.FAIL)
    fill(broker)
    outcome = broker.send(1, "/queue/q", P, BODY, NOW)
    assert outcome.admission is Admission.FAILED
    assert "/queue/q" in outcome.reason and str(LIMIT) in outcome.reason
    assert "fail" in outcome.reason


def test_drop_discards_counts_and_reports_the_count_when_it_resumes():
    broker = make(AddressFullPolicy.DROP)
    assert fill(broker, count=8) == [Admission.ACCEPTED] * 5 + [Admission.DROPPED] * 3
    assert broker.stats["dropped"] == 3 and broker.addresses["/queue/q"].dropped == 3
    assert drain(broker) == [str(i) for i in range(5)]
    resumed = [e for e in broker.take_events() if e.kind == "address-resumed"]
    assert len(resumed) == 1 and "3 messages were dropped" in resumed[0].detail


@pytest.mark.parametrize("policy", list(AddressFullPolicy))
def test_duplicates_of_a_full_destination_are_answered_and_count_nothing(policy):
    broker = make(policy)
    fill(broker, headers={**P, "dup-id": "x"}, count=1)
    fill(broker, count=6)
    size = broker.addresses["/queue/q"].size
    records = broker.take_records()
    assert records
    for _ in range(3):
        assert broker.send(1, "/queue/q", {**P, "dup-id": "x"}, BODY, NOW).admission \
            is Admission.DUPLICATE
    assert broker.addresses["/queue/q"].size == size
    assert broker.take_records() == []
    assert broker.stats["duplicates"] == 3


def test_transactions_are_decided_at_commit_as_a_whole():
    broker = make(AddressFullPolicy.BLOCK)
    broker.begin(1, "t")
    for _ in range(3):
        broker.send(1, "/queue/q", P, BODY, NOW, transaction="t")
    fill(broker, count=4)  # not full yet: the COMMIT is taken whole, past the limit
    assert broker.commit(1, "t", NOW).admission is Admission.ACCEPTED
    assert broker.stats["received"] == 7 and broker.addresses["/queue/q"].full
    broker.begin(1, "t2")
    broker.send(1, "/queue/q", P, BODY, NOW, transaction="t2")
    held = broker.commit(1, "t2", NOW)
    assert held.admission is Admission.HELD and held.address is broker.addresses["/queue/q"]
    assert "t2" in broker.sessions[1].txs, "a held COMMIT is left open, to be decided again"
    drain(broker)
    assert broker.commit(1, "t2", NOW).admission is Admission.ACCEPTED


def test_a_commit_under_drop_drops_message_by_message():
    broker = make(AddressFullPolicy.DROP)
    broker.begin(1, "t")
    for i in range(7):
        broker.send(1, "/queue/q", {"n": str(i)}, BODY, NOW, transaction="t")
    assert broker.commit(1, "t", NOW).admission is Admission.ACCEPTED
    assert broker.stats["dropped"] == 2
    assert drain(broker) == [str(i) for i in range(5)]


def test_a_destination_recovered_past_its_limit_is_full():
    source = make(AddressFullPolicy.BLOCK)
    fill(source, count=6)
    replay = Replay()
    for record in source.take_records():
        if record[0] == rec.ADD:
            replay.add(record[1], record[2], 0)
    restored = Broker(CoreSettings(max_size_bytes=LIMIT,
                                   address_full_policy=AddressFullPolicy.BLOCK))
    restored.restore(replay)
    assert restored.addresses["/queue/q"].full
    assert [e.kind for e in restored.take_events()] == ["address-full"]
    restored.open_session(1, "1.2")
    assert fill(restored, count=1) == [Admission.HELD]


# ----------------------------------------------------------------------------- server guards


def fill_memory(broker: Broker) -> int:
    """Non-persistent SENDs to /queue/a until the memory guard trips; returns how many."""
    for sent in range(1, 100):
        assert broker.send(1, "/queue/a", {}, BODY, NOW).admission is Admission.ACCEPTED
        if broker.events:
            return sent
    raise AssertionError("the memory guard never tripped")


def test_memory_guard_holds_every_send_until_consumers_or_paging_make_room():
    broker = make(AddressFullPolicy.PAGE, global_max_size_bytes=8000, full_policy="block",
                  max_size_bytes=0)
    sent = fill_memory(broker)
    capacity = broker.capacity
    # Each message counts its size and its index (the objects that hold it in memory).
    held = sum(a.size for a in broker.addresses.values())
    assert capacity.memory == held + sent * INDEX_BYTES > 8000
    assert capacity.memory - 1700 <= 8000
    assert [e.kind for e in broker.take_events()] == ["server-full"]
    assert capacity.shortages == {Shortage.MEMORY}
    for destination, headers in (("/queue/b", {}), ("/queue/c", P)):
        outcome = broker.send(1, destination, headers, BODY, NOW)
        assert (outcome.admission, outcome.cause) == (Admission.HELD, Cause.MEMORY)
    # The store paging bodies out counts as room (only the index stays in memory).
    broker.set_paged_bytes(3000)
    assert [e.kind for e in broker.take_events()] == ["server-resumed"]
    assert broker.send(1, "/queue/b", {}, BODY, NOW).admission is Admission.ACCEPTED


def test_memory_guard_fails_with_a_reason_naming_the_setting():
    broker = make(AddressFullPolicy.PAGE, global_max_size_bytes=4000, full_policy="fail",
                  max_size_bytes=0)
    fill_memory(broker)
    outcome = broker.send(1, "/queue/b", {}, BODY, NOW)
    assert outcome.admission is Admission.FAILED and "global_max_size_bytes" in outcome.reason
    broker.subscribe(2, "s", "/queue/a", NOW)
    assert [e.kind for e in broker.take_events()] == ["server-full", "server-resumed"]


def test_disk_guard_concerns_persistent_messages_only():
    broker = make(AddressFullPolicy.PAGE, max_disk_usage=80, full_policy="fail")
    broker.set_disk_usage(79.9)
    assert broker.take_events() == []
    broker.set_disk_usage(80.0)
    (event,) = broker.take_events()
    assert event.kind == "server-full" and "max_disk_usage (80%)" in event.detail
    refused = broker.send(1, "/queue/q", P, BODY, NOW)
    assert refused.admission is Admission.FAILED and "80%" in refused.reason
    assert broker.send(1, "/queue/q", {}, BODY, NOW).admission is Admission.ACCEPTED
    broker.set_disk_usage(50)
    assert [e.kind for e in broker.take_events()] == ["server-resumed"]
    assert broker.send(1, "/queue/q", P, BODY, NOW).admission is Admission.ACCEPTED


def test_max_disk_usage_100_never_trips():
    broker = make(AddressFullPolicy.PAGE, max_disk_usage=100)
    broker.set_disk_usage(100.0)
    assert broker.take_events() == [] and not broker.capacity.shortages


def test_a_full_journal_refuses_persistent_sends_but_answers_duplicates():
    broker = make(AddressFullPolicy.PAGE, full_policy="fail")
    fill(broker, headers={**P, "dup-id": "known"}, count=1)
    why = "journal is full (200000 bytes)"
    refused = broker.send(1, "/queue/q", P, BODY, NOW, journal_full=why)
    assert refused.admission is Admission.FAILED and refused.reason.startswith(why)
    assert broker.send(1, "/queue/q", {**P, "dup-id": "known"}, BODY, NOW,
                       journal_full=why).admission is Admission.DUPLICATE
    assert broker.send(1, "/queue/q", {}, BODY, NOW, journal_full=why).admission \
        is Admission.ACCEPTED


# ----------------------------------------------------------------------------- overrides


def overrides(*items: DestinationOverride) -> tuple[DestinationOverride, ...]:
    return sorted_overrides(list(items))


def test_the_most_specific_override_wins_key_by_key():
    settings = CoreSettings(max_size_bytes=100, overrides=overrides(
        DestinationOverride("/queue/#", AddressFullPolicy.BLOCK, None),
        DestinationOverride("/queue/orders.*", None, 500),
        DestinationOverride("/queue/orders.eu", AddressFullPolicy.FAIL, None),
        DestinationOverride("/topic/prices.#", AddressFullPolicy.DROP, 0),
    ))
    rule = settings.rule_for
    assert (rule("/queue/orders.eu").policy, rule("/queue/orders.eu").max_size_bytes) \
        == (AddressFullPolicy.FAIL, 500)
    assert (rule("/queue/orders.us").policy, rule("/queue/orders.us").max_size_bytes) \
        == (AddressFullPolicy.BLOCK, 500)
    assert rule("/queue/orders").max_size_bytes == 100  # * is exactly one word
    assert rule("/queue/orders.eu.x").max_size_bytes == 100
    assert rule("/topic/prices").policy is AddressFullPolicy.DROP  # # may be no word at all
    assert rule("/topic/prices.fx.eur").max_size_bytes == 0
    assert rule("/topic/other").policy is AddressFullPolicy.PAGE
    assert rule("/queue/prices.fx").policy is AddressFullPolicy.BLOCK  # kinds never mix


def test_the_broker_applies_overrides_per_destination():
    broker = Broker(CoreSettings(max_size_bytes=LIMIT, overrides=overrides(
        DestinationOverride("/queue/strict.*", AddressFullPolicy.FAIL, 2000))))
    broker.open_session(1, "1.2")
    assert fill(broker, "/queue/strict.a", 3) == [Admission.ACCEPTED] * 2 + [Admission.FAILED]
    assert fill(broker, "/queue/lenient", 8)[-1] is Admission.PAGED


@pytest.mark.parametrize(("pattern", "problem"), [
    ("orders", "must start with /queue/ or /topic/"),
    ("/queue/", "no name after"),
    ("/queue/orders*", "inside a word"),
    ("/topic/a..b", "empty word"),
    ("/queue/a.", "empty word"),
])
def test_bad_patterns_are_explained(pattern, problem):
    found = pattern_problem(pattern)
    assert found is not None and problem in found


def test_unknown_destinations_still_raise_core_errors():
    broker = make(AddressFullPolicy.PAGE)
    with pytest.raises(CoreError, match="unknown destination"):
        broker.send(1, "/exchange/x", P, BODY, NOW)
