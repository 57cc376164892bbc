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
