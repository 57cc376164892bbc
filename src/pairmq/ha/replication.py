"""The pair under the replication policy, as a sans-IO state machine.

`ReplicationMachine.handle(event, now)` takes one input (ha/events.py) and returns the
effects to carry out, in order; `tick(now)` is called every heartbeat and at
`deadline()`. No clock, socket or task lives here: the driver (server/pair/replication.py)
does the I/O. What each phase answers to is its step function (`STEPS`, at the end; the
steps are in ha/steps.py and ha/serving_steps.py): an input the current phase does not
take is logged at debug level and dropped. After every input, taken or dropped, `_decide`
applies the first rule of the table DECISIONS (ha/decisions.py) that holds. The rules
(docs/ha.md has the argument):

- A server confirms writes only while serving and while it holds the witness's lease
  or its in-sync backup's promise not to take over (no witness configured: always,
  with a loud warning). The moment it holds neither, and no peer follows it, it is not
  serving any more: it reports WAITING and closes its clients, in the same step.
- With an in-sync backup and synchronous replication, a record is confirmed only once
  the backup has it (on its disk, with backup_ack = "fsync").
- Before confirming on its own after losing its backup, the active tells the witness it
  has no in-sync backup any more; only an in-sync backup may take over.
- A backup takes over only after its own promise to the active has run out and the
  witness granted it the lease with a higher epoch; every activation writes its epoch
  to the journal first.

Steps that take time (an activation, a hand-over, a stop) are states of their own, with
their step as a value (`Activation.step`, `HandOver.step`), never flags.
"""

from __future__ import annotations

from collections.abc import Callable

from pairmq.ha.decisions import decide
from pairmq.ha.events import Effect, Event
from pairmq.ha.phases import Phase
from pairmq.ha.rules import ReplicationRules
from pairmq.ha.serving_steps import (
    step_active,
    step_alone,
    step_elected,
    step_handing_over,
    step_joining,
)
from pairmq.ha.steps import (
    step_activating,
    step_deferring,
    step_in_sync,
    step_orphaned,
    step_stepping_down,
    step_stopped,
    step_stopping,
    step_syncing,
    step_taking_over,
    step_undecided,
)

__all__ = ["STEPS", "ReplicationMachine"]


class ReplicationMachine(ReplicationRules):
    """The pair under the replication policy: inputs go to the current phase's step
    function (`STEPS`); the rules they apply are ReplicationRules' (ha/rules.py); what it
    does of its own accord after each is the table DECISIONS (ha/decisions.py)."""

    def handle(self, event: Event, now: float) -> list[Effect]:
        """One input: the current phase's step function (`STEPS`) takes it, or drops it with
        a debug line. `_decide` then runs after every input, taken or dropped: it reads the
        situation, not the input."""
        self._now = now
        STEPS[self.phase](self, event, now)
        self._decide(now)
        return self._drain()

    def _decide(self, now: float) -> None:
        decide(self, now)

P = Phase
# What each phase answers to: its step function (ha/steps.py, ha/serving_steps.py), one per
# phase or per group of phases that answer alike. tests/ha/test_phase_steps.py checks that
# every phase has one.
STEPS: dict[Phase, Callable[[ReplicationMachine, Event, float], None]] = {
    P.STARTING: step_undecided, P.WAITING: step_undecided,
    P.DEFERRING: step_deferring,
    P.SYNCING: step_syncing,
    P.PASSIVE: step_in_sync, P.FAILBACK_ASKED: step_in_sync,
    P.TAKING_OVER: step_taking_over,
    P.ORPHANED: step_orphaned,
    P.ACTIVATING: step_activating,
    P.ELECTED: step_elected,
    P.STANDALONE: step_alone, P.DROPPING_BACKUP: step_alone,
    P.JOINING: step_joining,
    P.ACTIVE: step_active,
    P.HANDING_OVER: step_handing_over,
    P.STEPPING_DOWN: step_stepping_down,
    P.STOPPING: step_stopping,
    P.STOPPED: step_stopped,
}
