"""Which of two connected servers becomes active: a pure rule, the same on both sides.

Used when both servers of the pair see each other over the HA channel and neither serves:
at start, after both were down, or while the witness cannot be reached. docs/ha.md has
the safety argument (why electing without the witness cannot split the pair's brain).
"""

from __future__ import annotations

from typing import NamedTuple

from pairmq.ha.messages import PeerHello


class Standing(NamedTuple):
    """What a server's claim to be active rests on, in order of weight."""

    epoch: int  # the newest epoch in its journal
    last_seq: int  # the last record of its journal
    primary: bool  # configured role: primary wins a tie

    @classmethod
    def of_peer(cls, hello: PeerHello) -> Standing:
        return cls(hello.epoch, hello.last_seq, hello.primary)


def elected(mine: Standing, theirs: Standing) -> bool:
    """True when this server should be the active one: the newest journal (highest epoch,
    then highest sequence), then the primary role. Both servers compare the same two
    standings from opposite sides, so at most one of them is elected; with equal standings
    (two primaries, or two backups, with equal journals: a misconfiguration) neither is."""
    return mine > theirs
