"""Destination names: which kind a name is, and what part of it names the queue."""

from __future__ import annotations

from typing import Final

from pairmq.core.errors import CoreError

QUEUE: Final = "queue"
TOPIC: Final = "topic"
TEMP: Final = "temp-queue"
REPLY: Final = "reply-queue"
STREAM: Final = "stream"
STREAM_PREFIX: Final = "/stream/"

_PREFIXES: Final = (("/queue/", QUEUE), ("/topic/", TOPIC), ("/temp-queue/", TEMP),
                    ("/reply-queue/", REPLY), (STREAM_PREFIX, STREAM))


_parsed: dict[str, tuple[str, str]] = {}
_PARSED_MAX: Final = 10000


def parse_destination(destination: str) -> tuple[str, str]:
    """Split `/queue/orders` into ("queue", "orders"); refuse anything else with a clear error."""
    found = _parsed.get(destination)
    if found is not None:
        return found
    found = _parse(destination)
    if len(_parsed) >= _PARSED_MAX:
        _parsed.clear()
    _parsed[destination] = found
    return found


def _parse(destination: str) -> tuple[str, str]:
    for prefix, kind in _PREFIXES:
        if destination.startswith(prefix):
            name = destination[len(prefix):]
            if not name:
                raise CoreError(f"destination {destination!r} has no name after {prefix!r}")
            return kind, name
    raise CoreError(
        f"unknown destination {destination!r}: it must start with /queue/, /topic/, "
        "/stream/, /temp-queue/ or /reply-queue/"
    )
