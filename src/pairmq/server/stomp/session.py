"""The server's side of one STOMP connection, sans-IO: its phase, why its frames wait, and
whether a frame may be applied (its phase, its command, the [security] rules). The
asyncio shell (server/stomp/connection.py) feeds it and does what it decides; no I/O, no clock.

Phases (one transition table, as protocol/session.py's for the client side):

    AWAITING_CONNECT --a CONNECT checked at once--> CONNECTED --DISCONNECT--> DISCONNECTING
          \\--a CONNECT whose check takes time--> LOGGING_IN --logged in--/
    every phase --closed (an ERROR, a close, the socket lost)--> CLOSED

A broker session (core/session.py) exists exactly in CONNECTED and DISCONNECTING: leaving
them for CLOSED ends it, closed or parked for its connection_ttl (server/role/parking.py).

Frames are applied in AWAITING_CONNECT (CONNECT or STOMP only) and CONNECTED (anything but
those two). In LOGGING_IN they wait for the login's outcome; after a DISCONNECT and once
closed they are ignored. In CONNECTED they also wait while `wait` names a reason.

What becomes of a frame read now is one value, `intake` (apply, hold, ignore), and which
commands the phase applies is `applies`: both follow from the phase and the wait, and are
set whenever either changes, so that the shell asks one attribute per frame, not a chain
of tests (every frame of every connection passes here).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from pairmq.core.permissions import Exists, Refusal, SecurityRules, needed


class Phase(StrEnum):
    AWAITING_CONNECT = "awaiting-connect"  # the socket is open; no CONNECT taken yet
    LOGGING_IN = "logging-in"  # a CONNECT's password is checked in a thread, or its
    # attempt waits out the delay of its host's failed logins (server/guards/failed_logins.py)
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"  # DISCONNECT taken: closes once its RECEIPT is out
    CLOSED = "closed"  # an ERROR was sent, the server closed it, or the socket is gone


class Intake(StrEnum):
    """What becomes of a frame read now."""

    APPLY = "apply"  # applied at once (its command still checked against `applies`)
    HOLD = "hold"  # kept in the backlog, reading paused, until the wait or the login ends
    IGNORE = "ignore"  # after a DISCONNECT, or closed


class Wait(StrEnum):
    """Why frames wait in the backlog, reading paused, instead of being applied."""

    NONE = "none"  # they are applied as they come
    TURN = "turn"  # this turn of the event loop spent its budget (server/guards/turn_budget.py)
    ROOM = "room"  # the server is full: journal, disk or memory (full_policy block)
    ADDRESS = "address"  # a destination is full (address_full_policy block)
    CONFIRM = "confirm"  # an ERROR waits for the records of earlier output to be confirmed
    BATCH = "batch"  # a batched SEND is routed a slice per turn
    COMMIT = "commit"  # a large COMMIT is applied a slice per turn (core/broker/committing.py)


_A, _L, _C, _D, _X = (Phase.AWAITING_CONNECT, Phase.LOGGING_IN, Phase.CONNECTED,
                      Phase.DISCONNECTING, Phase.CLOSED)

# (phase, what happened) -> the next phase
TRANSITIONS: dict[tuple[Phase, str], Phase] = {
    (_A, "checking"): _L,
    (_L, "checking"): _L,  # a delayed attempt, then its password checked in a thread
    (_A, "logged-in"): _C,
    (_L, "logged-in"): _C,
    (_C, "DISCONNECT"): _D,
    (_A, "closed"): _X,
    (_L, "closed"): _X,
    (_C, "closed"): _X,
    (_D, "closed"): _X,
    (_X, "closed"): _X,
}

CONNECTS: Final = frozenset({"CONNECT", "STOMP"})
COMMANDS: Final = frozenset({"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK",
                             "NACK", "BEGIN", "COMMIT", "ABORT", "DISCONNECT"})
OWN_RECEIPTS: Final = frozenset({"CONNECT", "STOMP", "DISCONNECT"})  # answered by their handler
COUNTED: Final = COMMANDS - CONNECTS  # applied, they count among a resumed session's `frames`

# phase -> the commands it applies (any other is refused: `refusal` says why)
APPLIES: dict[Phase, frozenset[str]] = {
    _A: CONNECTS, _L: frozenset(), _C: COMMANDS - CONNECTS, _D: frozenset(), _X: frozenset()}
# phase -> what becomes of its frames while nothing waits (`wait` is NONE)
INTAKE: dict[Phase, Intake] = {
    _A: Intake.APPLY, _L: Intake.HOLD, _C: Intake.APPLY, _D: Intake.IGNORE,
    _X: Intake.IGNORE}


class InvalidTransition(Exception):
    """A bug: the shell reported something its session's phase does not allow."""


class ServerSession:
    """One connection's STOMP state on the server."""

    __slots__ = ("_wait", "applies", "closed", "frames", "intake", "login", "phase", "roles",
                 "version")

    def __init__(self) -> None:
        self.phase = Phase.AWAITING_CONNECT
        self._wait = Wait.NONE
        self.applies = APPLIES[self.phase]  # the commands applied in this phase
        self.intake = INTAKE[self.phase]  # what becomes of a frame read now
        self.closed = False  # in CLOSED (read on every read and delivery: not a property)
        self.version = "1.2"
        self.login: str | None = None
        self.roles: frozenset[str] = frozenset()  # the user's, for [security] rules
        self.frames = 0  # frames applied after CONNECT (what a resumed session reports)

    def step(self, event: str) -> Phase:
        """Apply an event; returns the phase it left."""
        old = self.phase
        new = TRANSITIONS.get((old, event))
        if new is None:
            raise InvalidTransition(f"{event!r} in phase {old}")
        self.phase = new
        self.applies = APPLIES[new]
        self.closed = new is _X
        self._settle_intake()
        return old

    @property
    def wait(self) -> Wait:
        """Why frames wait in the backlog (NONE: they do not)."""
        return self._wait

    @wait.setter
    def wait(self, why: Wait) -> None:
        self._wait = why
        self._settle_intake()

    def _settle_intake(self) -> None:
        intake = INTAKE[self.phase]
        if intake is Intake.APPLY and self._wait is not Wait.NONE:
            intake = Intake.HOLD
        self.intake = intake

    # ------------------------------------------------------------ what the phase allows

    @property
    def holds_frames(self) -> bool:
        """Frames read now wait in the backlog (a login is checked, or `wait`)."""
        return self.intake is Intake.HOLD

    @property
    def owns_broker_session(self) -> bool:
        return self.phase is _C or self.phase is _D

    @property
    def connected(self) -> bool:
        return self.phase is _C

    def refusal(self, command: str) -> str | None:
        """Why a frame with this command may not be applied in this phase (the ERROR's
        message), or None."""
        if command not in COMMANDS:
            return f"unknown command {command!r}"
        if self.phase is _A:
            if command not in CONNECTS:
                return f"not connected: the first frame must be CONNECT or STOMP, not {command}"
            return None
        if command in CONNECTS:
            return "already connected"
        if self.phase is not _C:
            return f"not connected ({self.phase})"
        return None

    def denial(self, command: str, headers: Mapping[str, str], rules: SecurityRules | None,
               exists: Exists) -> Refusal | None:
        """What the [security] rules refuse this frame, or None (core/permissions.py). Every
        frame is checked here, before its handler runs, so a refused one stores nothing."""
        if rules is None:
            return None
        return rules.refusal(self.login, self.roles, needed(command, headers, exists))
