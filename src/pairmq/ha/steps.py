"""What each phase of the replication machine answers to: one step function per phase, or
per group of phases that answer alike (etcd raft's stepFollower/stepCandidate/stepLeader).
Here the phases that do not serve; the serving ones are in ha/serving_steps.py.

`ReplicationMachine.handle` (ha/replication.py) hands every input to the step function of
the current phase (`STEPS`, there), then runs `_decide` (the table of ha/decisions.py). A
step function is a `match` on the input that lists exactly the inputs its phases take, and
what they do with them; any other input is logged at debug level with the phase and
dropped (`dropped`), on purpose. The inputs every phase takes alike (the stream's
bookkeeping, the witness's reply to the request out, the peer's farewell) fall through
every step to `as_every_phase`, which drops anything else: no phase can miss one (a missed
WitnessReplied would stall the witness queue); a phase that does more with one takes it in
its own case first.

The rules themselves (what to enter, what to emit) are the machine's, in its parts:
ha/rules.py (the peer, serving, the backup side), ha/activation.py, ha/handover.py,
ha/witnessing.py. A step only says which of them a phase applies, and in what order.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from pairmq.ha.events import (
    BackupAcked,
    ConfirmationsChanged,
    Event,
    FailbackMessage,
    Force,
    Heartbeat,
    HeartbeatAhead,
    JournalFlowing,
    JournalStalled,
    Log,
    MirrorProgress,
    PeerConnected,
    PeerLost,
    Recovered,
    Shutdown,
    SteppedDown,
    SyncDone,
    SyncOffered,
    WitnessReplied,
)
from pairmq.ha.messages import FailbackStep, WitnessPurpose
from pairmq.ha.phases import IN_SYNC, Activation, Phase
from pairmq.ha.rules import ReplicationRules as Machine

DEBUG, WARNING = logging.DEBUG, logging.WARNING


def dropped(m: Machine, event: Event) -> None:
    """An input the current phase does not take: said at debug level, and nothing else."""
    m._emit(Log(DEBUG, f"{type(event).__name__} is not an input of phase {m.phase.value}: "
                       "dropped"))


def as_every_phase(m: Machine, event: Event) -> None:
    """What every phase does with these inputs, unless its step takes one first. Taken in
    every phase as the rules stand, expected or not (an offer to synchronise, say, is
    expected only by a backup that asked for one)."""
    match event:
        case SyncOffered(mode, first):
            m._on_sync_offered(mode, first)
        case SyncDone(seq):
            m.sync_done_seq = seq
        case MirrorProgress(appended, synced):
            m._ack_mirror(appended, synced)
        case BackupAcked(seq):
            m.backup_acked = max(m.backup_acked, seq)
            m._emit(ConfirmationsChanged())
        case WitnessReplied() as replied:
            m._witness_replied(replied)
        case FailbackMessage(FailbackStep.SHUTDOWN):
            m.peer_farewell = True  # the peer stops without handing over
        case JournalStalled(waited):
            m._journal_stalled(waited)
        case JournalFlowing():
            m._journal_flowing()
        case HeartbeatAhead():
            pass  # only an in-sync backup promises ahead; the Heartbeat follows in its turn
        case _:
            dropped(m, event)


def _attempt(m: Machine) -> Activation:
    assert m.activation is not None  # ACTIVATING carries its attempt
    return m.activation


# ------------------------------------------------------------ standby, no role yet

def step_undecided(m: Machine, event: Event, now: float) -> None:
    """STARTING, WAITING: no role yet. `_decide`, after every input, activates or follows a
    serving peer; the inputs tell it what the peer and the operator say."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
        case FailbackMessage(FailbackStep.GO, seq) if m.phase is Phase.WAITING:
            m._take_over(seq)  # a server still STARTING is nobody's standby: dropped
        case Force():
            m.order = True  # until this server serves or sees a server (`_decide`)
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_deferring(m: Machine, event: Event, now: float) -> None:
    """DEFERRING: handed over to the peer, this server lets it activate and does not compete
    (`_decide`); once the peer serves, or is gone, it is undecided again (WAITING)."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            if m.peer_state.serving:
                m._enter(Phase.WAITING, f"{hello.name} serves")
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            m._enter(Phase.WAITING, f"lost the peer it handed over to: {reason}")
        case FailbackMessage(FailbackStep.GO, seq):
            m._take_over(seq)
        case Force():
            m.order = True
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


# ------------------------------------------------------------ backups

def step_syncing(m: Machine, event: Event, now: float) -> None:
    """SYNCING: copying the serving peer's journal; in sync (PASSIVE) once the mirror holds
    what the peer said it sent. It promised nothing yet: losing the peer, or seeing it stop
    serving, leaves it undecided. An operator's force is refused (`force_refused`)."""
    match event:
        case Heartbeat(hello):
            if m._heard(hello):
                m._peer_stopped_serving()
            m._echo(hello)
        case PeerConnected(hello):
            if m._connected(hello):
                m._peer_stopped_serving()
            else:
                m._follow_again(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            m._enter(Phase.WAITING, "lost the active server before being in sync")
        case SyncDone(seq):
            m.sync_done_seq = seq
            m._check_in_sync(now)
        case MirrorProgress(appended, synced):
            m._ack_mirror(appended, synced)
            m._check_in_sync(now)
        case FailbackMessage(FailbackStep.GO, seq):
            m._take_over(seq)
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_in_sync(m: Machine, event: Event, now: float) -> None:
    """PASSIVE, FAILBACK_ASKED: an in-sync backup. With every heartbeat of the active it
    promises not to take over for an activation interval; losing the active leaves it
    ORPHANED, where it waits for that promise to run out. An operator's force is refused."""
    match event:
        case Heartbeat(hello):
            if m._heard(hello):
                m._peer_stopped_serving()
            elif m.peer_state.serving:
                m._promise(hello, now)
        case HeartbeatAhead(hello) if m.peer_state.serving and hello.state == m.peer_state:
            # Ahead of records still being applied; the peer still serves as it did: the
            # same promise now (its state change, if any, waits for its turn).
            m._promise(hello, now)
        case PeerConnected(hello):
            if m._connected(hello):
                m._peer_stopped_serving()
            else:
                m._follow_again(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            # Still eligible (per the witness) but no longer receiving: not in sync.
            m._enter(Phase.ORPHANED, f"lost the active server: {reason}")
        case FailbackMessage(FailbackStep.GO, seq):
            m._take_over(seq)
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_taking_over(m: Machine, event: Event, now: float) -> None:
    """TAKING_OVER: the active handed over ("go"); `_decide` activates, again until the
    witness grants the lease, unless the channel closes first (ORPHANED)."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            if m.peer_state.serving:
                # The peer serves on a new channel: the hand-over it began on the old one
                # is over, and what it served since is not in this journal. Synchronise
                # again (simulator seed 50161 on etcd: paused while taking over, this
                # server came back to TAKING_OVER after the peer had served a new epoch,
                # and waited for ever for a lease the peer renewed).
                m._follow_again(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
            # Still eligible (per the witness) but no longer receiving: not in sync.
            m._enter(Phase.ORPHANED, f"lost the active server: {reason}")
        case FailbackMessage(FailbackStep.GO, seq):
            m._take_over(seq)
        case Force():
            m.order = True
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_orphaned(m: Machine, event: Event, now: float) -> None:
    """ORPHANED: was in sync and lost the active; `_decide` activates once its promise has
    run out. A new channel: synchronise again, or undecided if the peer does not serve."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            m._follow_again(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
        case FailbackMessage(FailbackStep.GO, seq):
            m._take_over(seq)
        case Force():
            m.order = True
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


# ------------------------------------------------------------ becoming active

def step_activating(m: Machine, event: Event, now: float) -> None:
    """ACTIVATING: an attempt's steps (`Activation.step`, ha/activation.py), moved on by the
    witness's replies and the journal's recovery; refused, it returns to `back_to`."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            if _attempt(m).back_to in IN_SYNC:
                # An activation started from PASSIVE: if it is refused, the stream it was in
                # sync over is gone with the old channel (simulator seed 9881).
                m._revise(replace(_attempt(m), back_to=Phase.ORPHANED), "a new HA channel")
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
        case WitnessReplied(WitnessPurpose.ACTIVATION) as replied:
            m._witness_replied(replied, m._on_activation_reply)
        case Recovered(epoch):
            m._on_recovered(epoch)
        case FailbackMessage(FailbackStep.GO, seq):
            # the attempt goes on; refused, it is retried as a take-over
            why = m._go_heard(seq)
            m._revise(replace(_attempt(m), back_to=Phase.TAKING_OVER), why)
            m._after_go()
        case Force():
            m.order = True
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


# ------------------------------------------------------------ leaving a role

def step_stepping_down(m: Machine, event: Event, now: float) -> None:
    """STEPPING_DOWN: stopped serving, the journal being read back (`SteppingDown`);
    nothing is decided until `SteppedDown`, and "go" is not taken before it."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
        case SteppedDown():
            m._stepped_down()
        case Force():
            m.order = True
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_stopping(m: Machine, event: Event, now: float) -> None:
    """STOPPING: giving the lease back before the process ends; the witness's answer, or
    a second shutdown, ends it (STOPPED)."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
        case WitnessReplied(WitnessPurpose.STOP) as replied:
            m._witness_replied(replied, m._lease_given_back)
        case Force():
            m.order = True
        case Shutdown():
            m._enter(Phase.STOPPED, "stopping")
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)


def step_stopped(m: Machine, event: Event, now: float) -> None:
    """STOPPED: the end (`tick` does nothing any more). The peer is still recorded while the
    channel drains; "go" and another shutdown are dropped: STOPPED has no way out."""
    match event:
        case Heartbeat(hello):
            m._heard(hello)
            m._echo(hello)
        case PeerConnected(hello):
            m._connected(hello)
            m._say_hello()
        case PeerLost(reason):
            m._channel_lost(reason)
        case Force():
            m.order = True
        case _:  # shared by every phase, or dropped there
            as_every_phase(m, event)
