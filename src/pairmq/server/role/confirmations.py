"""The value a RECEIPT (or anything else held for the journal) waits for."""

from __future__ import annotations


class Ticket:
    """The journal sequence number a RECEIPT waits for (None until the record is appended)."""

    __slots__ = ("seq",)

    def __init__(self, seq: int | None = None) -> None:
        self.seq = seq
