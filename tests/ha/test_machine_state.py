"""The replication machine's parts share one state base (ha/machine_state.py): every step
one part asks of another is declared there, and the part its docstring names defines it."""

from __future__ import annotations

from pairmq.ha.machine_state import MachineState
from pairmq.ha.replication import ReplicationMachine
from tests.support.state_bases import declared_steps, step_problems


def test_every_declared_step_is_defined_by_the_part_it_names() -> None:
    assert len(declared_steps(MachineState)) >= 5  # the declarations are read
    assert step_problems(MachineState, ReplicationMachine) == []
