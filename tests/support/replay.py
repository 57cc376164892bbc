"""What a restart rebuilds from a broker's records, without a journal on disk: the core's
half of recovery, for pure tests (the store's half is tested against real files)."""

from __future__ import annotations

from collections.abc import Callable

from pairmq.core import records as rec
from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.replay import Replay
from pairmq.core.stream_log import OFFSET_HEADER


def replayed(records: list[tuple], dup_cache_size: int = 20000,
             paged_beyond: Callable[[str], int] | None = None,
             located: dict[int, tuple[int, int, int]] | None = None) -> Replay:
    """Apply `records` (as `Broker.take_records()` returns them) to a fresh Replay. DUP_EVICT
    and PRODUCER_FORGET are the store's bookkeeping, never written: a Replay evicts by its
    cache size, and a restored broker forgets idle producers at its next sweep. With
    `paged_beyond`, messages past a destination's limit go to its paged log, at the
    (segment, offset, length) `located` gives for their order."""
    replay = Replay(dup_cache_size=dup_cache_size, paged_beyond=paged_beyond)
    for record in records:
        kind = record[0]
        if kind == rec.ADD:
            message, keys = record[1], record[2]
            if message.destination.startswith(STREAM_PREFIX):
                segment, offset, length = (located or {}).get(message.order, (0, 0, 0))
                replay.add_stream_record(message.destination,
                                         int(message.headers[OFFSET_HEADER]),
                                         int(message.headers.get("timestamp", "0")),
                                         segment, offset, length, message.order,
                                         message.size)
            elif replay.to_log(message.destination, keys, message.message_id, message.size,
                             message.order):
                segment, offset, length = (located or {})[message.order]
                replay.add_to_log(message.destination, keys, segment, offset, length,
                                  message.order, message.size)
            else:
                replay.add(message, keys, 0)
        elif kind == rec.DEL:
            replay.remove(record[1], record[2].message_id, record[2].order)
        elif kind == rec.DEST:
            replay.destination(record[1])
        elif kind == rec.DUP:
            replay.dup(record[1], record[2])
        elif kind == rec.GROUP:
            replay.group(record[1], record[2], record[3])
        elif kind == rec.PRODUCER:
            replay.producer(*record[1:])
    replay.settle_streams()
    return replay
