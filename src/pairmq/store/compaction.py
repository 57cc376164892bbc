"""Compaction: the store's part that deletes a segment with nothing live in it, and rewrites
an old segment with little live by re-appending its live objects at the head, in small steps
on the event loop, then deleting it once those records are on disk (one part of the Store,
store/store_state.py). A backup never compacts: the active's copies come through the
replication stream (store/mirror.py).
"""

from __future__ import annotations

import logging
import os
from typing import Final

from pairmq.core import Message
from pairmq.core import records as rec
from pairmq.core.records import Record
from pairmq.store.mirror import Mirroring
from pairmq.store.reading import DUPS_RECORD, EPOCH_RECORD

log = logging.getLogger("pairmq.store")

COMPACT_STEP: Final = 500  # live objects re-appended per event-loop turn


class Compacting(Mirroring):
    """Dropping and compacting the oldest segments."""

    def _maybe_compact(self) -> None:
        writer = self.writer
        if writer is None or self._compacting is not None or self.hold_compaction \
                or self.mirror:
            return
        while len(writer.segments) > 1:
            oldest = writer.segments[min(writer.segments)]
            if oldest is writer.current or oldest.last_seq > writer.synced_seq:
                return
            if self.broker is not None and self.broker.commits.holds(oldest.segment_id):
                return  # a COMMIT under way began there: core/broker/committing.py says why
            tail = self._commit_tails.pop(oldest.segment_id, 0)
            if tail > writer.synced_seq:  # one that began there ended, not on disk yet
                self._commit_tails[oldest.segment_id] = tail
                return
            if not oldest.live and not oldest.paged:
                self._drop_segment(oldest.segment_id)
                continue
            if oldest.paged:
                return  # paged messages keep it until they are consumed (docs/durability.md)
            if oldest.live_bytes < self.settings.segment_bytes * self.settings.compact_ratio:
                self._compacting = oldest.segment_id
                self._compact_queue = list(oldest.live)
                writer.loop.call_soon(self._compact_step)
            return

    def _drop_segment(self, segment_id: int) -> None:
        assert self.writer is not None
        fd = self._read_fds.pop(segment_id, None)
        if fd is not None:
            os.close(fd)
        self.writer.unlink_segment(segment_id)
        log.debug("Journal segment %d deleted: nothing in it is live", segment_id)
        if self.settings.max_journal_bytes:
            self._notify_full()

    def _compact_step(self) -> None:
        """Re-append a few live objects of the oldest segment at the head."""
        writer, broker = self.writer, self.broker
        assert writer is not None and broker is not None
        segment_id = self._compacting
        info = writer.segments.get(segment_id) if segment_id is not None else None
        if info is None:
            self._compacting = None
            return
        batch, self._compact_queue = (self._compact_queue[:COMPACT_STEP],
                                      self._compact_queue[COMPACT_STEP:])
        records: list[Record] = []
        dup_destinations: list[str] = []
        for obj in batch:
            if obj not in info.live:
                continue  # it died or moved meanwhile
            if isinstance(obj, Message):
                if obj.journal_queues:
                    records.append((rec.ADD, obj, list(obj.journal_queues)))
                    # ... with how often it was handed out, so it comes back redelivered
                    for queue_key, count in (obj.journal_delivered or {}).items():
                        if queue_key in obj.journal_queues:
                            records.append((rec.DELIVERED, queue_key, obj, count))
            elif obj[0] == "dest":
                records.append(broker.dest_record(obj[1]))  # with its settings, if any
            elif obj[0] == "epoch":
                records.append((EPOCH_RECORD, obj[1]))
            elif obj[0] == "group":
                offset = broker.group_offset(obj[1], obj[2])
                if offset is not None:
                    records.append((rec.GROUP, obj[1], obj[2], offset))
            elif obj[0] == "durable":
                q = broker.durables.get(obj[1])
                if q is not None:
                    records.append((rec.DURABLE, obj[1], q.address.name))
            elif obj[0] == "user":
                users = broker.accounts.users
                if obj[1] in users:
                    account = users[obj[1]]
                    if account is None:
                        records.append((rec.UNUSER, obj[1]))
                    else:
                        records.append((rec.USER, obj[1], account.password, account.roles))
            elif obj[0] == "rule":
                grants = broker.accounts.rules.get(obj[1], False)
                if grants is None:
                    records.append((rec.UNRULE, obj[1]))
                elif grants is not False:
                    records.append((rec.RULE, obj[1], grants))
            elif obj[0] == "producer":
                address = broker.addresses.get(obj[1])
                state = address.producers.get(obj[2]) \
                    if address is not None and address.producers is not None else None
                if state is not None:
                    records.append((rec.PRODUCER, obj[1], obj[2], state.epoch, state.seq,
                                    state.seen))
            elif obj[1] not in dup_destinations:
                # Rewrite the destination's whole cache in order: copying single ids after
                # newer ones would change which ids a restart evicts first.
                dup_destinations.append(obj[1])
                address = broker.addresses.get(obj[1])
                if address is not None:
                    records.append((DUPS_RECORD, obj[1], list(address.dups)))
        if records:
            self.persist(records)
        if self._compact_queue:
            writer.loop.call_soon(self._compact_step)
            return
        self._compacting = None
        if not info.live and not info.paged:
            self._drop_segment(info.segment_id)
            log.debug("Journal segment %d compacted", info.segment_id)
