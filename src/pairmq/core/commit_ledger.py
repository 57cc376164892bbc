"""The ledger of the COMMITs applied in slices (core/broker/committing.py): each run under
way, its phase, and what the journal's TX_ entries say of it. Recovery (core/replay.py), a
backup following the active (core/broker/follow.py) and the serving broker keep the same
ledger, through this one class, so that all three agree on what a COMMIT left behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, NamedTuple

from pairmq.core.admission import ACCEPTED, Outcome
from pairmq.core.session import PendingSend


class CommitPhase(StrEnum):
    STAGING = "staging"  # its sends are being journaled (TX_SEND); nothing is decided
    ROUTING = "routing"  # decided (TX_END): routed a slice per turn
    DONE = "done"  # every send routed
    DROPPED = "dropped"  # never decided (TX_DROP): its transaction is left open


@dataclass(slots=True, eq=False)
class CommitRun:
    key: int  # names its journal entries; unique in the journal's life
    sends: list[PendingSend]
    conn_id: int | None = None  # the connection waiting for it (None: gone, or recovered)
    transaction: str = ""
    phase: CommitPhase = CommitPhase.STAGING
    staged: int = 0  # sends journaled (TX_SEND)
    routed: int = 0  # sends routed (TX_DONE)
    bytes: int = 0  # of the sends not routed yet, counted in the server's memory
    segment: int | None = None  # the journal segment of its first TX_SEND (kept till done)
    outcome: Outcome = ACCEPTED  # DROPPED: held or refused, and why


@dataclass
class CommitLedger:
    """The commits under way, by key, as the journal tells them (recovery and a backup
    follow the same entries through this one class) or as the broker runs them."""

    runs: dict[int, CommitRun] = field(default_factory=dict)  # in the order they began
    top: int = 0  # the largest key seen: a new run's key is larger

    def next_key(self, now: int) -> int:
        self.top = max(self.top + 1, now)  # unique even past a key recovery did not see
        return self.top

    def staged(self, key: int, send: PendingSend, segment: int) -> None:
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = CommitRun(key, [], segment=segment)
            self.top = max(self.top, key)
        run.sends.append(send)
        run.staged += 1

    def decided(self, key: int, sends: int) -> None:
        run = self.runs.get(key)
        if run is not None and run.staged == sends:
            run.phase = CommitPhase.ROUTING
        elif run is not None:  # its first TX_SEND entries were deleted: it was done
            del self.runs[key]

    def done(self, key: int, routed: int) -> None:
        run = self.runs.get(key)
        if run is None:
            return
        if routed >= len(run.sends):
            del self.runs[key]
            return
        run.sends[run.routed:routed] = [ROUTED] * (routed - run.routed)  # bodies freed
        run.routed = routed

    def dropped(self, key: int) -> None:
        self.runs.pop(key, None)

    def settle(self) -> list[CommitRun]:
        """This server serves now: forget the undecided runs (their clients had no
        RECEIPT); returns those."""
        undecided = [r for r in self.runs.values() if r.phase is CommitPhase.STAGING]
        for run in undecided:
            del self.runs[run.key]
        return undecided

    def holds(self, segment_id: int) -> bool:
        """A run under way needs this segment (store/compaction.py compacts and deletes it
        later)."""
        return any(run.segment == segment_id for run in self.runs.values())


class CommitStep(NamedTuple):
    """What one `step_commits` did."""

    finished: list[CommitRun]  # the runs it finished: DONE, or DROPPED with their outcome
    staged: int  # sends it journaled (TX_SEND)
    routed: int  # sends it routed


ROUTED: Final = PendingSend("", {}, b"")  # in place of a send routed already: its body is free


def staged_bytes(send: PendingSend) -> int:
    """What a send waiting for its COMMIT counts in the server's memory."""
    return 64 + len(send.body) + sum(map(len, send.headers)) \
        + sum(map(len, send.headers.values()))
