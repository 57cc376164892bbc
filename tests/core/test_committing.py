"""A COMMIT too large for one turn is applied in slices (core/broker/committing.py): staged, then
decided, then routed a slice per `step_commits`, each slice's records journaled with a
marker; never a message of an undecided one visible; one held or refused like a one-turn
COMMIT, with its transaction left open; one whose connection closes either dropped
(undecided) or finished without it (decided)."""

from __future__ import annotations

from pairmq.core import Broker, CoreSettings
from pairmq.core import records as rec
from pairmq.core.admission import Admission
from pairmq.core.broker.committing import COMMIT_SLICE, STAGE_SLICE
from pairmq.core.commit_ledger import ROUTED, CommitLedger, CommitPhase
from pairmq.core.session import PendingSend

NOW = 1_000_000
N = 2 * STAGE_SLICE + 10  # three slices to stage, eleven to route
PERSISTENT = {"persistent": "true"}


def staged(n: int = N, **settings) -> Broker:
    broker = Broker(CoreSettings(**settings))
    broker.open_session(1, "1.2")
    broker.begin(1, "tx")
    for i in range(n):
        broker.send(1, "/queue/q", {**PERSISTENT, "n": str(i)}, b"x", NOW, "tx")
    return broker


def kinds(broker: Broker) -> list[int]:
    return [r[0] for r in broker.take_records()]


def test_a_large_commit_is_staged_decided_then_routed_a_slice_per_step() -> None:
    broker = staged()
    broker.commit(1, "tx", NOW)
    assert broker.commit_open(1) and "tx" in broker.sessions[1].txs
    assert broker.queues.get("/queue/q") is None, "nothing routed at COMMIT"
    for _ in range(2):
        assert broker.step_commits(NOW, None) == ([], STAGE_SLICE, 0)
        assert kinds(broker) == [rec.TX_SEND] * STAGE_SLICE
    assert broker.step_commits(NOW, None) == ([], 10, 0)
    assert kinds(broker) == [rec.TX_SEND] * 10 + [rec.TX_END], "decided with its last slice"
    assert "tx" not in broker.sessions[1].txs
    q = broker.queues.get("/queue/q")
    assert q is None or q.count == 0, "nothing visible before it is routed"
    steps = 0
    while broker.commit_open(1):
        finished, _, routed = broker.step_commits(NOW, None)
        records = kinds(broker)
        assert routed == min(COMMIT_SLICE, N - COMMIT_SLICE * steps)
        steps += 1
        assert records.count(rec.ADD) <= COMMIT_SLICE and records[-1] == rec.TX_DONE
    assert steps == -(-N // COMMIT_SLICE)
    assert all(send is ROUTED for send in finished[0].sends), "routed sends' bodies freed"
    assert [run.phase for run in finished] == [CommitPhase.DONE]
    bodies = [e.message.headers["n"] for e in broker.queues["/queue/q"].entries()]
    assert bodies == [str(i) for i in range(N)], "all of it, once, in order"


def test_a_commit_of_a_slice_or_less_is_applied_at_once() -> None:
    broker = staged(COMMIT_SLICE)
    broker.commit(1, "tx", NOW)
    assert not broker.commit_open(1) and broker.queues["/queue/q"].count == COMMIT_SLICE
    assert rec.TX_SEND not in kinds(broker), "one atomic record, no marker"


def test_acks_of_the_transaction_are_applied_with_its_decision() -> None:
    broker = staged(0)
    broker.send(1, "/queue/in", PERSISTENT, b"to ack", NOW)
    broker.subscribe(1, "s", "/queue/in", NOW, ack="client-individual")
    (delivery,) = broker.take_outbox()[1]
    broker.ack(1, delivery.ack_id, NOW, transaction="tx")
    for i in range(COMMIT_SLICE + 1):
        broker.send(1, "/queue/q", PERSISTENT, b"%d" % i, NOW, "tx")
    broker.take_records()
    broker.commit(1, "tx", NOW)
    broker.step_commits(NOW, None)
    records = broker.take_records()
    end = [r[0] for r in records].index(rec.TX_END)
    assert rec.DEL in [r[0] for r in records[end:]], "the ACK goes with TX_END"
    assert broker.queues["/queue/in"].count == 0


def test_a_commit_held_while_staging_is_dropped_and_its_transaction_stays_open() -> None:
    broker2 = staged(STAGE_SLICE + 1, full_policy="block")
    broker2.commit(1, "tx", NOW)
    assert broker2.step_commits(NOW, None).finished == []
    broker2.take_records()
    broker2.set_disk_usage(99.0)  # the server is full now: persistent messages are held
    (run,) = broker2.step_commits(NOW, None).finished
    assert run.phase is CommitPhase.DROPPED and run.outcome.admission is Admission.HELD
    assert [r[0] for r in broker2.take_records()] == [rec.TX_DROP]
    assert "tx" in broker2.sessions[1].txs and not broker2.commit_open(1)


def test_a_closed_connection_drops_a_staging_commit_and_leaves_a_decided_one_going() -> None:
    broker = staged()
    broker.commit(1, "tx", NOW)
    broker.step_commits(NOW, None)
    broker.take_records()
    broker.close_session(1, NOW)
    assert not broker.commits.runs and [r[0] for r in broker.take_records()] == [rec.TX_DROP]
    assert broker.capacity.memory == 0, "its staged bytes are given back"

    broker = staged()
    broker.commit(1, "tx", NOW)
    for _ in range(4):
        broker.step_commits(NOW, None)  # decided, one slice routed
    broker.close_session(1, NOW)
    (run,) = broker.commits.runs.values()
    assert run.conn_id is None and run.phase is CommitPhase.ROUTING
    while broker.commits.runs:
        broker.step_commits(NOW, None)
    assert broker.queues["/queue/q"].count == N


def test_the_ledger_reads_a_journal_as_recovery_does() -> None:
    ledger = CommitLedger()
    for i in range(3):
        ledger.staged(7, PendingSend("/queue/q", {}, b"%d" % i), segment=4)
        ledger.staged(9, PendingSend("/queue/q", {}, b"u"), segment=5)
    assert ledger.holds(4) and ledger.holds(5) and not ledger.holds(6)
    ledger.decided(7, 3)
    ledger.done(7, 1)
    undecided = ledger.settle()
    assert [r.key for r in undecided] == [9]
    (run,) = ledger.runs.values()
    assert (run.key, run.phase, run.routed) == (7, CommitPhase.ROUTING, 1)
    ledger.done(7, 3)
    assert not ledger.runs and not ledger.holds(4)
    ledger.decided(11, 5)  # its TX_SEND entries were deleted (it was done): nothing to do
    ledger.staged(12, PendingSend("/queue/q", {}, b""), segment=8)
    ledger.decided(12, 2)  # a first TX_SEND gone: done long ago
    assert not ledger.runs
    assert ledger.next_key(0) == 13 and ledger.next_key(100) == 100


def test_sends_to_a_temporary_queue_gone_with_its_connection_are_dropped_and_counted() -> None:
    broker = Broker(CoreSettings())
    broker.open_session(1, "1.2")
    broker.begin(1, "tx")
    for i in range(COMMIT_SLICE + 1):
        broker.send(1, "/queue/q" if i % 2 else "/temp-queue/mine", PERSISTENT, b"x", NOW, "tx")
    broker.commit(1, "tx", NOW)
    broker.step_commits(NOW, None)  # decided
    broker.close_session(1, NOW)  # its temporary queue goes with it
    while broker.commits.runs:
        broker.step_commits(NOW, None)
    assert broker.queues["/queue/q"].count == COMMIT_SLICE // 2
    assert broker.stats["dropped"] == COMMIT_SLICE // 2 + 1, "counted, not lost silently"
