"""What a backup needs to catch up: a pure decision on two journals' ends and epochs."""

from __future__ import annotations

from typing import Any, NamedTuple


def epoch_at(epochs: list[tuple[int, int]] | list[list[int]], seq: int) -> int | None:
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


def plan_sync(request: dict[str, Any], appended: int, oldest: int,
              epochs: list[tuple[int, int]]) -> SyncPlan:
    """Incremental only when the backup's last record is one we still hold, written in the
    same epoch on both sides (so the two histories agree up to it)."""
    last = int(request.get("last_seq", 0))
    compatible = (0 < last <= appended and last + 1 >= oldest
                  and epoch_at(request.get("epochs") or [], last) == epoch_at(epochs, last))
    if compatible:
        return SyncPlan("incremental", last + 1, appended)
    return SyncPlan("full", oldest, appended)
