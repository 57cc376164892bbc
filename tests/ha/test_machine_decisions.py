"""The replication machine's decisions as one table (ha/decisions.py): which phases it
covers, and that in every situation a phase it covers can be in, the rule that holds
takes a step TRANSITIONS allows."""

from __future__ import annotations

import itertools
import logging

import pytest

from pairmq.ha import events as ev
from pairmq.ha.decisions import DECISIONS
from pairmq.ha.messages import PeerHello
from pairmq.ha.phases import SERVING, TRANSITIONS, JournalDisk, Phase
from pairmq.ha.states import State
from tests.ha.test_machine import machine

P = Phase
DECIDED = {P.STARTING, P.WAITING, P.DEFERRING, P.SYNCING, P.PASSIVE, P.FAILBACK_ASKED,
           P.TAKING_OVER, P.ORPHANED, P.ACTIVE}


def test_the_phases_in_no_rule_are_moved_by_their_own_inputs_only() -> None:
    covered = set().union(*(rule.phases for rule in DECISIONS))
    assert covered == DECIDED
    assert set(Phase) - covered == (SERVING - {P.ACTIVE}) | {
        P.ACTIVATING, P.STEPPING_DOWN, P.STOPPING, P.STOPPED}
    assert all(rule.why for rule in DECISIONS)


@pytest.mark.parametrize("phase", sorted(DECIDED), ids=lambda p: p.value)
def test_every_situation_takes_a_step_the_transitions_allow(phase: Phase) -> None:
    """Every peer state, with and without a witness, an operator's order, a farewell, a
    promise run out, a primary with failback or a backup: the rules never ask for a
    phase change TRANSITIONS lacks (a rule that `goes_on` may take two in a row)."""
    peer_states = [State.DEAD, State.STARTING, State.WAITING, State.SYNCING, State.PASSIVE,
                   State.STANDALONE, State.ACTIVE]
    for peer_state, witness, order, farewell, ran_out, role, newer, disk in itertools.product(
            peer_states, (True, False), (True, False), (True, False), (True, False),
            ("primary", "backup"), (True, False), tuple(JournalDisk)):
        m, journal = machine(role=role, witness=witness)
        m.phase = phase  # set up directly: the situation, not how it came about
        m.disk = disk
        m.peer_state = peer_state
        other = "backup" if role == "primary" else "primary"
        m.peer = PeerHello(name=other, identity=f"{other}#1", role=other, state=peer_state,
                           epoch=1, last_seq=5 if newer else 3)
        journal.epoch, journal.appended_seq = 1, 4
        m.order, m.peer_farewell = order, farewell
        m.promise_until = 0.0 if ran_out else 100.0
        m._now = 10.0
        m._decide(10.0)
        out = m._drain()
        changes = [e for e in out if isinstance(e, ev.StateChanged)]
        assert len(changes) <= 2, out
        now = m.phase
        assert now is phase or now in TRANSITIONS[phase] \
            or any(now in TRANSITIONS[via] for via in TRANSITIONS[phase]), out
        if order and m.connected and peer_state.serving and phase is not P.ACTIVE:
            assert not m.order
            assert ev.Log(logging.WARNING, f"Forced activation cancelled: {other} is "
                                           "serving, this server synchronises from it") in out
