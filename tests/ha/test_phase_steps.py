"""The replication machine's per-phase dispatch (ha/steps.py, ha/serving_steps.py): every
phase has a step function, and an input a phase does not take is dropped on purpose, with
a debug line naming the phase, and nothing else."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from copy import deepcopy

import pytest

from pairmq.ha import events as ev
from pairmq.ha import serving_steps, steps
from pairmq.ha.messages import FailbackStep
from pairmq.ha.phases import Phase
from pairmq.ha.replication import STEPS, ReplicationMachine
from pairmq.ha.shared_store import Tick
from tests.ha.test_machine import elected, wire_sync
from tests.ha.test_machine_steps import (
    activating,
    active,
    deferring,
    dropping_backup,
    failback_asked,
    handing_over,
    joining,
    orphaned,
    passive,
    standalone_alone,
    starting,
    stepping_down,
    stopping,
    syncing,
    taking_over,
    waiting,
)

P = Phase
Machine = ReplicationMachine


def stopped() -> Machine:
    m = starting()
    m.handle(ev.Shutdown(), 0.0)
    return m


SYNC_ASKED = wire_sync({"request": True, "epoch": 1, "last_seq": 1})
GO = ev.FailbackMessage(FailbackStep.GO, 1)
# For each phase: a machine in it, and an input its step function does not take (its
# step's docstring says why, where it is not plain).
NOT_TAKEN: dict[Phase, tuple[Callable[[], Machine], ev.Event]] = {
    P.STARTING: (starting, ev.SyncServed(1)),  # nothing served: it does not serve
    P.WAITING: (waiting, ev.SteppedDown()),
    P.DEFERRING: (deferring, SYNC_ASKED),
    P.SYNCING: (syncing, ev.Force()),  # a backup refuses an operator's force
    P.PASSIVE: (passive, ev.Force()),
    P.FAILBACK_ASKED: (failback_asked, ev.Recovered(1)),
    P.TAKING_OVER: (taking_over, SYNC_ASKED),
    P.ORPHANED: (orphaned, ev.SteppedDown()),
    P.ACTIVATING: (activating, SYNC_ASKED),  # seen in the simulator: a request too early
    P.ELECTED: (lambda: elected()[0], ev.Force()),  # it serves already
    P.STANDALONE: (standalone_alone, GO),  # nobody hands over to a server
    P.DROPPING_BACKUP: (dropping_backup, ev.FailbackMessage(FailbackStep.REQUEST)),
    P.JOINING: (joining, ev.Recovered(1)),
    P.ACTIVE: (active, ev.SteppedDown()),
    P.HANDING_OVER: (handing_over, SYNC_ASKED),  # no synchronisation while handing over
    P.STEPPING_DOWN: (stepping_down, GO),  # not before the journal is read back
    P.STOPPING: (stopping, ev.SteppedDown()),
    P.STOPPED: (stopped, SYNC_ASKED),
}


def state_of(m: Machine) -> dict[str, str]:
    """Everything the machine keeps (the time of its last input aside), comparably."""
    kept = {k: repr(v) for k, v in vars(m).items() if k not in ("_now", "witness", "journal")}
    kept["witness"] = repr(sorted(vars(m.witness).items()))
    kept["journal"] = repr(m.journal)
    return kept


def test_every_phase_has_a_step_function() -> None:
    """No phase falls through to a default: each one's step function is named in STEPS."""
    assert set(STEPS) == set(Phase)
    defined = {f for module in (steps, serving_steps)
               for name, f in inspect.getmembers(module, inspect.isfunction)
               if name.startswith("step_") and f.__module__ == module.__name__}
    assert set(STEPS.values()) == defined  # and every step function is some phase's


def test_every_phase_has_an_input_it_drops_here() -> None:
    assert set(NOT_TAKEN) == set(Phase)


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
def test_an_input_the_phase_does_not_take_is_dropped(phase: Phase) -> None:
    recipe, event = NOT_TAKEN[phase]
    m = recipe()
    m._drain()
    assert m.phase is phase
    now = m._now  # the instant of the recipe's last input: nothing runs out meanwhile
    twin = deepcopy(m)
    out = m.handle(event, now)
    # the step took nothing from it: the debug line, then `_decide` exactly as it would
    # have run without the input (it runs after every input, taken or dropped)
    twin._now = now
    twin._decide(now)
    log = ev.Log(logging.DEBUG, f"{type(event).__name__} is not an input of phase "
                                f"{phase.value}: dropped")
    assert out == [log, *twin._drain()]
    assert state_of(m) == state_of(twin)
    if phase is not P.STARTING:  # STARTING decides at once (here: it asks the witness)
        assert out == [log]
        assert m.phase is phase


@pytest.mark.parametrize("phase", [P.SYNCING, P.ACTIVE, P.STEPPING_DOWN],
                         ids=lambda p: p.value)
def test_an_input_not_of_the_machine_is_dropped_in_any_phase(phase: Phase) -> None:
    m = NOT_TAKEN[phase][0]()
    m._drain()
    out = m.handle(Tick(m._now), m._now)  # type: ignore[arg-type]  # the shared store's
    assert ev.Log(logging.DEBUG, f"Tick is not an input of phase {phase.value}: "
                                 "dropped") in out
    assert m.phase is phase


@pytest.mark.parametrize("recipe,event", [(starting, GO), (stopping, GO), (stopped, GO),
                                          (stopped, ev.Shutdown())],
                         ids=["go-starting", "go-stopping", "go-stopped", "shutdown-stopped"])
def test_a_go_or_shutdown_nobody_expects_is_dropped_not_raised(recipe, event) -> None:
    """A "go" reaches only a standby (the peer hands over to an in-sync backup), and a
    stopped machine has no way out: such an input (a stale message, a second SIGTERM) is
    dropped with its debug line; it used to raise IllegalTransition in the driver."""
    m = recipe()
    m._drain()
    phase = m.phase
    out = m.handle(event, m._now)
    assert ev.Log(logging.DEBUG, f"{type(event).__name__} is not an input of phase "
                                 f"{phase.value}: dropped") in out
    assert m.phase is phase or phase is P.STARTING
