"""What the pair's state machines are fed (inputs) and what they ask for (effects).

Both policies' machines (ha/replication.py, ha/shared_store.py) speak this vocabulary;
the shared-store one adds its lock's inputs and effects (and a `Tick` input). The machines
are sans-IO: a driver in server/ turns sockets, timers and the witness's answers into the
inputs below, hands them to the machine, and carries out the effects it gets back, in
order. Times are seconds on the driver's
monotonic clock; nothing here reads a clock or touches a socket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pairmq.ha import channel as ch
from pairmq.ha.messages import (
    ChannelMessage,
    Failback,
    FailbackStep,
    MessageError,
    PeerHello,
    SeqMessage,
    SyncOffer,
    SyncRequest,
    WitnessPurpose,
    WitnessReply,
)

# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class PeerConnected:
    """An authenticated HA channel to the peer is up; `hello` is what it said."""

    hello: PeerHello


@dataclass(frozen=True)
class PeerLost:
    reason: str


@dataclass(frozen=True)
class Heartbeat:
    hello: PeerHello


@dataclass(frozen=True)
class HeartbeatAhead:
    """A heartbeat read while messages ahead of it (records being applied) are still being
    handled; the same `Heartbeat` follows in its turn. An in-sync backup promises on it at
    once: the active counts its lease from the echo, and must not see it go stale because
    the backup is busy applying what the active sent before."""

    hello: PeerHello


@dataclass(frozen=True)
class SyncRequested:
    """Active side: the backup asks to be synchronised (its journal's end and epochs)."""

    request: SyncRequest

    @property
    def journal(self) -> tuple[int, int]:
        """The asking backup's journal as it states it: (epoch, last seq)."""
        return self.request.journal


@dataclass(frozen=True)
class SyncServed:
    """Active side: everything up to `seq` went to the backup; the live stream follows."""

    seq: int


@dataclass(frozen=True)
class SyncOffered:
    """Backup side: the active starts a synchronisation ("full" replaces our journal)."""

    mode: str
    first: int


@dataclass(frozen=True)
class SyncDone:
    """Backup side: the active sent everything up to `seq`."""

    seq: int


@dataclass(frozen=True)
class MirrorProgress:
    """Backup side: the mirrored journal holds records up to `appended` (written) and
    `synced` (on disk)."""

    appended: int
    synced: int


@dataclass(frozen=True)
class BackupAcked:
    seq: int


@dataclass(frozen=True)
class FailbackMessage:
    step: FailbackStep
    seq: int | None = None  # GO: the last record the backup holds


@dataclass(frozen=True)
class WitnessReplied:
    """The answer to an `AskWitness` (None: the witness could not be reached)."""

    purpose: WitnessPurpose
    reply: WitnessReply | None
    requested_at: float


@dataclass(frozen=True)
class Recovered:
    """`BecomeActive` is done: the server serves its journal at `epoch`. `now`: when (the
    shared-store machine is given no other time with it)."""

    epoch: int
    now: float = 0.0


@dataclass(frozen=True)
class SteppedDown:
    """`StepDown` is done: the journal was read back, the server is a standby again."""


@dataclass(frozen=True)
class JournalStalled:
    """This server's journal has had a write in flight for `waited` seconds, past [store]
    stall_timeout_ms: its disk does not complete writes (store/stall.py, issue 35)."""

    waited: float


@dataclass(frozen=True)
class JournalFlowing:
    """The stalled write completed: the disk completes writes again."""


@dataclass(frozen=True)
class Force:
    """An operator's `pairmq activate`."""


@dataclass(frozen=True)
class Shutdown:
    """The server is stopping."""


Event = (PeerConnected | PeerLost | Heartbeat | HeartbeatAhead | SyncRequested | SyncServed
         | SyncOffered | SyncDone | MirrorProgress | BackupAcked | FailbackMessage | WitnessReplied
         | Recovered | SteppedDown | JournalStalled | JournalFlowing | Force | Shutdown)

# ---------------------------------------------------------------- effects


@dataclass(frozen=True)
class Send:
    """A control message to the peer: its kind (ha/channel.py) and what it says (its wire
    form is the payload's `to_wire()`)."""

    kind: int
    payload: ChannelMessage


@dataclass(frozen=True)
class AskWitness:
    """One request to the witness; its answer comes back as `WitnessReplied(purpose)`.
    A machine never has two requests out at once."""

    purpose: WitnessPurpose
    request: dict[str, Any]


@dataclass(frozen=True)
class BecomeActive:
    """Serve this server's journal at `epoch` (a new serving role); `Recovered` follows.
    None (shared store): one above the shared journal's newest, known after the replay."""

    epoch: int | None


@dataclass(frozen=True)
class BecomePassive:
    """Shared store: stop serving, as a standby role. Replication: a standby role that
    does not serve (a serving one gets `StepDown`) opens its journal to mirror the peer's.
    `drain`: let the journal reach the disk first (shared store, while the lock is proven)."""

    why: str
    drain: bool = False


@dataclass(frozen=True)
class StepDown:
    """Replication: stop serving at once (the clients are closed in this step), then read
    the journal back into a new broker off the event loop, as a standby whose journal can
    mirror the peer's; `SteppedDown` follows. (A serving broker had sessions: the journal,
    not the broker, says what is stored.)"""

    why: str


@dataclass(frozen=True)
class BeginEpoch:
    """Journal a new epoch while serving (adopted by a witness that granted higher)."""

    epoch: int


@dataclass(frozen=True)
class ServeSync:
    """Active side: stream the records the backup lacks, then `SyncServed`."""

    request: SyncRequest


@dataclass(frozen=True)
class WipeJournal:
    """Backup side: a full synchronisation replaces the journal, from `first`."""

    first: int


@dataclass(frozen=True)
class CloseClients:
    message: str
    active: str | None


@dataclass(frozen=True)
class Persist:
    """Journal whatever the serving role has not yet written (before a hand-over)."""


@dataclass(frozen=True)
class ConfirmationsChanged:
    """What may be confirmed changed (lease, backup ack, state): recompute receipts."""


@dataclass(frozen=True)
class StateChanged:
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class PeerStateChanged:
    old: str
    new: str


@dataclass(frozen=True)
class Log:
    """Something an operator should read (level: logging's numbers)."""

    level: int
    message: str


Effect = (Send | AskWitness | BecomeActive | BecomePassive | StepDown | BeginEpoch | ServeSync
          | WipeJournal | CloseClients | Persist | ConfirmationsChanged | StateChanged
          | PeerStateChanged | Log)


def from_channel(kind: int, message: dict[str, Any]) -> Event | None:
    """The machine's input for a control message of the HA channel (ha/channel.py), as
    the real driver and the simulator both read it; None for a kind the driver handles
    itself (RECORDS, HORIZON) or does not know. A message that does not say what it
    must raises MessageError (a ChannelError)."""
    try:
        if kind == ch.HEARTBEAT:
            return Heartbeat(PeerHello.from_wire(message))
        if kind == ch.ACK:
            return BackupAcked(SeqMessage.from_wire(message).seq)
        if kind == ch.SYNC:
            if "request" in message:
                return SyncRequested(SyncRequest.from_wire(message))
            offer = SyncOffer.from_wire(message)
            return SyncOffered(offer.mode, offer.first)
        if kind == ch.SYNC_DONE:
            return SyncDone(SeqMessage.from_wire(message).seq)
        if kind == ch.FAILBACK:
            failback = Failback.from_wire(message)
            return FailbackMessage(failback.step, failback.seq)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, MessageError):
            raise
        raise MessageError(f"{ch.NAMES.get(kind, kind)}: {e!r}") from None
    return None


def witness_replied(purpose: WitnessPurpose, reply: dict[str, Any] | None,
                    requested_at: float) -> WitnessReplied:
    """The machine's input for the witness's answer (None: no answer)."""
    return WitnessReplied(purpose, None if reply is None else WitnessReply.from_wire(reply),
                          requested_at)
