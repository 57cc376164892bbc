"""The replication machine's phases and step values, its settings, and its view of the
journal (ha/replication.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from pairmq.ha.states import State


class Phase(StrEnum):
    """Where the machine is. Several phases report the same `State` (see REPORTED)."""

    STARTING = "starting"
    WAITING = "waiting"
    STEPPING_DOWN = "stepping-down"  # stopped serving: see `SteppingDown`
    DEFERRING = "deferring"  # handed over to the peer: let it activate, do not compete
    SYNCING = "syncing"  # asked the active for its journal
    PASSIVE = "passive"  # in-sync backup
    FAILBACK_ASKED = "failback-asked"  # in-sync primary backup, asked for its place back
    TAKING_OVER = "taking-over"  # the active handed over: activate until the witness grants
    ORPHANED = "orphaned"  # was in sync, lost the active: waits for its promise to run out
    ACTIVATING = "activating"  # see `Activation`
    STANDALONE = "standalone"  # serving, no backup
    ACTIVE = "active"  # serving, in-sync backup attached
    DROPPING_BACKUP = "dropping-backup"  # backup lost: confirm alone once the witness knows
    JOINING = "joining"  # backup caught up: receipts wait for it; in sync once it holds
    #                      everything confirmed alone before (then ACTIVE, standby declared)
    HANDING_OVER = "handing-over"  # see `HandOver`
    STOPPING = "stopping"  # giving the lease back before the process ends
    STOPPED = "stopped"


SERVING = frozenset({Phase.STANDALONE, Phase.JOINING, Phase.ACTIVE, Phase.DROPPING_BACKUP,
                     Phase.HANDING_OVER})
IN_SYNC = frozenset({Phase.PASSIVE, Phase.FAILBACK_ASKED, Phase.TAKING_OVER})
REPORTED = {
    Phase.STARTING: State.STARTING, Phase.WAITING: State.WAITING,
    Phase.STEPPING_DOWN: State.WAITING,
    Phase.DEFERRING: State.WAITING, Phase.SYNCING: State.SYNCING,
    Phase.PASSIVE: State.PASSIVE, Phase.FAILBACK_ASKED: State.PASSIVE,
    Phase.TAKING_OVER: State.PASSIVE, Phase.ORPHANED: State.PASSIVE,
    Phase.STANDALONE: State.STANDALONE, Phase.ACTIVE: State.ACTIVE,
    Phase.DROPPING_BACKUP: State.ACTIVE, Phase.HANDING_OVER: State.ACTIVE,
    Phase.JOINING: State.STANDALONE,
    Phase.STOPPING: State.WAITING, Phase.STOPPED: State.WAITING,
}


class Step(StrEnum):
    QUERY = "query"  # asking the witness who was last active
    GRANT = "grant"  # asking the witness for the lease at a new epoch
    RELEASE = "release"  # the peer came back serving meanwhile: giving the grant back
    RECOVER = "recover"  # the server opens its journal for serving (BecomeActive)
    RENEW = "renew"  # recovery may have outlasted the lease: renewing before serving


@dataclass(frozen=True)
class Activation:
    why: str
    step: Step
    back_to: Phase  # where a refused attempt returns
    epoch: int = 0
    force: bool = False
    fresh: bool = False  # a new pair's primary with an empty journal
    won: bool = False  # the election against the connected peer
    with_peer: bool = False  # elected with the peer while the witness is unreachable


@dataclass(frozen=True)
class SteppingDown:
    """Stopped serving (its clients closed, nothing confirmed any more): the journal is read
    back into a new broker, off the event loop, so that heartbeats go on (seconds for
    millions of waiting messages). Nothing is decided meanwhile: the journal the machine
    would read is not there yet. `SteppedDown` enters `then`."""

    why: str
    then: Phase  # WAITING, or DEFERRING after a hand-over


class HandOverStep(StrEnum):
    DRAINING = "draining"  # waiting for the backup to hold everything
    RELEASING = "releasing"  # giving the lease back, keeping the backup as standby


@dataclass(frozen=True)
class HandOver:
    why: str
    step: HandOverStep
    deadline: float
    stopping: bool  # failover on shutdown: the process ends after it
    target: int | None = None  # the last record the backup must hold


@dataclass(frozen=True)
class Settings:
    name: str
    identity: str  # name#node-id: the witness tells a stale namesake apart
    role: str  # "primary" | "backup"
    stomp: str  # where clients reach this server
    witness: bool
    heartbeat: float  # seconds
    activation_ms: int
    sync_timeout: float
    allow_failback: bool
    failover_on_shutdown: bool
    synchronous: bool  # replication_mode = "sync"
    backup_ack_fsync: bool  # backup_ack = "fsync"
    boot: int = 0  # grows with every start of the process: orders its witness requests
    stomp_tls: str = ""  # where clients on TLS reach it ("" without a TLS listener)

    @property
    def activation(self) -> float:
        return self.activation_ms / 1000

    def next_epoch(self, above: int) -> int:
        """The first epoch above `above` that this server may open: odd for the primary,
        even for the backup. An epoch names one history, and the two servers can open one
        by different paths at once (one granted by the witness, the other elected with
        its peer while the witness was away), so they never pick from the same numbers."""
        return epoch_above(above, self.role)


def epoch_above(above: int, role: str) -> int:
    """The first epoch above `above` of `role`'s numbers (odd: primary, even: backup)."""
    parity = 1 if role == "primary" else 0
    epoch = above + 1
    return epoch if epoch % 2 == parity else epoch + 1


class Journal(Protocol):
    """What the machine reads of the current role's journal (read-only)."""

    @property
    def epoch(self) -> int: ...

    @property
    def appended_seq(self) -> int: ...

    @property
    def oldest_seq(self) -> int: ...

    @property
    def synced_seq(self) -> int: ...

    @property
    def mirror(self) -> bool: ...

    epochs: list[tuple[int, int]]
