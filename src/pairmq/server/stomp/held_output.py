"""A connection's output that waits for journal records to be confirmed, in order.

A RECEIPT waits for the record of its frame (docs/durability.md, "When a RECEIPT is sent"),
a MESSAGE of a persistent message for the record that added it ("When a message is
delivered"); whatever the connection writes after one of them waits behind it, so its
frames are never reordered. The role tells when records are confirmed; this only keeps the
queue, its size (bounded like a socket buffer), and which releases were asked for.
"""

from __future__ import annotations

from collections import deque

from pairmq.server.role.confirmations import Ticket


class HeldOutput:
    __slots__ = ("_frames", "_waited", "size")

    def __init__(self) -> None:
        self._frames: deque[tuple[Ticket | None, bytes]] = deque()  # None: waits for nothing
        self._waited: Ticket | None = None  # the last ticket a release was asked for
        self.size = 0  # bytes held

    def __bool__(self) -> bool:
        return bool(self._frames)

    def hold(self, ticket: Ticket | None, frame_bytes: bytes) -> bool:
        """Queue a frame behind the others until `ticket` is confirmed. True when the
        caller must ask the role for a release at that ticket: many frames share one (the
        role hands out one per record) and one release frees every frame confirmed by
        then, so it is asked for once."""
        self._frames.append((ticket, frame_bytes))
        self.size += len(frame_bytes)
        if ticket is None or ticket is self._waited:
            return False
        self._waited = ticket
        return True

    def release(self, confirmed_seq: int, out: list[bytes]) -> None:
        """Move the frames whose records are confirmed (every record up to `confirmed_seq`
        is), up to the first one still waiting, to `out`."""
        frames = self._frames
        released = 0
        while frames:
            ticket = frames[0][0]
            # not `Role.confirmed(ticket)`: a call for each frame released
            if ticket is not None and (ticket.seq is None or ticket.seq > confirmed_seq):
                break
            frame_bytes = frames.popleft()[1]
            released += len(frame_bytes)
            out.append(frame_bytes)
        self.size -= released

    def newest_unconfirmed(self, confirmed_seq: int) -> Ticket | None:
        """The last record some held frame still waits for (None: none waits)."""
        for ticket, _ in reversed(self._frames):
            if ticket is not None and (ticket.seq is None or ticket.seq > confirmed_seq):
                return ticket
        return None
