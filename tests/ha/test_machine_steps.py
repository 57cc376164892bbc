"""Every transition of the replication machine's table, taken by the inputs that take it
(issue 21): a recipe brings a machine to the phase, an action feeds it inputs, and the
transition must be among those it made. `test_every_transition_has_a_step` fails when the
table allows a transition nothing here takes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pairmq.ha import events as ev
from pairmq.ha.messages import FailbackStep, PeerHello, WitnessPurpose
from pairmq.ha.phases import TRANSITIONS, Phase
from pairmq.ha.replication import ReplicationMachine
from tests.ha.test_machine import (
    elected,
    electing,
    in_sync_backup,
    machine,
    reply,
    standalone,
    wire_sync,
)
from tests.ha.test_machine_transitions import BACKUP, active_with_backup

P = Phase
wire_hello = PeerHello.from_wire
PRIMARY = {"name": "primary", "identity": "primary#1", "role": "primary",
           "stomp": "primary:61613"}
Machine = ReplicationMachine
LATER = 100.0  # long after every lease and promise of the recipes


def _hello(peer: dict[str, object], state: str, **more: object) -> PeerHello:
    return wire_hello({**peer, "state": state, **more})


# ------------------------------------------------------------ recipes: a machine in a phase

def starting() -> Machine:
    return machine()[0]


def waiting() -> Machine:
    """No witness, a journal with data, alone: it cannot know it is the newest."""
    m, journal = machine(witness=False)
    journal.epoch, journal.appended_seq = 3, 10
    m.tick(0.0)
    return m


def standalone_alone() -> Machine:
    return standalone()[0]


def standalone_no_witness() -> Machine:
    m, journal = machine(witness=False)
    m.tick(0.0)  # a new pair's primary with an empty journal activates
    journal.epoch = 1
    m.handle(ev.Recovered(1), 0.0)
    return m


def active() -> Machine:
    return active_with_backup()[0]


def _backup_catches_up(m: Machine, acked: int, now: float = 0.1) -> Machine:
    """A backup connects, synchronises up to `acked` and acknowledges it."""
    m.handle(ev.PeerConnected(_hello(BACKUP, "SYNCING")), now)
    m.handle(wire_sync({"request": True, "last_seq": 0}), now)
    m.handle(ev.SyncServed(acked), now)
    m.handle(ev.BackupAcked(acked), now)
    return m


def active_no_witness() -> Machine:
    return _backup_catches_up(standalone_no_witness(), 0)


def joining() -> Machine:
    """The backup caught up with its synchronisation, not yet with what was confirmed
    alone before."""
    m, journal = standalone()
    journal.appended_seq = journal.synced_seq = 7
    return _backup_catches_up(m, 5)


def joining_no_witness() -> Machine:
    m = standalone_no_witness()
    m.journal.appended_seq = m.journal.synced_seq = 7  # type: ignore[misc]
    return _backup_catches_up(m, 5)


def dropping_backup() -> Machine:
    m = active()
    m.handle(ev.PeerLost("no heartbeat"), 0.2)
    return m


def handing_over() -> Machine:
    m = active()
    m.handle(ev.FailbackMessage(FailbackStep.REQUEST), 0.2)
    return m


def stepping_down() -> Machine:
    m = standalone_alone()
    end = m.deadline(0.0)
    assert end is not None
    m.check(end)
    return m


def handed_over() -> Machine:
    """Stepping down after a hand-over (DEFERRING next)."""
    m = handing_over()
    out = m.handle(ev.BackupAcked(0), 0.3)
    reply(m, out, 0.3, granted=True, holder="primary#1", epoch=1)
    return m


def deferring() -> Machine:
    m = handed_over()
    m.handle(ev.SteppedDown(), 0.4)
    return m


def syncing() -> Machine:
    m = machine("backup")[0]
    m.handle(ev.PeerConnected(_hello(PRIMARY, "ACTIVE", epoch=1, last_seq=1)), 0.1)
    return m


def passive() -> Machine:
    return in_sync_backup()[0]


def primary_syncing() -> Machine:
    """A primary that synchronises from the backup serving in its place (failback on)."""
    m, _ = machine("primary")
    m.handle(ev.PeerConnected(_hello(BACKUP, "STANDALONE", epoch=2, last_seq=1)), 0.1)
    m.handle(ev.SyncOffered("full", 1), 0.15)
    return m


def failback_asked() -> Machine:
    m = primary_syncing()
    m.journal.appended_seq = m.journal.synced_seq = 1  # type: ignore[misc]
    m.handle(ev.SyncDone(1), 0.2)
    return m


def orphaned() -> Machine:
    m = passive()
    m.handle(ev.PeerLost("no heartbeat"), 0.3)
    return m


def taking_over() -> Machine:
    """The active said "go"; the witness has not granted the lease yet (retried later)."""
    m = passive()
    out = m.handle(ev.FailbackMessage(FailbackStep.GO, 1), 0.5)
    reply(m, out, 0.5, granted=False, holder="primary#1", epoch=1, reason="not yet")
    return m


def activating() -> Machine:
    m = starting()
    m.tick(0.0)
    return m


def stopping() -> Machine:
    m = standalone_alone()
    m.handle(ev.Shutdown(), 0.1)
    return m


# ------------------------------------------------------------ actions

Action = Callable[[Machine], object]


def shutdown(m: Machine) -> None:
    m.handle(ev.Shutdown(), 0.5)


def lost(m: Machine) -> None:
    m.handle(ev.PeerLost("no heartbeat"), 0.5)


def go(m: Machine) -> None:
    m.handle(ev.FailbackMessage(FailbackStep.GO, 1), 0.5)


def failback_request(m: Machine) -> None:
    m.handle(ev.FailbackMessage(FailbackStep.REQUEST), 0.5)


def connected(peer: dict[str, object], state: str, **more: object) -> Action:
    return lambda m: m.handle(ev.PeerConnected(_hello(peer, state, **more)), 0.5)


def heartbeat(peer: dict[str, object], state: str, **more: object) -> Action:
    return lambda m: m.handle(ev.Heartbeat(_hello(peer, state, **more)), 0.5)


def witness_says(purpose: WitnessPurpose | None = None, **answer: object) -> Action:
    """The answer to the request out (or, with no answer, its loss)."""
    def act(m: Machine) -> None:
        asking = purpose or m.witness.asking
        assert asking is not None, "no witness request out"
        m.handle(ev.witness_replied(asking, dict(answer) if answer else None, 0.5), 0.5)
    return act


def late_check(m: Machine) -> None:
    m.check(LATER)
    m.tick(LATER)


def resync(acked: int) -> Action:
    return lambda m: _backup_catches_up(m, acked, 0.5)


def release_after_peer_serves(m: Machine) -> None:
    """Granted, but the peer came back serving meanwhile: the grant goes back."""
    witness_says(holder=None, epoch=0)(m)  # the query: a new pair
    m.handle(ev.PeerConnected(_hello(BACKUP, "STANDALONE", epoch=2)), 0.5)
    witness_says(granted=True, holder="primary#1", epoch=1)(m)  # the grant
    witness_says(granted=True)(m)  # the release


def renew_refused_after_recovery(m: Machine) -> None:
    witness_says(holder=None, epoch=0)(m)
    witness_says(granted=True, holder="primary#1", epoch=1)(m)
    m.journal.epoch = 1  # type: ignore[misc]
    m.handle(ev.Recovered(1), 0.5)
    witness_says(granted=False, holder="backup#1", epoch=3, reason="held")(m)


def renewed_without_standby(m: Machine) -> None:
    witness_says(granted=True, holder="primary#1", epoch=1, standby=None)(m)


def higher_epoch_with_a_lease(m: Machine) -> None:
    m.handle(ev.Heartbeat(_hello(BACKUP, "STANDALONE", epoch=9, lease=True)), 0.5)


def lapse_then_serve_alone(m: Machine) -> None:
    """STANDALONE once the witness answers; here the backup's lost and the lease lapses."""
    end = m.deadline(0.5)
    assert end is not None
    m.check(end)


def released_and_handed_over(m: Machine) -> None:
    out = m.handle(ev.BackupAcked(0), 0.5)
    reply(m, out, 0.5, granted=True, holder="primary#1", epoch=1)


def recovered_and_renewed(m: Machine) -> None:
    witness_says(holder=None, epoch=0)(m)
    witness_says(granted=True, holder="primary#1", epoch=1)(m)
    m.journal.epoch = 1  # type: ignore[misc]
    m.handle(ev.Recovered(1), 0.5)
    witness_says(granted=True, holder="primary#1", epoch=1)(m)


def unreachable(m: Machine) -> None:
    witness_says()(m)


def refused_after_promise(m: Machine) -> None:
    late_check(m)  # the promise ran out: it asks the witness for the lease
    witness_says(granted=False, holder="primary#1", epoch=1, reason="still held")(m)


def stepped_down(m: Machine) -> None:
    m.handle(ev.SteppedDown(), 0.5)


def lost_then_stepped_down(m: Machine) -> None:
    m.handle(ev.PeerLost("no heartbeat"), 0.45)
    m.handle(ev.SteppedDown(), 0.5)


def stop_replied(m: Machine) -> None:
    witness_says(granted=True)(m)


def force(m: Machine) -> None:
    m.handle(ev.Force(), 0.5)


def no_witness_tick(m: Machine) -> None:
    m.tick(0.5)


def acked_after_lapse(m: Machine) -> None:
    """A lease that ran out while the backup synchronised comes back with its promise."""
    m.check(LATER)
    m.handle(ev.BackupAcked(7), LATER)
    m.handle(ev.Heartbeat(_hello(BACKUP, "PASSIVE", in_sync=True, echo=LATER - 0.05)), LATER)


def synced(m: Machine) -> None:
    m.journal.appended_seq = m.journal.synced_seq = 1  # type: ignore[misc]
    m.handle(ev.SyncDone(1), 0.5)


def recovered_on_the_election(m: Machine) -> None:
    m.journal.epoch = 3  # type: ignore[misc]
    m.handle(ev.Recovered(3), 0.5)


def sync_asked(epoch: int, last_seq: int) -> Action:
    return lambda m: m.handle(wire_sync({"request": True, "epoch": epoch,
                                                "last_seq": last_seq}), 0.5)


def abandoned_by_deadline(m: Machine) -> None:
    m.journal.appended_seq = 9  # type: ignore[misc]  # the backup never holds it
    m.tick(LATER)


STEPS: dict[tuple[Phase, Phase], tuple[Callable[[], Machine], Action]] = {
    (P.STARTING, P.ACTIVATING): (starting, no_witness_tick),
    (P.STARTING, P.WAITING): (lambda: machine(witness=False)[0], lambda m: (
        setattr(m.journal, "appended_seq", 4), m.tick(0.5))),
    (P.STARTING, P.SYNCING): (lambda: machine("backup")[0],
                              connected(PRIMARY, "ACTIVE", epoch=1, last_seq=1)),
    (P.STARTING, P.STOPPED): (starting, shutdown),
    (P.WAITING, P.ACTIVATING): (waiting, force),
    (P.WAITING, P.WAITING): (waiting, no_witness_tick),
    (P.WAITING, P.SYNCING): (waiting, connected(PRIMARY, "ACTIVE", epoch=4, last_seq=12)),
    (P.WAITING, P.TAKING_OVER): (waiting, go),
    (P.WAITING, P.STOPPED): (waiting, shutdown),
    (P.DEFERRING, P.WAITING): (deferring, lost),
    (P.DEFERRING, P.SYNCING): (deferring, connected(BACKUP, "ACTIVE", epoch=2)),
    (P.DEFERRING, P.ACTIVATING): (handed_over, lost_then_stepped_down),
    (P.DEFERRING, P.TAKING_OVER): (deferring, go),
    (P.DEFERRING, P.STOPPED): (deferring, shutdown),
    (P.SYNCING, P.PASSIVE): (syncing, lambda m: (
        m.handle(ev.SyncOffered("full", 1), 0.5), synced(m))),
    (P.SYNCING, P.WAITING): (syncing, lost),
    (P.SYNCING, P.ORPHANED): (syncing, connected(PRIMARY, "ACTIVE", epoch=1)),
    (P.SYNCING, P.TAKING_OVER): (syncing, go),
    (P.SYNCING, P.STOPPED): (syncing, shutdown),
    (P.PASSIVE, P.FAILBACK_ASKED): (primary_syncing, synced),
    (P.PASSIVE, P.ORPHANED): (passive, lost),
    (P.PASSIVE, P.WAITING): (passive, heartbeat(PRIMARY, "WAITING", epoch=1)),
    (P.PASSIVE, P.TAKING_OVER): (passive, go),
    (P.PASSIVE, P.STOPPED): (passive, shutdown),
    (P.FAILBACK_ASKED, P.ORPHANED): (failback_asked, lost),
    (P.FAILBACK_ASKED, P.WAITING): (failback_asked, heartbeat(BACKUP, "WAITING", epoch=2)),
    (P.FAILBACK_ASKED, P.TAKING_OVER): (failback_asked, go),
    (P.FAILBACK_ASKED, P.STOPPED): (failback_asked, shutdown),
    (P.TAKING_OVER, P.ACTIVATING): (taking_over, late_check),
    (P.TAKING_OVER, P.ORPHANED): (taking_over, lost),
    (P.TAKING_OVER, P.TAKING_OVER): (taking_over, go),
    (P.TAKING_OVER, P.STOPPED): (taking_over, shutdown),
    (P.ORPHANED, P.ACTIVATING): (orphaned, late_check),
    (P.ORPHANED, P.ORPHANED): (orphaned, connected(PRIMARY, "ACTIVE", epoch=1)),
    (P.ORPHANED, P.SYNCING): (orphaned, connected(PRIMARY, "ACTIVE", epoch=1)),
    (P.ORPHANED, P.WAITING): (orphaned, connected(PRIMARY, "WAITING", epoch=1)),
    (P.ORPHANED, P.TAKING_OVER): (orphaned, go),
    (P.ORPHANED, P.STOPPED): (orphaned, shutdown),
    (P.ACTIVATING, P.ELECTED): (lambda: electing()[0], recovered_on_the_election),
    (P.ACTIVATING, P.STANDALONE): (activating, recovered_and_renewed),
    (P.ACTIVATING, P.STARTING): (activating, release_after_peer_serves),
    (P.ACTIVATING, P.WAITING): (activating, unreachable),
    (P.ACTIVATING, P.ORPHANED): (orphaned, refused_after_promise),
    (P.ACTIVATING, P.TAKING_OVER): (passive, lambda m: (
        go(m), witness_says(granted=False, holder="primary#1", epoch=1)(m))),
    (P.ACTIVATING, P.STEPPING_DOWN): (activating, renew_refused_after_recovery),
    (P.ACTIVATING, P.STOPPED): (activating, shutdown),
    (P.ELECTED, P.STANDALONE): (lambda: elected()[0], sync_asked(1, 3)),
    (P.ELECTED, P.STEPPING_DOWN): (lambda: elected()[0], sync_asked(2, 8)),
    (P.ELECTED, P.STOPPING): (lambda: elected()[0], shutdown),
    (P.STANDALONE, P.JOINING): (standalone_alone, resync(0)),
    (P.STANDALONE, P.STEPPING_DOWN): (standalone_alone, lapse_then_serve_alone),
    (P.STANDALONE, P.STOPPING): (standalone_alone, shutdown),
    (P.STANDALONE, P.STOPPED): (standalone_no_witness, shutdown),
    (P.JOINING, P.ACTIVE): (joining, acked_after_lapse),
    (P.JOINING, P.STANDALONE): (joining, lost),
    (P.JOINING, P.HANDING_OVER): (joining, failback_request),
    (P.JOINING, P.STEPPING_DOWN): (joining, higher_epoch_with_a_lease),
    (P.JOINING, P.STOPPING): (joining, shutdown),
    (P.JOINING, P.STOPPED): (joining_no_witness, shutdown),
    (P.ACTIVE, P.DROPPING_BACKUP): (active, lost),
    (P.ACTIVE, P.STANDALONE): (active_no_witness, lost),
    (P.ACTIVE, P.HANDING_OVER): (active, failback_request),
    (P.ACTIVE, P.STEPPING_DOWN): (active, late_check),
    (P.ACTIVE, P.STOPPING): (active, shutdown),
    (P.ACTIVE, P.STOPPED): (active_no_witness, shutdown),
    (P.DROPPING_BACKUP, P.STANDALONE): (dropping_backup, renewed_without_standby),
    (P.DROPPING_BACKUP, P.JOINING): (dropping_backup, resync(0)),
    (P.DROPPING_BACKUP, P.STEPPING_DOWN): (dropping_backup, late_check),
    (P.DROPPING_BACKUP, P.STOPPING): (dropping_backup, shutdown),
    (P.HANDING_OVER, P.ACTIVE): (handing_over, abandoned_by_deadline),
    (P.HANDING_OVER, P.STEPPING_DOWN): (handing_over, released_and_handed_over),
    (P.HANDING_OVER, P.STOPPED): (handing_over, lambda m: (
        shutdown(m), released_and_handed_over(m))),
    (P.STEPPING_DOWN, P.WAITING): (stepping_down, stepped_down),
    (P.STEPPING_DOWN, P.DEFERRING): (handed_over, stepped_down),
    (P.STEPPING_DOWN, P.STOPPED): (stepping_down, shutdown),
    (P.STOPPING, P.STOPPED): (stopping, stop_replied),
}


def test_every_transition_has_a_step() -> None:
    allowed = {(old, new) for old, targets in TRANSITIONS.items() for new in targets}
    assert sorted(allowed - set(STEPS)) == []
    assert sorted(set(STEPS) - allowed) == []


@pytest.mark.parametrize("transition", list(STEPS), ids=lambda t: f"{t[0].value}->{t[1].value}")
def test_the_step_takes_the_transition(transition: tuple[Phase, Phase]) -> None:
    recipe, action = STEPS[transition]
    m = recipe()  # in the transition's phase, or one the action leaves for it first
    taken: list[tuple[Phase, Phase]] = []
    enter = m._enter

    def recorded(phase: Phase, why: str, **value: object) -> None:
        taken.append((m.phase, phase))
        enter(phase, why, **value)  # type: ignore[arg-type]

    m._enter = recorded  # type: ignore[method-assign]
    action(m)
    assert transition in taken, [(a.value, b.value) for a, b in taken]
