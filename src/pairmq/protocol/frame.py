"""The one value type of the protocol layer: a STOMP frame, parsed or about to be sent."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, init=False)
class Frame:
    """A command, its headers and its body.

    `headers` keeps wire order; when a header repeats on the wire only the first value is
    kept, as the specification requires. Slots keep the many short-lived frames small.
    The `__init__` is written out: the compiled build compiles it, while the one dataclass
    would generate runs interpreted, about four times slower (docs/benchmarks.md).
    """

    command: str
    headers: dict[str, str]
    body: bytes

    def __init__(self, command: str, headers: dict[str, str] | None = None,
                 body: bytes = b"") -> None:
        self.command = command
        self.headers = {} if headers is None else headers
        self.body = body
