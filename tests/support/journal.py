"""Read a running server's journal from the test, to check what a RECEIPT promised.

The segment files are read as they lie (a torn tail of a record being written is simply
not there yet), so `contains` says whether the server had written a message's record to
its journal file when the test looked.
"""

from __future__ import annotations

from pathlib import Path

from pairmq.store.record_decoding import decode_entries
from pairmq.store.records import ADD, KIND_BATCH
from pairmq.store.segments import list_segments, scan_segment


class JournalIndex:
    """The message bodies found in one journal directory (rescanned only when needed)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.bodies: set[bytes] = set()
        self.scans = 0

    def reset(self) -> None:
        """Forget what was seen (the journal may have been replaced: a backup's full sync)."""
        self.bodies.clear()

    def scan(self) -> None:
        self.scans += 1
        found: set[bytes] = set()

        def visit(seq: int, epoch: int, kind: int, payload: memoryview, offset: int) -> None:
            if kind != KIND_BATCH:
                return
            for entry in decode_entries(payload):
                if entry[0] == ADD and entry[1].body is not None:
                    found.add(bytes(entry[1].body))

        for segment_id, path in list_segments(self.directory):
            try:
                scan_segment(segment_id, path, visit)
            except FileNotFoundError:
                continue  # compacted away while we looked: its messages live elsewhere
        self.bodies = found

    def contains(self, body: bytes) -> bool:
        if body in self.bodies:
            return True
        self.scan()
        return body in self.bodies


def broker_snapshot(broker, store) -> dict:
    """What a broker holds, as recovery would rebuild it: each durable queue's messages
    (body, priority, delivery count, message id), those in memory in delivery order, then
    those kept only in its address's paged log (read back, not paged in); durable
    subscriptions, dup-id caches in eviction order, producer sequences (least recently
    active first), and the bytes each destination holds.

    `content_only` below compares two snapshots whose split between memory and log may
    differ (a backup follows the active's routing, a recovery its own budget)."""
    queues = {}
    for key, q in [*broker.queues.items(), *((f"durable:{k}", q) for k, q
                                             in broker.durables.items())]:
        held = [(store.read_body(e.message), e.message.priority, e.deliveries,
                 e.message.message_id, e.message.order) for e in q.entries()]
        log = q.address.log
        if log is not None and q in log.cursors:
            numbers = log.next_numbers(q, 1 << 30)
            for number, (message, *_rest) in zip(numbers, store.pages.page_in(log, numbers),
                                                  strict=True):
                held.append((message.body, message.priority, log.deliveries.get(number, 0),
                             message.message_id, message.order))
        queues[key] = held
    return {
        "queues": queues,
        "durables": {key: q.address.name for key, q in broker.durables.items()},
        "dups": {name: list(a.dups) for name, a in broker.addresses.items() if a.dups},
        "producers": {name: [(p, s.epoch, s.seq, s.seen) for p, s in a.producers.items()]
                      for name, a in broker.addresses.items() if a.producers},
        "sizes": {name: a.size for name, a in broker.addresses.items()},
    }


def content_only(snapshot: dict) -> dict:
    """The snapshot with each queue's messages by enqueue order, whatever waits in memory
    and whatever in a paged log (priority orders only those in memory)."""
    out = dict(snapshot)
    out["queues"] = {key: sorted(held, key=lambda m: m[4])
                     for key, held in snapshot["queues"].items()}
    return out


def streams_snapshot(broker, store) -> dict:
    """Each stream's offsets, bytes, groups and every record it holds, read back from the
    journal (all of them located: a recovered broker's, or one whose records are synced)."""
    out = {}
    for name, stream in broker.streams.items():
        offsets = list(range(stream.first, stream.next))
        records = store.read_stream(stream.log, offsets)
        out[name] = {"first": stream.first, "next": stream.next, "bytes": stream.bytes,
                     "groups": dict(stream.groups),
                     "records": [(m.headers["x-stream-offset"], m.body) for m in records]}
    return out
