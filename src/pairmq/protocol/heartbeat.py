"""Heart-beat header parsing and negotiation (STOMP 1.1+), pure arithmetic, no timers."""

from __future__ import annotations

from .errors import ProtocolError


def parse_heart_beat(value: str) -> tuple[int, int]:
    """Parse a `heart-beat:cx,cy` value into two millisecond counts.

    Anything but two comma-separated non-negative decimal integers is a ProtocolError;
    blanks around each number are forgiven because some clients write "0, 0".
    """
    parts = value.split(",")
    if len(parts) != 2:
        raise ProtocolError(f'invalid heart-beat: "{value[:40]}"')
    numbers = []
    for part in parts:
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or len(part) > 18:
            raise ProtocolError(f'invalid heart-beat: "{value[:40]}"')
        numbers.append(int(part))
    return numbers[0], numbers[1]


def negotiate_heart_beat(
    local_send: int, local_receive: int, remote_send: int, remote_receive: int
) -> tuple[int, int]:
    """Return (outgoing_ms, incoming_ms) seen from the local side; 0 means none.

    Each direction is active only when the sender can send and the receiver wants to
    receive; its period is then the slower of the two wishes, as the specification says.
    """
    outgoing = max(local_send, remote_receive) if local_send and remote_receive else 0
    incoming = max(remote_send, local_receive) if remote_send and local_receive else 0
    return outgoing, incoming


class HeartbeatClock:
    """When one side of a connection owes the other a heart-beat, and when the other side
    counts as dead: pure arithmetic on the times the caller reports (seconds, monotonic).

    `outgoing`/`incoming` are the negotiated periods in ms (0: none in that direction). A
    beat is due when nothing was written for 0.95 of the outgoing period (a little early, so
    timer jitter never makes it late); the peer is silent when nothing at all, frames or
    beats, arrived for twice the incoming period, the tolerance the specification suggests.
    """

    __slots__ = ("incoming", "last_read", "last_write", "outgoing")

    def __init__(self, outgoing_ms: int, incoming_ms: int, now: float) -> None:
        self.outgoing = outgoing_ms / 1000
        self.incoming = incoming_ms / 1000
        self.last_read = self.last_write = now

    def read(self, now: float) -> None:
        self.last_read = now

    def wrote(self, now: float) -> None:
        self.last_write = now

    def beat_due(self, now: float) -> bool:
        return bool(self.outgoing) and now - self.last_write >= self.outgoing * 0.95

    def next_beat(self) -> float | None:
        """When the next beat falls due if nothing else is written (None: never)."""
        return self.last_write + self.outgoing * 0.95 if self.outgoing else None

    def peer_silent(self, now: float) -> bool:
        return bool(self.incoming) and now - self.last_read > 2 * self.incoming

    def silent_for(self, now: float) -> float:
        return now - self.last_read

    def next_check(self) -> float | None:
        """When the peer turns silent if nothing arrives meanwhile (None: never)."""
        return self.last_read + 2 * self.incoming if self.incoming else None
