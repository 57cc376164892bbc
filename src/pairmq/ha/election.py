"""Which of two connected servers becomes active: a pure rule, the same on both sides.

Used when both servers of the pair see each other over the HA channel and neither serves:
at start, after both were down, or while the witness cannot be reached. docs/ha.md has
the safety argument (why electing without the witness cannot split the pair's brain, and
why it cannot pick a history that lacks confirmed records: `forked`).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def forked(mine: Standing, my_epochs: Sequence[tuple[int, int]], theirs: Standing,
           their_epochs: Sequence[tuple[int, int]]) -> bool:
    """True when the two journals went separate ways and each opened an epoch after they
    split: the older one's newest epoch (`epochs`: (epoch, first seq), oldest first) is
    not in the newer one's history. Then the journals alone cannot say which history holds
    the confirmed records, and only the witness may decide (simulator seed 36008).

    Why the newest journal is otherwise the one to serve, and not then. An epoch names one
    history: a journal that holds epoch E holds the history E was opened on. So when the
    older journal's newest epoch E is in the newer one, the records the older one holds
    and the newer lacks (if any: within one epoch, one journal is a prefix of the other)
    are a tail in E appended after the newer one left E. It left E by opening its next
    epoch either with the witness's grant, as E's holder or its standby (the holder
    confirms nothing its standby lacks, and confirms alone only once the witness knows it
    has no standby, after which the witness grants the old standby nothing), or by an
    election in which its journal was the newer one, while E's holder did not serve (and
    a server appends in an epoch only during the one activation that opened it). Either
    way that tail holds nothing confirmed. But an epoch opened by an election is unknown
    to the witness, which may grant the other server a lower epoch after it: that server
    confirms records alone in its own epoch, and its journal, the one with the lower
    number, holds confirmed records the other lacks (an elected epoch itself confirms
    nothing until the peer follows it, whose journal then holds that epoch). So epoch
    numbers order two histories only when one grew out of the other's newest epoch.

    A journal compacted past the other's newest epoch may say `forked` though it holds
    that history: the pair then waits for the witness, which is safe."""
    older = their_epochs if mine > theirs else my_epochs
    newer = my_epochs if mine > theirs else their_epochs
    if not older:
        return False  # an empty journal: nothing to lose
    return older[-1][0] not in {epoch for epoch, _ in newer}
