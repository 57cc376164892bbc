"""Read a running server's journal from the test, to check what a RECEIPT promised.

The segment files are read as they lie (a torn tail of a record being written is simply
not there yet), so `contains` says whether the server had written a message's record to
its journal file when the test looked.
"""

from __future__ import annotations

from pathlib import Path

from pairmq.store.records import ADD, KIND_BATCH, decode_entries
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
    """What a broker holds, as recovery would rebuild it: each durable queue's entries in
    delivery order (body, priority, delivery count, message id), durable subscriptions,
    dup-id caches in eviction order, producer sequences (least recently active first), and
    the bytes each destination holds."""
    queues = {}
    for key, q in [*broker.queues.items(), *((f"durable:{k}", q) for k, q
                                             in broker.durables.items())]:
        queues[key] = [(store.read_body(e.message), e.message.priority, e.deliveries,
                        e.message.message_id) for e in q.entries()]
    return {
        "queues": queues,
        "durables": {key: q.address.name for key, q in broker.durables.items()},
        "dups": {name: list(a.dups) for name, a in broker.addresses.items() if a.dups},
        "producers": {name: [(p, s.epoch, s.seq, s.seen) for p, s in a.producers.items()]
                      for name, a in broker.addresses.items() if a.producers},
        "sizes": {name: a.size for name, a in broker.addresses.items()},
    }
