"""A COMMIT applied in slices (a Broker mixin, like core/broker/acking.py), through the
ledger of the commits under way that the journal, recovery and a backup agree on
(core/commit_ledger.py).

A COMMIT of more than COMMIT_SLICE sends would hold the server for its whole length
(about 11-27 µs a message: over a second for 100,000, which lost a pair its lease), so it
is a `CommitRun` the server advances one slice per turn of its event loop
(`step_commits`; server/role/commit_slices.py sizes and paces the slices), through explicit phases:

    STAGING  each slice of its sends is checked (held or refused as a whole, as a one-turn
             COMMIT is) and journaled as TX_SEND entries, which mean nothing yet;
    ROUTING  decided: TX_END is journaled with the transaction's ACKs and NACKs, in one
             record; then each slice is routed as any SEND is, its records journaled with
             TX_DONE (how many are routed), in one record;
    DONE     every send is routed: the COMMIT's RECEIPT goes out once that is confirmed;
    DROPPED  never decided (held or refused, or its connection closed while staging):
             TX_DROP says its TX_SEND entries mean nothing; the transaction is left open.

Why a crash keeps all of it or none (Artemis' model: the sends are journaled before the
commit record, and the commit record decides):
- Before TX_END nothing of it is routed, so nothing of it was delivered; a server that
  starts serving from its journal forgets TX_SEND entries that no TX_END follows (not
  before it serves: a backup restarted in the middle of a COMMIT follows the rest).
- After TX_END, recovery (and a backup taking over) finds the sends not routed yet (those
  after the last TX_DONE) and the server routes them when it serves: every record of a
  routed slice is in the same atomic record as its TX_DONE, so none is routed twice.
- The journal deletes segments oldest first (store/compaction.py), and the segment holding a
  run's first TX_SEND is kept, uncompacted, until the run is DONE or DROPPED
  (`CommitLedger.holds`): whatever of a run a later recovery reads, it reads its TX_DONE
  records whenever it reads its TX_END.

What a consumer sees: the messages of a decided COMMIT appear a slice at a time, as they
would from a producer sending them one by one (Artemis adds a transaction's messages to
their queues after its commit record, too); never a message of an undecided one.
"""

from __future__ import annotations

import logging
from typing import Final

from pairmq.core import records as rec
from pairmq.core.admission import ACCEPTED, Admission, Cause, Outcome
from pairmq.core.broker.follow import Follow
from pairmq.core.commit_ledger import ROUTED, CommitPhase, CommitRun, CommitStep, staged_bytes
from pairmq.core.destinations import REPLY, TEMP, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.session import Session, Transaction

log = logging.getLogger("pairmq.core")

COMMIT_SLICE: Final = 1_000  # a COMMIT of at most this many is applied in one turn, in one record
#                       (about 27 ms); and a slice's routed sends, unless told (the server
#                       sizes its slices by time: server/role/commit_slices.py)
STAGE_SLICE: Final = 5_000  # sends checked and journaled in a slice, unless told (about 5 µs each)


class Committing(Follow):
    """The Broker's sliced COMMIT (a mixin)."""

    def _begin_run(self, conn_id: int, transaction: str, tx: Transaction, now: int
                   ) -> Outcome:
        """A COMMIT too large for one turn: staged from the next `step_commits` on."""
        if self.commit_open(conn_id):
            raise CoreError("a COMMIT of this connection is still being applied")
        run = CommitRun(self.commits.next_key(now), tx.sends, conn_id, transaction)
        self.commits.runs[run.key] = run
        return ACCEPTED

    def commit_status(self) -> dict[str, int]:
        """The COMMITs under way, for the operator (GET /api/status, /metrics)."""
        runs = self.commits.runs.values()
        return {"under_way": len(runs),
                "staging": sum(1 for r in runs if r.phase is CommitPhase.STAGING),
                "messages_to_route": sum(len(r.sends) - r.routed for r in runs)}

    def commit_open(self, conn_id: int) -> bool:
        """A COMMIT of this connection is being applied (its later frames wait)."""
        return any(run.conn_id == conn_id for run in self.commits.runs.values())

    def step_commits(self, now: int, journal_full: str | None, most: int = COMMIT_SLICE,
                     stage: int = STAGE_SLICE) -> CommitStep:
        """Advance the oldest run by one slice (`stage` sends staged, or `most` routed),
        the next call the next run, in turn."""
        runs = self.commits.runs
        if not runs:
            return CommitStep([], 0, 0)
        run = runs.pop(next(iter(runs)))
        staged, routed = run.staged, run.routed
        if run.phase is CommitPhase.STAGING:
            self._stage_slice(run, stage, now, journal_full)
        else:
            self._route_slice_of(run, most, now, journal_full)
        step = CommitStep([], run.staged - staged, run.routed - routed)
        if run.phase is CommitPhase.DONE or run.phase is CommitPhase.DROPPED:
            step.finished.append(run)
        else:
            runs[run.key] = run  # behind the others: one slice each, in turn
        return step

    def _stage_slice(self, run: CommitRun, most: int, now: int, journal_full: str | None
                     ) -> None:
        session = self.sessions.get(run.conn_id) if run.conn_id is not None else None
        tx = session.txs.get(run.transaction) if session is not None else None
        if session is None or tx is None:  # closed meanwhile (close_session drops it too)
            self._drop(run, Outcome(Admission.FAILED, Cause.NONE, None, "connection closed"))
            return
        chunk = run.sends[run.staged:run.staged + most]
        refused = self._refused(session, chunk, run.transaction, journal_full)
        if refused is not None:  # checked before any of the slice is journaled
            self._drop(run, refused)
            return
        records = self.records
        for pending in chunk:
            records.append((rec.TX_SEND, run, pending))
        run.staged += len(chunk)
        if run.staged == len(run.sends):
            self._decide(run, session, tx, now)

    def _decide(self, run: CommitRun, session: Session, tx: Transaction, now: int) -> None:
        """Every send is journaled: TX_END, with the transaction's ACKs and NACKs."""
        del session.txs[run.transaction]
        run.bytes, tx.bytes = tx.bytes, 0  # still counted: they leave as they are routed
        self.records.append((rec.TX_END, run))
        self._settle_transaction(tx, now)
        run.phase = CommitPhase.ROUTING

    def _route_slice_of(self, run: CommitRun, most: int, now: int,
                        journal_full: str | None) -> None:
        session = self.sessions.get(run.conn_id) if run.conn_id is not None else None
        start = run.routed
        chunk = run.sends[start:start + most]
        released = unroutable = 0
        for pending in chunk:
            released += staged_bytes(pending)
            kind, name = parse_destination(pending.destination)
            if (kind == TEMP and session is None) or (kind == REPLY
                                                      and name not in self.reply_queues):
                unroutable += 1  # a temporary queue died with its connection: no reader
                continue
            self._route(session, pending.destination, kind, name, pending.headers,
                        pending.body, now, journal_full, admitted=True)
        if unroutable:
            self.stats["dropped"] += unroutable
            log.info("%d messages of a COMMIT were dropped: their temporary queues were "
                     "gone with their connections before the COMMIT reached them", unroutable)
        run.routed = start + len(chunk)
        run.sends[start:run.routed] = [ROUTED] * len(chunk)  # their bodies are free now
        self.records.append((rec.TX_DONE, run, run.routed))
        released = min(released, run.bytes)
        if released:
            run.bytes -= released
            self.capacity.memory -= released
            self._server_changed(self.capacity.check_memory())
        if run.routed == len(run.sends):
            run.phase = CommitPhase.DONE

    def _drop(self, run: CommitRun, outcome: Outcome) -> None:
        run.phase = CommitPhase.DROPPED
        run.outcome = outcome
        if run.staged:
            self.records.append((rec.TX_DROP, run))

    def _orphan_run(self, conn_id: int) -> None:
        """The connection is gone (close_session): a run still staging is dropped (its
        transaction is aborted with the session), one routing goes on without it."""
        for run in list(self.commits.runs.values()):
            if run.conn_id != conn_id:
                continue
            if run.phase is CommitPhase.STAGING:
                del self.commits.runs[run.key]
                self._drop(run, Outcome(Admission.FAILED, Cause.NONE, None,
                                        "connection closed"))
            run.conn_id = None

    def settle_commits(self) -> None:
        """This server serves from here on, with what its journal holds (recovered, or
        followed from the active): undecided runs are forgotten (their server, which alone
        could decide them, is gone), decided ones routed from the next `step_commits` on
        (their sends not counted in the server's memory: a recovery's leftovers, gone
        within seconds). Not before: a backup that restarts in the middle of a COMMIT
        follows the rest of it from the active."""
        for run in self.commits.settle():
            log.info("A COMMIT of %d messages was not decided when its server stopped: "
                     "nothing of it is applied (its client had no RECEIPT)", len(run.sends))
            self.records.append((rec.TX_DROP, run))  # read as nothing by later recoveries
        for run in self.commits.runs.values():
            log.info("A COMMIT of %d messages was decided before its server stopped, %d of "
                     "them routed: the other %d are routed now", len(run.sends), run.routed,
                     len(run.sends) - run.routed)
