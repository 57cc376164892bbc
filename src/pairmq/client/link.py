"""The failover client's link to the pair: one explicit state, one transition table (in
the manner of h11's `_state.py`).

    CONNECTING --first CONNECTED, or a session resumed--> UP --lost--> CONNECTING
        |     \\--a fresh session after a failure--> RECOVERING --subscriptions re-created--> UP
        \\--no server within the allowed rounds, or a fatal refusal--> FAILED
    UP --close--> CLOSING --DISCONNECT receipted, or lost--> CLOSED
"""

from __future__ import annotations

from enum import StrEnum


class Link(StrEnum):
    CONNECTING = "connecting"  # no usable session: trying servers, or waiting to
    RECOVERING = "recovering"  # a fresh session after a failure: re-creating subscriptions
    UP = "up"
    CLOSING = "closing"  # DISCONNECT written
    CLOSED = "closed"  # closed by the application
    FAILED = "failed"  # gave up: no server in the allowed rounds, or a fatal refusal


_CN, _RC, _UP, _CG, _CD, _FD = (Link.CONNECTING, Link.RECOVERING, Link.UP, Link.CLOSING,
                                Link.CLOSED, Link.FAILED)

LINK: dict[tuple[Link, str], Link] = {
    (_CN, "up"): _UP,
    (_CN, "recover"): _RC,
    (_CN, "give-up"): _FD,
    (_CN, "close"): _CD,
    (_RC, "up"): _UP,
    (_RC, "lost"): _CN,
    (_RC, "give-up"): _FD,
    (_RC, "close"): _CD,
    (_UP, "lost"): _CN,
    (_UP, "give-up"): _FD,
    (_UP, "close"): _CG,
    (_CG, "lost"): _CD,
    (_CG, "closed"): _CD,
    (_FD, "close"): _CD,
}
