"""STOMP version negotiation, kept apart because both the parser and the server need it."""

from __future__ import annotations

from typing import Final

SUPPORTED_VERSIONS: Final = ("1.0", "1.1", "1.2")


def negotiate_version(accept_version: str | None) -> str | None:
    """The highest version both sides speak, from a CONNECT's `accept-version` header.

    No header means a 1.0 client (the 1.0 specification has no such header). A header that
    names no supported version, including an empty one, gives None: the server must refuse.
    Entries are comma separated; blanks around them are forgiven.
    """
    if accept_version is None:
        return "1.0"
    offered = {item.strip() for item in accept_version.split(",")}
    for version in reversed(SUPPORTED_VERSIONS):
        if version in offered:
            return version
    return None
