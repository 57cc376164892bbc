"""The replication machine's phase changes (issue 21): one transition table, every change of
reported state announced, and no ACTIVE without the grounds for it (the witness's lease
or the in-sync backup's promise)."""

from __future__ import annotations

import pytest

from pairmq.ha import events as ev
from pairmq.ha.messages import PeerHello
from pairmq.ha.phases import (
    REPORTED,
    TRANSITIONS,
    Activation,
    Elected,
    HandOver,
    HandOverStep,
    IllegalTransition,
    Phase,
    Step,
    SteppingDown,
)
from pairmq.ha.replication import ReplicationMachine
from pairmq.ha.shared_store import Tick
from pairmq.ha.states import State
from tests.ha.test_machine import ACTIVATION_MS, FakeJournal, one, reply, standalone, wire_sync

BACKUP = {"name": "backup", "identity": "backup#1", "role": "backup", "stomp": "backup:61614"}

wire_hello = PeerHello.from_wire  # a hello as the channel carries it


def announced(effects: list[ev.Effect], start: str) -> list[str]:
    """The reported states the StateChanged effects walk through, checking that each one
    starts where the one before ended (an "old" state nobody announced is a silent change)."""
    states = [start]
    for change in (e for e in effects if isinstance(e, ev.StateChanged)):
        assert change.old == states[-1], (change, states)
        states.append(change.new)
    return states


def active_with_backup(now: float = 0.1) -> tuple[ReplicationMachine, FakeJournal,
                                                   list[ev.Effect]]:
    m, journal = standalone(now=0.0)
    out = m.handle(ev.PeerConnected(wire_hello({**BACKUP, "state": "SYNCING"})), now)
    out += m.handle(wire_sync({"request": True, "last_seq": 0}), now)
    out += m.handle(ev.SyncServed(0), now)
    acked = m.handle(ev.BackupAcked(0), now)
    out += acked + reply(m, acked, now, granted=True, holder="primary#1", epoch=1,
                         standby="backup#1")
    assert m.phase is Phase.ACTIVE
    return m, journal, out


def test_a_backup_that_rejoins_is_announced_at_every_step() -> None:
    """The review's reproduction: ACTIVE, the backup lost, re-synchronised, BackupAcked(5).
    The machine used to enter JOINING (reported STANDALONE) silently and later announce
    STANDALONE -> ACTIVE, from a state it never announced."""
    m, journal, out = active_with_backup()
    assert announced(out, "STANDALONE") == ["STANDALONE", "ACTIVE"]
    out = m.handle(ev.PeerLost("no heartbeat for 600 ms"), 0.2)
    assert m.phase is Phase.DROPPING_BACKUP
    # No in-sync backup any more: reported as such at once, not when the witness answers.
    assert announced(out, "ACTIVE") == ["ACTIVE", "STANDALONE"] and m.state is State.STANDALONE
    out = reply(m, out, 0.2, granted=True, holder="primary#1", epoch=1, standby=None)
    assert m.phase is Phase.STANDALONE and announced(out, "STANDALONE") == ["STANDALONE"]

    journal.appended_seq = journal.synced_seq = 7
    out = m.handle(ev.PeerConnected(wire_hello({**BACKUP, "state": "SYNCING"})), 0.3)
    out += m.handle(wire_sync({"request": True, "last_seq": 0}), 0.3)
    out += m.handle(ev.SyncServed(5), 0.3)
    out += m.handle(ev.BackupAcked(5), 0.3)
    assert m.phase is Phase.JOINING
    assert announced(out, "STANDALONE") == ["STANDALONE"] and m.state is State.STANDALONE
    out = m.handle(ev.BackupAcked(7), 0.35)
    assert m.phase is Phase.ACTIVE
    assert announced(out, "STANDALONE") == ["STANDALONE", "ACTIVE"]


def test_an_isolated_active_steps_down_when_its_leases_run_out_on_a_silent_channel() -> None:
    """A partition leaves the HA channel open and silent for an activation interval. The
    backup's promise runs out inside it, and the backup may take over: the active stops at
    that instant, not when it notices the channel is dead (it used to answer ACTIVE)."""
    m, _, _ = active_with_backup()
    m.handle(ev.Heartbeat(wire_hello({**BACKUP, "state": "PASSIVE", "in_sync": True,
                                      "echo": 0.1})), 0.15)
    end = m.deadline(0.2)
    assert end is not None and end <= 0.1 + ACTIVATION_MS / 1000 + 0.5
    assert m.connected and m.state is State.ACTIVE
    out = m.check(end)
    one(out, ev.StepDown)
    assert m.state is State.WAITING and not m.serving
    assert announced(out, "ACTIVE") == ["ACTIVE", "WAITING"]


def test_active_needs_a_lease_or_the_backups_promise() -> None:
    """The lease ran out while the backup synchronised (it follows this server, which keeps
    its clients but confirms nothing). The backup catching up is not enough to say ACTIVE:
    its first heartbeat in sync, carrying its promise, is."""
    m, _ = standalone(now=0.0)
    m.handle(ev.PeerConnected(wire_hello({**BACKUP, "state": "SYNCING"})), 0.1)
    end = m.deadline(0.1)
    assert end is not None
    m.check(end + 1.0)
    assert m.state is State.STANDALONE and not m.witness_lease.valid(end + 1.0)
    m.handle(wire_sync({"request": True, "last_seq": 0}), end + 1.0)
    m.handle(ev.SyncServed(0), end + 1.0)
    out = m.handle(ev.BackupAcked(0), end + 1.0)
    assert m.phase is Phase.JOINING and m.state is State.STANDALONE
    assert not [e for e in out if isinstance(e, ev.StateChanged)]
    now = end + 1.1
    out = m.handle(ev.Heartbeat(wire_hello({**BACKUP, "state": "PASSIVE", "in_sync": True,
                                 "echo": now - 0.05})), now)
    assert m.phase is Phase.ACTIVE and m.peer_lease.valid(now)
    assert announced(out, "STANDALONE") == ["STANDALONE", "ACTIVE"]
    m.handle(ev.BackupAcked(9), now)
    assert m.confirmable(9, 4, now) == 9  # confirms again, on the backup's promise


def test_every_phase_has_a_row_and_stopped_is_the_end() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert TRANSITIONS[Phase.STOPPED] == frozenset()
    reachable = {Phase.STARTING}
    frontier = [Phase.STARTING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == set(Phase)


def _value(phase: Phase) -> dict[str, object]:
    if phase is Phase.ACTIVATING:
        return {"activation": Activation("test", Step.GRANT, Phase.WAITING, 1)}
    if phase is Phase.ELECTED:
        return {"elected": Elected((1, 3))}
    if phase is Phase.HANDING_OVER:
        return {"hand_over": HandOver("test", HandOverStep.DRAINING, 9.0, False)}
    if phase is Phase.STEPPING_DOWN:
        return {"stepping_down": SteppingDown("test", Phase.WAITING)}
    return {}


@pytest.mark.parametrize("old", list(Phase), ids=lambda p: p.value)
def test_enter_takes_exactly_the_table(old: Phase) -> None:
    """From each phase: every transition the table allows is taken, announced when the
    reported state changes; every other one raises, and changes nothing."""
    for new in Phase:
        m, _ = standalone(now=0.0)
        m.phase = old  # set up directly: this is the test of _enter itself
        m.activation = _value(old).get("activation")  # type: ignore[assignment]
        m.elected = _value(old).get("elected")  # type: ignore[assignment]
        m.hand_over = _value(old).get("hand_over")  # type: ignore[assignment]
        m.stepping_down = _value(old).get("stepping_down")  # type: ignore[assignment]
        before = m.state
        m._drain()
        if new in TRANSITIONS[old]:
            m._enter(new, "test", **_value(new))  # type: ignore[arg-type]
            changes = [e for e in m._drain() if isinstance(e, ev.StateChanged)]
            assert m.phase is new
            reported = State(REPORTED[Phase.WAITING]) if new is Phase.ACTIVATING else \
                REPORTED[new]
            assert m.state is reported
            assert changes == ([] if reported is before
                               else [ev.StateChanged(before.value, reported.value, "test")])
        else:
            with pytest.raises(IllegalTransition):
                m._enter(new, "test", **_value(new))  # type: ignore[arg-type]
            assert m.phase is old and m.state is before


def test_a_phase_entered_without_its_step_value_raises() -> None:
    m, _ = standalone(now=0.0)
    with pytest.raises(IllegalTransition):
        m._enter(Phase.STEPPING_DOWN, "no value")
    with pytest.raises(IllegalTransition):
        m._enter(Phase.JOINING, "a value it does not carry",
                 stepping_down=SteppingDown("x", Phase.WAITING))


def test_an_input_the_machine_does_not_take_is_logged_and_dropped() -> None:
    m, _ = standalone(now=0.0)
    out = m.handle(Tick(0.1), 0.1)  # type: ignore[arg-type]  # the shared-store machine's
    log = one(out, ev.Log)
    assert log.message == "Tick is not an input of phase standalone: dropped"
    assert m.state is State.STANDALONE
