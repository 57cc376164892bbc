"""What the serving phases of the replication machine answer to (ha/steps.py has the
others, and says how a step function reads)."""

from __future__ import annotations

from pairmq.ha.events import (
    BackupAcked,
    ConfirmationsChanged,
    Event,
    FailbackMessage,
    Heartbeat,
    Log,
    PeerConnected,
    PeerLost,
    Shutdown,
    SyncRequested,
    SyncServed,
    WitnessReplied,
)
from pairmq.ha.messages import FailbackStep, WitnessPurpose
from pairmq.ha.phases import Phase
from pairmq.ha.rules import ReplicationRules as Machine
from pairmq.ha.steps import WARNING, as_every_phase

# Every serving phase takes the in-sync peer's promise (`_peer_promised`) and steps down
# for a peer that outranks it (`_outranked`; ELECTED checks its election in between). An
# operator's force is dropped (it serves already), and so is "go" (nobody hands over to
# a server that serves).


def step_elected(m: Machine, event: Event, now: float) -> None:
    """ELECTED: serving on an election with the peer while the witness is unreachable
    (`Elected`), confirming nothing. Whenever the peer states its journal (a hello, its
    synchronisation request) it must be the one elected over (`_keep_election`); the peer
    following it, or the witness granting the lease, makes it STANDALONE."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._peer_promised(hello)
            if m.peer_state.serving:
                m._split_brain_seen()
            m._keep_election((hello.epoch, hello.last_seq))
            m._newer_peer_seen()
        case PeerConnected(hello):
            # no `_follower_gone`: the election is this phase's check of a new channel
            m._connected(hello)
            m._keep_election((hello.epoch, hello.last_seq))
            m._newer_peer_seen()
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
        case SyncRequested(request) as asked:
            # Only on the journal elected over (`Elected`): a different one may hold
            # confirmed records the copy would wipe (seed 10715).
            if m._keep_election(asked.journal):
                m._enter(Phase.STANDALONE, f"{m.peer.name} follows this server: it "
                                           "synchronises from it")
                m._serve_sync(request)
        case SyncServed(seq):
            if m.connected:
                m.sync_done_seq = seq  # the live stream follows
        case WitnessReplied(WitnessPurpose.RENEW) as replied:
            m._witness_replied(replied, m._on_renewed)
        case WitnessReplied(WitnessPurpose.ADOPT) as replied:
            m._witness_replied(replied, m._on_adopted)
        case Shutdown():
            m._shut_down_serving()
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_alone(m: Machine, event: Event, now: float) -> None:
    """STANDALONE, DROPPING_BACKUP: serving without an in-sync backup (DROPPING_BACKUP:
    confirming alone once the witness knows, `_on_renewed`). A backup that asks to
    synchronise is served; once it has caught up, it joins (JOINING)."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._peer_promised(hello)
            m._outranked()
        case PeerConnected(hello):
            m._follower_gone(now)  # a new channel: the old one, if any, has ended
            m._connected(hello)
            m._newer_peer_seen()
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            m._follower_gone(now)
        case SyncRequested(request):
            m._serve_sync(request)
        case SyncServed(seq):
            if m.connected:
                m.sync_done_seq = seq  # the live stream follows
        case BackupAcked(seq):
            m.backup_acked = max(m.backup_acked, seq)
            if m.sync_done_seq is not None and seq >= m.sync_done_seq:
                m._join(seq)
                m._promote(now)
            m._emit(ConfirmationsChanged())
        case WitnessReplied(WitnessPurpose.RENEW) as replied:
            m._witness_replied(replied, m._on_renewed)
        case WitnessReplied(WitnessPurpose.ADOPT) as replied:
            m._witness_replied(replied, m._on_adopted)
        case Shutdown():
            m._shut_down_serving()
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_joining(m: Machine, event: Event, now: float) -> None:
    """JOINING: the backup caught up; receipts wait for it, and it is in sync (ACTIVE,
    `_promote`) once it holds everything confirmed alone before. Losing it, or its asking
    to synchronise again, is back to STANDALONE; it may ask to fail back."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            if m._peer_promised(hello):
                m._promote(now)
            m._outranked()
        case PeerConnected(hello):
            m._follower_gone(now)  # a new channel: the old one, if any, has ended
            m._connected(hello)
            m._newer_peer_seen()
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            # never declared the standby: confirm alone again
            m._enter(Phase.STANDALONE, f"lost the joining backup: {reason}")
            m._emit(ConfirmationsChanged())
            m._follower_gone(now)
        case SyncRequested(request):
            m._enter(Phase.STANDALONE, "the backup synchronises again")
            m._serve_sync(request)
        case SyncServed(seq):
            if m.connected:
                m.sync_done_seq = seq  # the live stream follows
        case BackupAcked(seq):
            m.backup_acked = max(m.backup_acked, seq)
            m._promote(now)
            m._emit(ConfirmationsChanged())
        case FailbackMessage(FailbackStep.REQUEST):
            m._start_hand_over(f"failing back to {m.peer.name}", now, stopping=False)
        case WitnessReplied(WitnessPurpose.RENEW) as replied:
            m._witness_replied(replied, m._on_renewed)
        case WitnessReplied(WitnessPurpose.ADOPT) as replied:
            m._witness_replied(replied, m._on_adopted)
        case Shutdown():
            m._shut_down_serving()
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_active(m: Machine, event: Event, now: float) -> None:
    """ACTIVE: serving with an in-sync backup, whose promise counts as a lease. Losing the
    backup, or its asking to synchronise again, drops it (the witness is told first); it
    may ask to fail back, and a shutdown hands over with failover_on_shutdown."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._peer_promised(hello)
            m._outranked()
        case PeerConnected(hello):
            m._follower_gone(now)  # a new channel: the old one, if any, has ended
            m._connected(hello)
            m._newer_peer_seen()
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            m._backup_lost()
            m._follower_gone(now)
        case SyncRequested(request):
            m._backup_lost()  # a new synchronisation: the backup is not in sync
            m._serve_sync(request)
        case SyncServed(seq):
            if m.connected:
                m.sync_done_seq = seq  # the live stream follows
        case FailbackMessage(FailbackStep.REQUEST):
            m._start_hand_over(f"failing back to {m.peer.name}", now, stopping=False)
        case WitnessReplied(WitnessPurpose.RENEW) as replied:
            m._witness_replied(replied, m._on_renewed)
        case WitnessReplied(WitnessPurpose.ADOPT) as replied:
            m._witness_replied(replied, m._on_adopted)
        case Shutdown() if m.connected and m.cfg.failover_on_shutdown:
            m._start_hand_over("shutting down (failover_on_shutdown = true)", now,
                               stopping=True)
        case Shutdown():
            m._shut_down_serving()
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_handing_over(m: Machine, event: Event, now: float) -> None:
    """HANDING_OVER: clients closed, waiting for the backup to hold everything, then giving
    the lease back (`HandOver`, ha/handover.py). No synchronisation is served and no
    renewal asked meanwhile; the channel closing abandons it (ACTIVE)."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._peer_promised(hello)
            m._outranked()
        case PeerConnected(hello):
            m._follower_gone(now)  # a new channel: the old one, if any, has ended
            m._connected(hello)
            m._newer_peer_seen()
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            m._emit(Log(WARNING, "Hand-over abandoned: the HA channel closed"))
            m._enter(Phase.ACTIVE, "hand-over abandoned: the HA channel closed")
            m._backup_lost()
            m._follower_gone(now)
        case SyncServed(seq):
            if m.connected:
                m.sync_done_seq = seq  # the live stream follows
        case BackupAcked(seq):
            m.backup_acked = max(m.backup_acked, seq)
            m._hand_over_progress(now)
            m._emit(ConfirmationsChanged())
        case WitnessReplied(WitnessPurpose.ADOPT) as replied:
            m._witness_replied(replied, m._on_adopted)
        case WitnessReplied(WitnessPurpose.RELEASE) as replied:
            m._witness_replied(replied, m._released)
        case Shutdown():
            m._stop_after_hand_over()
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)
