"""The pair's lease on etcd (ha/etcd_lease.py), pure logic: `LeaseSession`s against one
key that only a compare-and-swap on its mod_revision changes, time as a number."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pairmq.ha.etcd_lease import (
    LeaseSession,
    Next,
    Record,
    RecordError,
    Stage,
    fingerprint,
    record_key,
)
from pairmq.ha.lease import DRIFT

GROUP = "orders"
PAIR = fingerprint(GROUP, "secret")
A, B = "a#1", "b#1"


class Key:
    """One etcd key, linearizable: its value and mod_revision."""

    def __init__(self) -> None:
        self.raw: bytes | None = None
        self.revision = 0

    def txn(self, compare: int, value: bytes) -> tuple[bool, bytes | None, int]:
        """If mod_revision == compare put value (True, new revision), else read it."""
        if compare != self.revision:
            return False, self.raw, self.revision
        self.raw = value
        self.revision += 1
        return True, None, self.revision

    @property
    def record(self) -> Record | None:
        return None if self.raw is None else Record.from_bytes(self.raw, "k")


def step(session: LeaseSession, key: Key, nxt: Next, now: float) -> Next:
    """Carry out one step the session asked for, its answer arriving at `now`."""
    if nxt.stage is Stage.READ:
        return session.read(key.raw, key.revision, now)
    ok, raw, revision = key.txn(nxt.compare, nxt.value)
    return session.wrote(revision, now) if ok else session.write_failed(raw, revision, now)


def ask(session: LeaseSession, key: Key, request: dict[str, Any], now: float) -> dict[str, Any]:
    nxt = session.begin(request, now)
    while nxt.stage is not Stage.DONE:
        nxt = step(session, key, nxt, now)
    assert nxt.reply is not None
    return nxt.reply


class Server:
    """A server's requests, numbered as ha/witness_queue.py numbers them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.session = LeaseSession(GROUP, PAIR)
        self.sent = 0

    def request(self, op: str, epoch: int, ms: int = 1000, **fields: Any) -> dict[str, Any]:
        self.sent += 1
        return {"op": op, "name": self.name, "order": [1, self.sent], "epoch": epoch,
                "ms": ms, **fields}


def test_two_sessions_racing_for_one_revision_one_wins() -> None:
    key, a, b = Key(), Server(A), Server(B)
    next_a = a.session.begin(a.request("activate", 1), 0.0)
    next_b = b.session.begin(b.request("activate", 2), 0.0)
    next_a = step(a.session, key, next_a, 0.0)
    next_b = step(b.session, key, next_b, 0.0)
    assert next_a.stage is next_b.stage is Stage.WRITE and next_a.compare == next_b.compare == 0
    done_a = step(a.session, key, next_a, 0.01)
    done_b = step(b.session, key, next_b, 0.01)  # compared with revision 0: fails, reads
    assert done_a.reply is not None and done_a.reply["granted"]
    assert done_b.reply is not None and not done_b.reply["granted"]
    assert done_b.reply["holder"] == A and "holds the lease" in done_b.reply["reason"]
    assert key.revision == 1 and key.record is not None and key.record.holder == A


def test_a_late_commit_cannot_undo_a_newer_record() -> None:
    key, a, b = Key(), Server(A), Server(B)
    assert ask(a.session, key, a.request("activate", 1), 0.0)["granted"]
    assert ask(a.session, key, a.request("renew", 1, standby=B), 0.1)["granted"]
    late = a.session.begin(a.request("renew", 1, standby=B), 0.5)
    assert late.stage is Stage.WRITE  # sent; its answer never comes, A stops renewing
    assert ask(b.session, key, b.request("query", 0), 1.0)["holder"] == A
    taken = ask(b.session, key, b.request("activate", 2), 2.1)  # A's lease ran out
    assert taken["granted"] and key.revision == 3
    ok, _, revision = key.txn(late.compare, late.value)  # the renewal arrives now
    assert not ok and revision == 3
    assert key.record is not None and key.record.holder == B and key.record.epoch == 2


def test_a_holder_renews_with_one_transaction() -> None:
    key, a = Key(), Server(A)
    assert ask(a.session, key, a.request("activate", 1), 0.0)["granted"]
    nxt = a.session.begin(a.request("renew", 1, standby=B), 0.5)
    assert nxt.stage is Stage.WRITE and nxt.compare == key.revision == 1
    done = step(a.session, key, nxt, 0.51)
    assert done.stage is Stage.DONE and done.reply is not None and done.reply["granted"]
    assert key.record is not None and key.record.standby == B and key.revision == 2


def test_a_renewal_on_a_record_changed_under_it_decides_again() -> None:
    key, a = Key(), Server(A)
    assert ask(a.session, key, a.request("activate", 1), 0.0)["granted"]
    other = LeaseSession(GROUP, PAIR)  # A's own earlier renewal, committed late
    ask(other, key, {"op": "renew", "name": A, "order": [1, 5], "epoch": 1, "ms": 1000}, 0.2)
    reply = ask(a.session, key, a.request("renew", 1), 0.5)  # order [1, 2] < [1, 5]
    assert not reply["granted"] and "stale request" in reply["reason"]
    assert key.revision == 2  # nothing written on the strength of a stale request


def test_a_reader_counts_the_lease_from_when_it_first_saw_the_revision() -> None:
    key, a, b = Key(), Server(A), Server(B)
    assert ask(a.session, key, a.request("activate", 1), 0.0)["granted"]
    assert ask(a.session, key, a.request("renew", 1, standby=B), 0.1)["granted"]
    assert ask(b.session, key, b.request("query", 0), 10.0)["remaining_ms"] == 1000
    refused = ask(b.session, key, b.request("activate", 2), 10.9)  # same revision again
    assert not refused["granted"] and refused["remaining_ms"] == pytest.approx(100, abs=1)
    assert ask(b.session, key, b.request("activate", 2), 11.0)["granted"]


def test_a_fresh_session_counts_the_whole_lease_again() -> None:
    key, a, b = Key(), Server(A), Server(B)
    assert ask(a.session, key, a.request("activate", 1), 0.0)["granted"]
    assert ask(b.session, key, b.request("query", 0), 1.0)["remaining_ms"] == 1000
    b.session = LeaseSession(GROUP, PAIR)  # B restarted: what it saw, and when, is gone
    refused = ask(b.session, key, b.request("activate", 2), 1.5)
    assert not refused["granted"] and refused["remaining_ms"] == 1000


def test_a_released_record_lets_the_standby_in_at_once() -> None:
    key, a, b = Key(), Server(A), Server(B)
    assert ask(a.session, key, a.request("activate", 1, ms=60_000), 0.0)["granted"]
    assert ask(a.session, key, a.request("renew", 1, ms=60_000, standby=B), 0.1)["granted"]
    assert ask(b.session, key, b.request("query", 0), 0.2)["remaining_ms"] == 60_000
    released = ask(a.session, key, a.request("release", 1, keep_standby=True), 0.3)
    assert released["granted"] and key.record is not None and key.record.released
    assert ask(b.session, key, b.request("activate", 2), 0.4)["granted"]
    assert key.record.holder == B


def test_a_release_by_another_server_writes_nothing() -> None:
    key, a, b = Key(), Server(A), Server(B)
    assert ask(a.session, key, a.request("activate", 1), 0.0)["granted"]
    ask(b.session, key, b.request("release", 1), 0.1)
    assert key.revision == 1 and key.record is not None and not key.record.released


def test_a_record_of_another_group_is_refused_naming_the_key() -> None:
    key, other = Key(), LeaseSession("billing", fingerprint("billing", "secret"))
    ask(other, key, {"op": "activate", "name": A, "order": [1, 1], "epoch": 1, "ms": 1}, 0.0)
    with pytest.raises(RecordError, match="/pairmq/pairs/orders/lease") as e:
        ask(LeaseSession(GROUP, PAIR), key, {"op": "query", "name": B}, 1.0)
    assert "'billing'" in str(e.value)


def test_a_record_of_another_pair_with_the_same_group_is_refused() -> None:
    key, other = Key(), LeaseSession(GROUP, fingerprint(GROUP, "another secret"))
    ask(other, key, {"op": "activate", "name": A, "order": [1, 1], "epoch": 1, "ms": 1}, 0.0)
    with pytest.raises(RecordError, match=r"/pairmq/pairs/orders/lease belongs to another "
                                          r"pair.*\[ha\] group"):
        ask(LeaseSession(GROUP, PAIR), key, {"op": "query", "name": B}, 1.0)


@pytest.mark.parametrize("raw, words", [
    (json.dumps({"format": 2, "group": GROUP, "pair": PAIR}).encode(),
     "format 2, newer than this server's"),
    (b"not json", "is not a pairmq lease record"),
    (json.dumps({"format": 1, "group": GROUP}).encode(), "is not a pairmq lease record"),
])
def test_a_record_this_server_cannot_read_is_refused_by_name(raw: bytes, words: str) -> None:
    session = LeaseSession(GROUP, PAIR)
    with pytest.raises(RecordError, match=words) as e:
        session.read(raw, 7, 0.0)
    assert record_key(GROUP) in str(e.value)


# ---------------------------------------------------------------- any interleaving

MS = 1000


@dataclass
class Racer:
    """A server of the property test: its session, its request out, its lease."""

    name: str
    session: LeaseSession = field(init=False)
    boot: int = 1
    sent: int = 0
    out: Next | None = None  # the step waiting to be carried out
    cut: bool = False  # cut from etcd: its requests wait
    request: dict[str, Any] = field(default_factory=dict)
    requested_at: float = 0.0
    valid_until: float = 0.0  # ha/lease.py LeaseView: counted from the request, shortened
    epoch: int = 0

    def __post_init__(self) -> None:
        self.session = LeaseSession(GROUP, PAIR)


ACTIONS = st.lists(st.tuples(st.sampled_from([0, 1]),
                             st.sampled_from(["ask"] * 3 + ["step"] * 8
                                             + ["lose", "late", "cut", "restart"]),
                             st.floats(0.0, 0.8)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_no_interleaving_lets_two_servers_hold_the_lease(
        actions: list[tuple[int, str, float]]) -> None:
    """Two servers, any order of reads and transactions, answers lost, transactions
    applied late, restarts, partitions: whenever a write names a new holder, the old holder's lease,
    as it counts it, has ended; epochs never go down."""
    key = Key()
    racers = [Racer(A), Racer(B)]
    late: list[Next] = []  # transactions sent and given up: they may still commit
    now = 0.0
    epoch_seen = 0
    takeovers = 0

    def apply(nxt: Next) -> tuple[bool, bytes | None, int]:
        nonlocal epoch_seen
        before = key.record
        ok, raw, revision = key.txn(nxt.compare, nxt.value)
        if ok:
            record = key.record
            assert record is not None and record.epoch >= epoch_seen
            epoch_seen = record.epoch
            for r in racers:
                if before is not None and r.name == before.holder != record.holder:
                    assert r.valid_until <= now, f"{record.holder} took over {r.name}"
                    nonlocal takeovers
                    takeovers += 1
        return ok, raw, revision

    for who, action, dt in actions:
        now += dt
        r = racers[who]
        if action == "cut":
            r.cut = not r.cut
        elif r.cut and action in ("ask", "step", "lose"):
            pass
        elif action == "ask" and r.out is None:
            seen = r.session.seen  # what this server last saw of the record
            holds = seen is not None and seen.record is not None \
                and seen.record.holder == r.name
            r.sent += 1
            op = "renew" if holds else "activate"
            epoch = r.epoch if holds else max(r.epoch, epoch_seen) + 1
            r.request = {"op": op, "name": r.name, "order": [r.boot, r.sent], "epoch": epoch,
                         "ms": MS, "standby": racers[1 - who].name}  # it may take over
            r.requested_at = now
            r.out = r.session.begin(r.request, now)
        elif action in ("step", "lose") and r.out is not None:
            nxt = r.out
            if nxt.stage is Stage.READ:
                r.out = r.session.read(key.raw, key.revision, now)
            else:
                ok, raw, revision = apply(nxt)
                if action == "lose":
                    r.out = None  # the answer is lost: the server gave up
                    continue
                r.out = r.session.wrote(revision, now) if ok \
                    else r.session.write_failed(raw, revision, now)
        elif action == "late" and r.out is not None:
            if r.out.stage is Stage.WRITE:
                late.append(r.out)  # given up before it arrived
            r.out = None
        elif action == "late" and late:
            apply(late.pop(0))
        elif action == "restart":
            r.session, r.out, r.valid_until = LeaseSession(GROUP, PAIR), None, 0.0
            r.boot, r.sent = r.boot + 1, 0  # ha/witness_queue.py: a new boot orders anew
            continue
        if r.out is not None and r.out.stage is Stage.DONE:
            reply = r.out.reply
            assert reply is not None
            if reply["granted"] and r.request["op"] in ("activate", "renew", "adopt"):
                r.epoch = reply["epoch"]
                r.valid_until = max(r.valid_until,
                                    r.requested_at + MS / 1000 * (1 - DRIFT))
            r.out = None
    event(f"takeovers: {min(takeovers, 3)}")


RENEWALS = st.lists(st.tuples(st.floats(0.05, 0.6),  # after the previous one
                              st.floats(0.0, 0.3),  # until etcd applies it
                              st.sampled_from(["answered", "lost", "late"])),
                    min_size=1, max_size=8)
POLLS = st.lists(st.tuples(st.floats(0.0, 0.3),  # after the previous poll ended
                           st.floats(0.0, 0.1),  # until its read is served
                           st.floats(0.0, 0.1)),  # until its transaction applies
                 min_size=1, max_size=40)


@settings(max_examples=400, deadline=None)
@given(RENEWALS, POLLS)
def test_a_standby_polling_takes_over_only_after_the_holders_lease(
        renewals: list[tuple[float, float, str]],
        polls: list[tuple[float, float, float]]) -> None:
    """The holder renews, then stops (its answers lost or applied late, as over a link
    that broke); its standby asks to take over again and again. The takeover commits
    only after the holder's lease ended as the holder counts it (from each request it
    saw answered, shortened by DRIFT)."""
    key, a, b = Key(), Server(A), Server(B)
    assert ask(a.session, key, a.request("activate", 1), 0.0)["granted"]
    assert ask(a.session, key, a.request("renew", 1, standby=B), 0.0)["granted"]
    valid_until = MS / 1000 * (1 - DRIFT)
    events: list[tuple[float, int, str, Any]] = []
    at = 0.0
    for i, (gap, delay, fate) in enumerate(renewals):
        at += gap
        events.append((at, i, "renew", (delay, fate)))
    events.append((0.0, -1, "poll", 0))
    waiting = False  # the holder waits for an answer: it sends nothing else meanwhile
    while events:
        events.sort(key=lambda e: (e[0], e[1]))
        now, order, what, data = events.pop(0)
        if what == "renew" and not waiting:
            delay, fate = data
            nxt = a.session.begin(a.request("renew", 1, standby=B), now)
            waiting = fate == "answered"  # else it gave up on it: the next one goes out
            if nxt.stage is Stage.WRITE:
                when = now + delay + (2.0 if fate == "late" else 0.0)
                events.append((when, order, "renewal applied", (nxt, now, fate)))
        elif what == "renewal applied":
            nxt, requested_at, fate = data
            ok, raw, revision = key.txn(nxt.compare, nxt.value)
            if fate == "answered":
                nxt = a.session.wrote(revision, now) if ok \
                    else a.session.write_failed(raw, revision, now)
                if nxt.stage is Stage.WRITE:  # decided again on what it found
                    events.append((now, order, "renewal applied", (nxt, requested_at, fate)))
                    continue
                waiting = False
                assert nxt.reply is not None
                if nxt.reply["granted"]:
                    valid_until = max(valid_until, requested_at + MS / 1000 * (1 - DRIFT))
        elif what == "poll" and data < len(polls):
            gap, read_delay, write_delay = polls[data]
            nxt = b.session.begin(b.request("activate", 2), now)
            read_at = now + read_delay
            events.append((read_at, 1000 + data, "poll read", (data, nxt, write_delay)))
        elif what == "poll read":
            index, nxt, write_delay = data
            nxt = b.session.read(key.raw, key.revision, now)
            if nxt.stage is Stage.WRITE:
                events.append((now + write_delay, 1000 + index, "poll write", (index, nxt)))
            else:
                events.append((now + polls[index][0], 1000 + index + 1, "poll", index + 1))
        elif what == "poll write":
            index, nxt = data
            ok, raw, revision = key.txn(nxt.compare, nxt.value)
            if ok:
                assert valid_until <= now, (
                    f"{B} took over at {now:.3f}, {A}'s lease runs until {valid_until:.3f}")
                return
            b.session.write_failed(raw, revision, now)
            events.append((now + polls[index][0], 1000 + index + 1, "poll", index + 1))
