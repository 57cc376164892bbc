"""How far the backup is behind the active: in records, bytes and seconds.

The active knows what it appended, what it sent (sequence numbers and bytes, as it sends
them) and what the backup acknowledged (a sequence number, in the backup's acks). Records
behind is exact: appended and not acknowledged (a backup still copying the journal counts
all it lacks). Bytes and seconds come from marks taken when records are sent, one per
batch, so they are exact at batch boundaries and cover the live stream only. Marks are
bounded (`max_marks`): past that the oldest go, and the lag in seconds is then counted from
the oldest mark kept, an underestimate (said in docs/operations.md).

Pure: time is a parameter, as in ha/lease.py.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MAX_MARKS = 4096


@dataclass(frozen=True)
class Lag:
    """The backup's distance behind the active at one instant."""

    records: int = 0
    bytes: int = 0
    seconds: float = 0.0


NO_LAG = Lag()


class ReplicationLag:
    """Marks of the replication stream: (last sequence sent, bytes sent in all, when)."""

    def __init__(self, max_marks: int = MAX_MARKS) -> None:
        self.max_marks = max_marks
        self._marks: deque[tuple[int, int, float]] = deque()
        self._sent_seq = 0
        self._sent_bytes = 0  # since the last reset
        self._acked_seq = 0
        self._acked_bytes = 0

    def reset(self, seq: int) -> None:
        """A new backup (or a new synchronisation) that holds everything up to seq."""
        self._marks.clear()
        self._sent_seq = self._acked_seq = seq
        self._sent_bytes = self._acked_bytes = 0

    def sent(self, seq: int, nbytes: int, now: float) -> None:
        """Records up to seq went to the backup, nbytes of them since the last call."""
        if seq <= self._sent_seq:
            return
        self._sent_seq = seq
        self._sent_bytes += nbytes
        if len(self._marks) >= self.max_marks:
            self._marks.popleft()  # the oldest goes: the lag's start moves to the next one
        self._marks.append((seq, self._sent_bytes, now))

    def acked(self, seq: int) -> None:
        """The backup holds every record up to seq."""
        if seq <= self._acked_seq:
            return
        self._acked_seq = seq
        marks = self._marks
        while marks and marks[0][0] <= seq:
            _, self._acked_bytes, _ = marks.popleft()

    @property
    def unacked_bytes(self) -> int:
        """Bytes of the stream sent and not yet acknowledged: on their way, or read by the
        backup and not yet applied."""
        return max(0, self._sent_bytes - self._acked_bytes)

    def view(self, appended_seq: int, now: float) -> Lag:
        records = max(0, appended_seq - self._acked_seq)
        if records == 0 or not self._marks:
            return NO_LAG if records == 0 else Lag(records, 0, 0.0)
        _, _, oldest = self._marks[0]
        return Lag(records, max(0, self._sent_bytes - self._acked_bytes),
                   max(0.0, now - oldest))


def backup_stalled(lag: Lag, timeout_s: float) -> bool:
    """Whether a backup that receipts wait for has stopped acknowledging: the oldest
    record sent and not acknowledged went out `timeout_s` ago or more ([store]
    stall_timeout_ms, the same bound a server applies to its own disk: issue 35). Its
    heartbeats may go on; its disk, or its process, does not."""
    return timeout_s > 0 and lag.records > 0 and lag.seconds >= timeout_s


class FollowerLag:
    """The backup's own view of its lag: the active's newest sequence comes in its
    heartbeats, so a backup knows how many records it lacks, and since when it has lacked
    some (seconds: since it last held everything the active had said it appended; an
    overestimate by at most a heartbeat interval). It cannot know the bytes."""

    def __init__(self) -> None:
        self._active_seq = 0
        self._caught_up_at: float | None = None  # None: not following anyone yet

    def heard(self, active_seq: int, own_seq: int, now: float) -> None:
        """A heartbeat of the serving peer, which has appended up to `active_seq`."""
        if self._caught_up_at is None or own_seq >= self._active_seq:
            self._caught_up_at = now
        self._active_seq = active_seq

    def forget(self) -> None:
        """No serving peer any more."""
        self._active_seq = 0
        self._caught_up_at = None

    def view(self, own_seq: int, now: float) -> tuple[int, float] | None:
        """(records behind, seconds behind), or None while it follows nobody."""
        if self._caught_up_at is None:
            return None
        records = max(0, self._active_seq - own_seq)
        return records, (max(0.0, now - self._caught_up_at) if records else 0.0)
