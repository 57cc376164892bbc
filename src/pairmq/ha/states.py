"""Server states of the pair, as DESIGN.md names them."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    STARTING = "STARTING"
    SYNCING = "SYNCING"  # backup copying the active's journal
    PASSIVE = "PASSIVE"  # in-sync backup; refuses clients, naming the active
    ACTIVE = "ACTIVE"  # serving, backup attached
    STANDALONE = "STANDALONE"  # serving, no backup
    WAITING = "WAITING"  # cannot safely decide; refuses clients
    DEAD = "DEAD"  # how a server sees a peer it lost

    @property
    def serving(self) -> bool:
        return self in (State.ACTIVE, State.STANDALONE)
