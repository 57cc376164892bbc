"""The replication machine's phases and step values, its settings, and its view of the
journal (ha/replication.py).

Every phase change it may make is TRANSITIONS, at the end. Which input a phase takes is
its step function (STEPS, ha/replication.py); what the machine does of its own accord
after every input, in which phase, on what condition and why, is one table: DECISIONS in
ha/decisions.py, which `_decide` walks."""

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
    ELECTED = "elected"  # serving on an election with the peer, not yet followed: `Elected`
    STANDALONE = "standalone"  # serving, no backup
    ACTIVE = "active"  # serving, in-sync backup attached
    DROPPING_BACKUP = "dropping-backup"  # backup lost: confirm alone once the witness knows
    JOINING = "joining"  # backup caught up: receipts wait for it; in sync once it holds
    #                      everything confirmed alone before (then ACTIVE, standby declared)
    HANDING_OVER = "handing-over"  # see `HandOver`
    STOPPING = "stopping"  # giving the lease back before the process ends
    STOPPED = "stopped"


class JournalDisk(StrEnum):
    """Whether this server's journal completes writes: an input's fact (JournalStalled,
    JournalFlowing), which the serving phases act on (ha/decisions.py)."""

    FLOWING = "flowing"
    STALLED = "stalled"


SERVING = frozenset({Phase.ELECTED, Phase.STANDALONE, Phase.JOINING, Phase.ACTIVE,
                     Phase.DROPPING_BACKUP, Phase.HANDING_OVER})
IN_SYNC = frozenset({Phase.PASSIVE, Phase.FAILBACK_ASKED, Phase.TAKING_OVER})
REPORTED = {
    Phase.STARTING: State.STARTING, Phase.WAITING: State.WAITING,
    Phase.STEPPING_DOWN: State.WAITING,
    Phase.DEFERRING: State.WAITING, Phase.SYNCING: State.SYNCING,
    Phase.PASSIVE: State.PASSIVE, Phase.FAILBACK_ASKED: State.PASSIVE,
    Phase.TAKING_OVER: State.PASSIVE, Phase.ORPHANED: State.PASSIVE,
    Phase.ELECTED: State.STANDALONE,
    Phase.STANDALONE: State.STANDALONE, Phase.ACTIVE: State.ACTIVE,
    Phase.DROPPING_BACKUP: State.STANDALONE, Phase.HANDING_OVER: State.ACTIVE,
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
    # ... on the peer's journal as it said it then (epoch, last seq): if it says more by
    # the time this server's journal is open, the peer served meanwhile (seed 7217); kept
    # while serving on the election (`Elected`, seed 10715)
    peer_journal: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Elected:
    """Serving on an election with the peer while the witness cannot be reached, until the
    peer follows this server (it asks to synchronise) or the witness grants the lease.

    The election is this server's only ground, and it was taken on the peer's journal as
    it was then (`peer_journal`: epoch, last seq). The witness does not know the epoch the
    election opened, so it may grant the peer a lower one after it: the peer then serves,
    confirms alone, and may stop serving again before this server hears of it. Its journal
    then holds confirmed records this one lacks, and a synchronisation served to it (a full
    copy: its history is not a prefix of ours) would wipe them, after which its promise
    would let this server confirm (simulator seed 10715). So while ELECTED, whenever the
    peer states its journal (a hello, its synchronisation request), it must be the one
    elected over; any other means the peer served meanwhile (an activation journals its
    epoch first), or at least that the election no longer stands: step down, the pair
    elects again. ELECTED confirms nothing (no lease, no in-sync backup)."""

    peer_journal: tuple[int, int]


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

    @property
    def epochs(self) -> list[tuple[int, int]]: ...


class IllegalTransition(Exception):
    """A phase change the transition table does not allow: a bug, never an input's fault
    (either machine's: this one's TRANSITIONS, or ha/shared_store.py's)."""

    def __init__(self, old: StrEnum, new: StrEnum, why: str) -> None:
        super().__init__(f"illegal transition {old.value} -> {new.value} ({why})")
        self.old, self.new = old, new


def _to(*phases: Phase) -> frozenset[Phase]:
    return frozenset(phases)


_P = Phase
# Every phase change the replication machine makes, and nothing else (ReplicationMachine
# `_enter` raises on any other). Read a row as "from here, on these grounds, to there".
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # elected or asked the witness; a newer peer; the peer serves (follow it); stop
    _P.STARTING: _to(_P.ACTIVATING, _P.WAITING, _P.SYNCING, _P.STOPPED),
    # the same, and the active's "go" after a hand-over; WAITING again: still undecided
    _P.WAITING: _to(_P.ACTIVATING, _P.WAITING, _P.SYNCING, _P.TAKING_OVER, _P.STOPPED),
    # handed over: the peer serves (follow it), or is gone (decide again)
    _P.DEFERRING: _to(_P.WAITING, _P.SYNCING, _P.ACTIVATING, _P.TAKING_OVER, _P.STOPPED),
    # in sync; the active stopped serving or was lost; a new channel; its "go"
    _P.SYNCING: _to(_P.PASSIVE, _P.WAITING, _P.ORPHANED, _P.TAKING_OVER, _P.STOPPED),
    _P.PASSIVE: _to(_P.FAILBACK_ASKED, _P.ORPHANED, _P.WAITING, _P.TAKING_OVER,
                    _P.STOPPED),
    _P.FAILBACK_ASKED: _to(_P.ORPHANED, _P.WAITING, _P.TAKING_OVER, _P.STOPPED),
    # activate (until the witness grants it); the channel closed meanwhile
    _P.TAKING_OVER: _to(_P.ACTIVATING, _P.ORPHANED, _P.TAKING_OVER, _P.STOPPED),
    # the promise ran out: activate; the active is back: synchronise again; or nobody
    _P.ORPHANED: _to(_P.ACTIVATING, _P.ORPHANED, _P.SYNCING, _P.WAITING, _P.TAKING_OVER,
                     _P.STOPPED),
    # serving (ELECTED: on an election with the peer); refused (back where it started, or
    # WAITING, or ORPHANED); stepped down
    _P.ACTIVATING: _to(_P.ELECTED, _P.STANDALONE, _P.STARTING, _P.WAITING, _P.ORPHANED,
                       _P.TAKING_OVER, _P.STEPPING_DOWN, _P.STOPPED),
    # the peer follows (asks to synchronise with the journal elected over) or the witness
    # grants the lease; the peer's journal changed (it served), or serving ends; stop (a
    # phase only with a witness: the lease is given back first)
    _P.ELECTED: _to(_P.STANDALONE, _P.STEPPING_DOWN, _P.STOPPING),
    # a backup caught up; lease lost or superseded; stop (STOPPED: no witness to tell)
    _P.STANDALONE: _to(_P.JOINING, _P.STEPPING_DOWN, _P.STOPPING, _P.STOPPED),
    # in sync; the backup lost or resynchronising; failback asked; lease lost; stop
    _P.JOINING: _to(_P.ACTIVE, _P.STANDALONE, _P.HANDING_OVER, _P.STEPPING_DOWN,
                    _P.STOPPING, _P.STOPPED),
    # the backup lost (the witness told first, or no witness); failback or failover on
    # shutdown; lease and promise lost, or superseded; stop
    _P.ACTIVE: _to(_P.DROPPING_BACKUP, _P.STANDALONE, _P.HANDING_OVER, _P.STEPPING_DOWN,
                   _P.STOPPING, _P.STOPPED),
    # the witness knows (or the backup caught up again meanwhile); lease lost; stop (a
    # phase only with a witness: the lease is given back first)
    _P.DROPPING_BACKUP: _to(_P.STANDALONE, _P.JOINING, _P.STEPPING_DOWN, _P.STOPPING),
    # abandoned (back to ACTIVE); handed over (step down, or end with the process)
    _P.HANDING_OVER: _to(_P.ACTIVE, _P.STEPPING_DOWN, _P.STOPPED),
    # the journal is read back: undecided, or deferring to the peer it handed over to
    _P.STEPPING_DOWN: _to(_P.WAITING, _P.DEFERRING, _P.STOPPED),
    _P.STOPPING: _to(_P.STOPPED),
    _P.STOPPED: _to(),
}
