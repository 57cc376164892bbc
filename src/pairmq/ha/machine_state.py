"""What the parts of the replication machine share: its state, the one way its phase
changes, its output, and the steps each part asks of another.

`ReplicationMachine` (ha/replication.py: the dispatch of inputs to its phases' step
functions, ha/steps.py and ha/serving_steps.py) is written in parts, one file each: the
peer, serving and the backup side (rules.py), activations (activation.py), hand-overs
(handover.py) and the witness's requests (witnessing.py); what it does of its own accord
after every input is the table of decisions.py. Each part extends this class, so every
member a part reads is declared here, with its type; a step one part asks of another is
declared below with its signature, and defined by the part that owns it.
"""

from __future__ import annotations

from typing import Any

from pairmq.ha.election import Standing, elected, forked
from pairmq.ha.events import Effect, StateChanged
from pairmq.ha.lease import LeaseView
from pairmq.ha.messages import NO_PEER, NO_REPLY, PeerHello, WitnessPurpose, WitnessReply
from pairmq.ha.phases import (
    IN_SYNC,
    REPORTED,
    SERVING,
    TRANSITIONS,
    Activation,
    Elected,
    HandOver,
    IllegalTransition,
    Journal,
    JournalDisk,
    Phase,
    Settings,
    SteppingDown,
)
from pairmq.ha.states import State
from pairmq.ha.witness_queue import WitnessQueue


class MachineState:
    def __init__(self, settings: Settings, journal: Journal, started: float = 0.0) -> None:
        self.cfg = settings
        self.journal = journal
        self.phase = Phase.STARTING
        self.activation: Activation | None = None  # ACTIVATING: its step
        self.elected: Elected | None = None  # ELECTED: the peer's journal elected over
        self.hand_over: HandOver | None = None  # HANDING_OVER: its step
        self.stepping_down: SteppingDown | None = None  # STEPPING_DOWN: where it goes next
        self.peer: PeerHello = NO_PEER
        self.peer_state = State.DEAD  # DEAD: no HA channel
        self.peer_farewell = False  # the connected peer said it stops without failover
        self.order = False  # an operator's force, until this server serves or sees a server
        self.witness_info: WitnessReply = NO_REPLY  # the witness's last answer
        self.witness_lease = LeaseView()
        self.peer_lease = LeaseView()  # serving: the in-sync backup's promise
        # Backup: I promised not to take over before this. A process that starts may have
        # promised, before it died, what it no longer remembers: one interval from its start.
        self.promise_until = started + settings.activation
        self.peer_echo = 0.0  # backup: the active's last heartbeat time, echoed back
        self.backup_acked = 0
        self.sync_done_seq: int | None = None
        self.next_renew = 0.0
        self.join_target = 0  # JOINING: what the backup must hold to be in sync
        self.retry_at = 0.0  # no new activation before this (the last one was refused)
        self.disk = JournalDisk.FLOWING  # this server's journal, as the driver last said
        self.witness = WitnessQueue(settings.identity, settings.boot)
        self._out: list[Effect] = []
        self._now = 0.0

    # ------------------------------------------------------------ queries

    @property
    def state(self) -> State:
        """What the server reports: during an activation, the state it started from."""
        if self.activation is not None:
            return REPORTED[self.activation.back_to]
        return REPORTED[self.phase]

    @property
    def serving(self) -> bool:
        return self.phase in SERVING

    @property
    def stopped(self) -> bool:
        return self.phase is Phase.STOPPED

    @property
    def connected(self) -> bool:
        return self.peer_state is not State.DEAD

    @property
    def backup_in_sync(self) -> bool:
        return self.phase is Phase.ACTIVE or (self.hand_over is not None)

    @property
    def receipts_wait_for_backup(self) -> bool:
        """Confirmations wait for the backup's acknowledgements (ACTIVE, JOINING): a backup
        that stops acknowledging stops them (server/pair/replication.py drops it)."""
        return self.phase is Phase.ACTIVE or self.phase is Phase.JOINING

    @property
    def in_sync_with_live(self) -> bool:
        return self.phase in IN_SYNC or (
            self.activation is not None and self.activation.back_to in IN_SYNC)

    def _won(self) -> bool:
        """The election against the connected peer, on what it said last (its journal
        may have grown since an activation began: simulator seed 6311)."""
        return elected(self._standing(), Standing.of_peer(self.peer))

    def _forked(self) -> bool:
        """The two journals each opened an epoch after they split (`forked`): electing the
        newer one without the witness may serve a history that lacks confirmed records
        (simulator seed 36008)."""
        return forked(self._standing(), self.journal.epochs, Standing.of_peer(self.peer),
                      self.peer.epochs)

    def _standing(self) -> Standing:
        return Standing(self.journal.epoch, self.journal.appended_seq,
                        self.cfg.role == "primary")

    # ------------------------------------------------------------ the phase

    def _enter(self, phase: Phase, why: str, *, activation: Activation | None = None,
               elected: Elected | None = None, hand_over: HandOver | None = None,
               stepping_down: SteppingDown | None = None) -> None:
        """The one way the phase changes: a transition TRANSITIONS allows (any other
        raises), with the value that phase carries (its step), and a StateChanged
        whenever the reported state changes."""
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(self.phase, phase, why)
        if (activation is not None) != (phase is Phase.ACTIVATING) \
                or (elected is not None) != (phase is Phase.ELECTED) \
                or (hand_over is not None) != (phase is Phase.HANDING_OVER) \
                or (stepping_down is not None) != (phase is Phase.STEPPING_DOWN):
            raise IllegalTransition(self.phase, phase, f"{why} (without its step value)")
        old = self.state
        self.phase = phase
        self.activation = activation
        self.elected = elected
        self.hand_over = hand_over
        self.stepping_down = stepping_down
        self._announce(old, why)

    def _revise(self, activation: Activation, why: str) -> None:
        """A new step of the activation under way (the phase stays ACTIVATING)."""
        assert self.phase is Phase.ACTIVATING
        old = self.state
        self.activation = activation
        self._announce(old, why)

    def _announce(self, old: State, why: str) -> None:
        if self.state != old:
            self._emit(StateChanged(old.value, self.state.value, why))

    # ------------------------------------------------------------ output

    def _emit(self, effect: Effect) -> None:
        self._out.append(effect)

    def _drain(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    # ------------------------------------------------------------ steps of other parts

    def hello(self, now: float) -> PeerHello:
        """What this server says of itself (rules.py)."""
        raise NotImplementedError

    def _decide(self, now: float) -> None:
        """Take the next safe step for the situation, after every input: the first rule of
        decisions.py's table that holds (replication.py)."""
        raise NotImplementedError

    def _step_down(self, why: str, then: Phase = Phase.WAITING) -> None:
        """Stop serving, reported and carried out in this step (rules.py)."""
        raise NotImplementedError

    def _backup_lost(self) -> None:
        """Confirm alone once the witness knows the backup is out of sync (rules.py)."""
        raise NotImplementedError

    def _ask(self, purpose: WitnessPurpose, fields: dict[str, Any]) -> None:
        """Queue a witness request (witnessing.py)."""
        raise NotImplementedError

    def _renew(self) -> None:
        """Ask the witness to renew the lease (witnessing.py)."""
        raise NotImplementedError

    def _on_activation_reply(self, reply: WitnessReply | None, requested_at: float) -> None:
        """The witness answered the activation under way (activation.py)."""
        raise NotImplementedError

    def _handed_over(self) -> None:
        """The lease is given back: say "go" to the backup (handover.py)."""
        raise NotImplementedError
