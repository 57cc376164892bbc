"""What a backup needs to catch up: a pure decision on two journals' ends and epochs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pairmq.ha.messages import SyncRequest


def epoch_at(epochs: Sequence[tuple[int, int]], seq: int) -> int | None:
    """The epoch a history says record `seq` was written in (None: before its start)."""
    found = None
    for epoch, first in epochs:
        if first <= seq:
            found = epoch
        else:
            break
    return found


class SyncPlan(NamedTuple):
    mode: str  # "incremental": the backup's journal is a prefix of ours; "full": replace it
    first: int  # the first record to send
    upto: int  # the last record to send (more follow live)


def plan_sync(request: SyncRequest, appended: int, oldest: int,
              epochs: Sequence[tuple[int, int]]) -> SyncPlan:
    """Incremental only when the backup's last record is one we still hold, written in the
    same epoch on both sides (so the two histories agree up to it)."""
    last = request.last_seq
    compatible = (0 < last <= appended and last + 1 >= oldest
                  and epoch_at(request.epochs, last) == epoch_at(epochs, last))
    if compatible:
        return SyncPlan("incremental", last + 1, appended)
    return SyncPlan("full", oldest, appended)
