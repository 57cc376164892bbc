"""A connection's unfinished frame (issue 20): the bytes its parser holds until the rest
arrives, which count in the server's memory (global_max_size_bytes), and since when it has
been unfinished, so that a frame trickled in a byte a second cannot hold its memory and
socket for ever ([limits] frame_timeout_ms). Pure: reads and times are given.

A frame's clock starts when a read leaves part of a new frame in the parser; a read that
completes frames and leaves part of the next starts it again, so a producer streaming many
frames, whose reads seldom end on a frame's end, is never taken for a slow one. While the
server itself does not read (frames held, replication behind) the clock restarts: the
client is not late.
"""

from __future__ import annotations


class UnfinishedFrame:
    __slots__ = ("bytes", "since", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s  # 0: no deadline
        self.bytes = 0  # held by the parser for the unfinished frame
        self.since: float | None = None  # when the unfinished frame began, None: none

    def fed(self, buffered: int, completed: bool, now: float) -> int:
        """After a read: `buffered` bytes are held, `completed` frames were finished by it.
        Returns how much the bytes held changed."""
        delta = buffered - self.bytes
        self.bytes = buffered
        if not buffered:
            self.since = None
        elif completed or self.since is None:
            self.since = now
        return delta

    def not_reading(self, now: float) -> None:
        """The server is not reading from this client: it is not late meanwhile."""
        if self.since is not None:
            self.since = now

    def due(self) -> float | None:
        """When the unfinished frame is overdue, or None."""
        if self.since is None or not self.timeout_s:
            return None
        return self.since + self.timeout_s

    def overdue(self, now: float) -> bool:
        due = self.due()
        return due is not None and now >= due
