"""What a restart rebuilds from a broker's records, without a journal on disk: the core's
half of recovery, for pure tests (the store's half is tested against real files)."""

from __future__ import annotations

from pairmq.core import records as rec
from pairmq.core.replay import Replay


def replayed(records: list[tuple], dup_cache_size: int = 20000) -> Replay:
    """Apply `records` (as `Broker.take_records()` returns them) to a fresh Replay. DUP_EVICT
    and PRODUCER_FORGET are the store's bookkeeping, never written: a Replay evicts by its
    cache size, and a restored broker forgets idle producers at its next sweep."""
    replay = Replay(dup_cache_size=dup_cache_size)
    for record in records:
        kind = record[0]
        if kind == rec.ADD:
            replay.add(record[1], record[2], 0)
        elif kind == rec.DEL:
            replay.remove(record[1], record[2].message_id)
        elif kind == rec.DEST:
            replay.destination(record[1])
        elif kind == rec.DUP:
            replay.dup(record[1], record[2])
        elif kind == rec.GROUP:
            replay.group(record[1], record[2], record[3])
        elif kind == rec.PRODUCER:
            replay.producer(*record[1:])
    return replay
