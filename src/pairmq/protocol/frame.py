"""The one value type of the protocol layer: a STOMP frame, parsed or about to be sent."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Frame:
    """A command, its headers and its body.

    `headers` keeps wire order; when a header repeats on the wire only the first value is
    kept, as the specification requires. Slots keep the many short-lived frames small.
    """

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
