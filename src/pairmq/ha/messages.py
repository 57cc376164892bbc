"""What the peer and the witness say, as typed values read once at the edge.

The HA channel and the witness speak JSON objects (ha/channel.py, ha/lease.py). The
drivers turn each one into a frozen value here before the machines see it, so that the
decisions read fields, not dictionaries: a missing field takes the default a server that
never said it would mean, and a field of the wrong type is refused at the edge
(`MessageError`), never cast inside a decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pairmq.ha.channel import ChannelError
from pairmq.ha.states import State


class MessageError(ChannelError):
    """A peer's or the witness's message that does not say what it must (the channel that
    carried it is closed as for any protocol error)."""


class WitnessPurpose(StrEnum):
    """Why the machine asked the witness (its reply goes back to that step)."""

    ACTIVATION = "activation"
    RENEW = "renew"
    ADOPT = "adopt"
    RELEASE = "release"
    STOP = "stop"


class FailbackStep(StrEnum):
    """The FAILBACK messages of the HA channel."""

    REQUEST = "request"  # the in-sync primary backup asks for its place back
    GO = "go"  # the active handed over up to `seq`: take over
    SHUTDOWN = "shutdown"  # the active stops without failover: do not take over


def _str(message: Mapping[str, Any], key: str, default: str = "") -> str:
    value = message.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise MessageError(f"{key!r} must be a string, not {value!r}")
    return value


def _int(message: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = message.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise MessageError(f"{key!r} must be an integer, not {value!r}")
    return value


def _needed_int(message: Mapping[str, Any], key: str) -> int:
    """An integer the message must carry (no default stands in for it)."""
    if message.get(key) is None:
        raise MessageError(f"{key!r} is missing")
    return _int(message, key)


def _optional_int(message: Mapping[str, Any], key: str) -> int | None:
    return None if message.get(key) is None else _int(message, key)


def _float(message: Mapping[str, Any], key: str) -> float:
    value = message.get(key, 0.0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MessageError(f"{key!r} must be a number, not {value!r}")
    return float(value)


def _bool(message: Mapping[str, Any], key: str) -> bool:
    value = message.get(key, False)
    if not isinstance(value, bool):
        raise MessageError(f"{key!r} must be true or false, not {value!r}")
    return value


def _epochs(message: Mapping[str, Any]) -> tuple[tuple[int, int], ...]:
    value = message.get("epochs") or []
    if not isinstance(value, list | tuple):
        raise MessageError(f"'epochs' must be a list, not {value!r}")
    out = []
    for item in value:
        if not (isinstance(item, list | tuple) and len(item) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
            raise MessageError(f"'epochs' must hold [epoch, first seq] pairs, not {item!r}")
        out.append((item[0], item[1]))
    return tuple(out)


def _state(message: Mapping[str, Any]) -> State:
    value = _str(message, "state", State.STARTING.value)
    try:
        return State(value)
    except ValueError:
        raise MessageError(f"unknown state {value!r}") from None


@dataclass(frozen=True)
class PeerHello:
    """What a server says of itself, at connection and in every heartbeat."""

    name: str = ""
    identity: str = ""  # name#node-id: the witness tells a stale namesake apart
    role: str = ""  # "primary" | "backup"
    state: State = State.STARTING
    epoch: int = 0
    last_seq: int = 0
    epochs: tuple[tuple[int, int], ...] = ()  # (epoch, its first sequence number)
    stomp: str = ""  # where its clients connect
    stomp_tls: str = ""
    oldest: int = 1  # the oldest record its journal still holds
    ts: float = 0.0  # its clock when it sent this
    echo: float = 0.0  # the serving peer's `ts` it heard last (the promise is counted from it)
    in_sync: bool = False  # an in-sync backup of the serving peer
    lease: bool = False  # serving on the witness's lease

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> PeerHello:
        return cls(name=_str(message, "name"), identity=_str(message, "identity"),
                   role=_str(message, "role"), state=_state(message),
                   epoch=_int(message, "epoch"), last_seq=_int(message, "last_seq"),
                   epochs=_epochs(message), stomp=_str(message, "stomp"),
                   stomp_tls=_str(message, "stomp_tls"), oldest=_int(message, "oldest", 1),
                   ts=_float(message, "ts"), echo=_float(message, "echo"),
                   in_sync=_bool(message, "in_sync"), lease=_bool(message, "lease"))

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "identity": self.identity, "role": self.role,
                "state": self.state.value, "epoch": self.epoch, "last_seq": self.last_seq,
                "epochs": [list(e) for e in self.epochs], "stomp": self.stomp,
                "stomp_tls": self.stomp_tls, "oldest": self.oldest, "ts": self.ts,
                "echo": self.echo, "in_sync": self.in_sync, "lease": self.lease}

    @property
    def primary(self) -> bool:
        return self.role == "primary"


NO_PEER = PeerHello()  # the peer before it said anything


@dataclass(frozen=True)
class StoreHello:
    """What a shared-store server says of itself (its peer reads it as a `PeerHello`, the
    fields it lacks taking their defaults): no journal crosses that channel, so no sequence
    numbers, only the state and the shared journal's epoch."""

    name: str
    role: str
    stomp: str
    stomp_tls: str
    ts: float
    state: State
    epoch: int

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "stomp": self.stomp,
                "stomp_tls": self.stomp_tls, "ts": self.ts, "state": self.state.value,
                "epoch": self.epoch}


# ---------------------------------------------------------------- the HA channel's control
# messages besides the hello, one value per kind (ha/channel.py), each read and written here


@dataclass(frozen=True)
class SyncRequest:
    """SYNC from a backup: what its journal holds (its end, and the first record of each
    epoch), so that the serving peer can tell whether it is a prefix of its own
    (ha/syncplan.py) and, while elected, whether it is the journal elected over."""

    epoch: int = 0
    last_seq: int = 0
    epochs: tuple[tuple[int, int], ...] = ()  # (epoch, its first sequence number)

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> SyncRequest:
        return cls(epoch=_int(message, "epoch"), last_seq=_int(message, "last_seq"),
                   epochs=_epochs(message))

    def to_wire(self) -> dict[str, Any]:
        return {"request": True, "epoch": self.epoch, "last_seq": self.last_seq,
                "epochs": [list(e) for e in self.epochs]}

    @property
    def journal(self) -> tuple[int, int]:
        """The asking backup's journal as it states it: (epoch, last seq)."""
        return self.epoch, self.last_seq


@dataclass(frozen=True)
class SyncOffer:
    """SYNC from the serving peer (no "request" in it): a synchronisation starts, "full"
    (replace the journal) or "incremental", with records `first` to `upto` (more follow
    live, then SYNC_DONE)."""

    mode: str
    first: int
    upto: int

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> SyncOffer:
        if not isinstance(message.get("mode"), str):
            raise MessageError(f"'mode' must be a string, not {message.get('mode')!r}")
        return cls(mode=message["mode"], first=_needed_int(message, "from"),
                   upto=_int(message, "to"))

    def to_wire(self) -> dict[str, Any]:
        return {"mode": self.mode, "from": self.first, "to": self.upto}


@dataclass(frozen=True)
class SeqMessage:
    """A message that names one sequence number: ACK (the backup holds the records up to
    it), SYNC_DONE (everything up to it was sent: the live stream follows), HORIZON (the
    records below it are superseded)."""

    seq: int

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> SeqMessage:
        return cls(_needed_int(message, "seq"))

    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq}


@dataclass(frozen=True)
class Failback:
    """FAILBACK: a step of handing the active's place over (`FailbackStep`); "go" names the
    last record the backup must hold (`seq`)."""

    step: FailbackStep
    seq: int | None = None

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> Failback:
        value = _str(message, "phase")
        try:
            step = FailbackStep(value)
        except ValueError:
            raise MessageError(f"unknown failback step {value!r}") from None
        return cls(step, _optional_int(message, "seq"))

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"phase": self.step.value}
        if self.seq is not None:
            wire["seq"] = self.seq
        return wire


# What a machine sends its peer (`Send.payload`, ha/events.py).
ChannelMessage = PeerHello | SyncRequest | SyncOffer | SeqMessage | Failback


@dataclass(frozen=True)
class WitnessReply:
    """The witness's answer to one request (ha/lease.py `answer`)."""

    granted: bool = False
    holder: str | None = None  # the identity holding the lease (or that held it last)
    epoch: int = 0  # the pair's epoch, the witness's view
    remaining_ms: int = 0  # how long the holder's lease still runs, the witness's clock
    reason: str = ""
    standby: str | None = None  # the backup the holder last declared in sync

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> WitnessReply:
        holder, standby = message.get("holder"), message.get("standby")
        for key, value in (("holder", holder), ("standby", standby)):
            if value is not None and not isinstance(value, str):
                raise MessageError(f"{key!r} must be a string or null, not {value!r}")
        return cls(granted=_bool(message, "granted"), holder=holder,
                   epoch=_int(message, "epoch"), remaining_ms=_int(message, "remaining_ms"),
                   reason=_str(message, "reason"), standby=standby)

    @property
    def holder_name(self) -> str | None:
        """The holder's server name (its identity without the node id)."""
        return self.holder.partition("#")[0] if self.holder else None


NO_REPLY = WitnessReply()  # what the machine knew of the witness before its first answer
