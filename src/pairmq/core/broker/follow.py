"""A backup's broker follows the active server's journal: every entry is applied to live
queues as it arrives, by the rules recovery uses (core/replay.py), so that taking over
replays nothing.

Part of the Broker (a mixin, like core/broker/intake.py). While following, the broker has no
sessions and delivers nothing; an index by queue key finds the entry a DEL or DELIVERED
names. Entries are idempotent where compaction repeats them: a copy of a message a queue
holds keeps the entry (and the higher delivery count). After a full synchronisation the
copies can come in any order: a queue that received one out of order is sorted when
following ends, and entries of a durable subscription whose DURABLE record has not come
yet wait in the index until it does (or are dropped, as recovery drops them).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from pairmq.core.broker.resume import Resume
from pairmq.core.capacity import INDEX_BYTES, Capacity
from pairmq.core.commit_ledger import CommitLedger
from pairmq.core.destinations import QUEUE, STREAM_PREFIX, TOPIC
from pairmq.core.message import Entry, Message
from pairmq.core.paged_log import PagedLog
from pairmq.core.queue import Address, AddressState, Queue
from pairmq.core.queue_args import args_from_text
from pairmq.core.settings import AddressFullPolicy

DURABLE_PREFIX: Final = "durable:"


class Follow(Resume):
    """The Broker's follower side (a mixin)."""

    def start_following(self) -> None:
        """Index what the broker holds (restored from the journal, or nothing) by queue key."""
        index: dict[str, dict[str, Entry]] = {}
        for q in (*self.queues.values(), *self.durables.values()):
            if q.key is not None:
                index[q.key] = {e.message.message_id: e for e in q.entries()}
        self._index = index
        self._unsorted = set()
        self.records.clear()

    def end_following(self) -> list[Message]:
        """Ready to serve: queues in enqueue order, the index dropped. Returns the messages of
        durable subscriptions that never came (the store forgets them, as recovery does)."""
        index = self._index
        assert index is not None, "not following"
        orphans = [e.message for key, held in index.items()
                   if key.startswith(DURABLE_PREFIX) and key[len(DURABLE_PREFIX):]
                   not in self.durables for e in held.values()]
        orphans.extend(self._settle_streams())
        for q in self._unsorted:
            q.sort()
        for address in self.addresses.values():
            if address.producers is not None:  # a full synchronisation's copies: any order
                address.producers.order_by_time()
        self._index = None
        self._unsorted = set()
        self.records.clear()
        return orphans

    def follow_reset(self) -> None:
        """A full synchronisation replaces the journal: forget everything it held."""
        self.addresses.clear()
        self.queues.clear()
        self.durables.clear()
        self.streams.clear()
        self.capacity = Capacity(self.settings)
        self.commits = CommitLedger(top=self.commits.top)
        self.records.clear()
        self.events.clear()
        self._index = {}
        self._unsorted = set()

    # ----------------------------------------------------------------- one entry each

    def follow_add(self, message: Message, queue_keys: list[str], deliveries: int) -> Message:
        """The message enters these queues; returns the object they share (an earlier copy a
        queue still holds, or this one). A dead-lettered copy keeps its id but not its
        destination, so it never stands for the original."""
        index = self._index
        assert index is not None, "not following"
        if queue_keys[0].startswith(STREAM_PREFIX):  # a stream's message has no other
            return self._follow_stream_add(queue_keys[0], message)
        message_id = message.message_id
        shared = message
        for key in queue_keys:
            entry = index.get(key, {}).get(message_id)
            if entry is not None and entry.message.destination == message.destination:
                shared = entry.message
                break
        if shared.order > self._order_seq:
            self._order_seq = shared.order
        if shared is message and not deliveries and self._follow_to_log(message, queue_keys):
            return message  # kept in the address's paged log (message.log), as the active
        for key in queue_keys:
            held = index.get(key)
            if held is None:
                held = index[key] = {}
            entry = held.get(message_id)
            if entry is not None and entry.message is shared:
                if deliveries > entry.deliveries:
                    entry.deliveries = deliveries
                continue
            if entry is not None:
                self._follow_drop(key, entry)
            entry = held[message_id] = Entry(shared, deliveries)
            q = self._followed_queue(key, create=True)
            if q is not None:
                self._follow_push(q, entry)
        return shared

    def follow_remove(self, queue_key: str, message_id: str, order: int = -1
                      ) -> Message | None:
        """The message left the queue (acked, expired, moved); None if it was not there,
        or was in the queue's paged log (no object: the log lets go of its entry)."""
        index = self._index
        assert index is not None, "not following"
        if queue_key.startswith(STREAM_PREFIX):
            return self._follow_stream_remove(queue_key, message_id, order)
        held = index.get(queue_key)
        entry = held.pop(message_id, None) if held is not None else None
        if entry is None:
            self._follow_log_remove(queue_key, order)
            return None
        self._follow_drop(queue_key, entry)
        return entry.message

    def follow_delivered(self, queue_key: str, message_id: str, count: int,
                         order: int = -1) -> Message | None:
        index = self._index
        assert index is not None, "not following"
        held = index.get(queue_key)
        entry = held.get(message_id) if held is not None else None
        if entry is None:
            found = self._in_log(queue_key, order)
            if found is not None:  # handed out by the active: say so if it comes again
                log, number = found
                if count > log.deliveries.get(number, 0):
                    log.deliveries[number] = count
            return None
        if count > entry.deliveries:
            entry.deliveries = count
        return entry.message

    def follow_durable(self, key: str, topic: str) -> list[Message]:
        """A durable subscription exists; returns what a replaced one held (now gone)."""
        old = self.durables.get(key)
        if old is not None and old.address.name == topic:
            return []
        gone = self.follow_undurable(key) if old is not None else []
        address = self._address(topic, TOPIC)
        q = Queue(f"{DURABLE_PREFIX}{key}", address, topic[len("/topic/"):])
        q.durable_key = key
        q.key = f"{DURABLE_PREFIX}{key}"
        address.queues.append(q)
        self.durables[key] = q
        assert self._index is not None
        waiting = self._index.get(q.key)
        if waiting:
            for entry in sorted(waiting.values(), key=lambda e: e.message.order):
                self._follow_push(q, entry)
        return gone

    def follow_undurable(self, key: str) -> list[Message]:
        """The durable subscription is deleted with what it held; returns those messages."""
        assert self._index is not None
        held = self._index.pop(f"{DURABLE_PREFIX}{key}", {})
        q = self.durables.pop(key, None)
        if q is not None:
            self._leave_log(q)
            address = q.address
            if q in address.queues:
                address.queues.remove(q)
            for entry in q.clear():
                self._consumed(q, entry)
            q.deleted = True
            self._unsorted.discard(q)
        return [entry.message for entry in held.values()]

    def follow_destination(self, name: str, settings: str = "") -> None:
        """`settings`: the queue's x- arguments, as its DEST record keeps them
        (core/broker/configured.py)."""
        if name.startswith(STREAM_PREFIX):
            self._stream(name)
        else:
            q = self._plain_queue(name)
            if settings:
                self._configured(q, args_from_text(settings, name))

    def follow_undestination(self, name: str) -> None:
        """The active server deleted an empty, unused destination (core/broker/idle.py)."""
        address = self.addresses.get(name)
        if address is not None:
            self._delete_destination(address)

    def follow_dup(self, destination: str, dup_id: str) -> str | None:
        """A dup-id is remembered; returns the one the cache evicted for it, if any."""
        address = self._dup_address(destination)
        dups = address.dups
        dups[dup_id] = None
        if len(dups) > address.dup_limit:
            return dups.popitem(last=False)[0]
        return None

    def follow_dups(self, destination: str, dup_ids: list[str]) -> list[str]:
        """Compaction rewrote the whole cache: it replaces what came before. Returns the ids
        no longer remembered."""
        address = self._dup_address(destination)
        kept = OrderedDict.fromkeys(dup_ids[-address.dup_limit:])
        gone = [dup_id for dup_id in address.dups if dup_id not in kept]
        address.dups = kept
        return gone

    def follow_producer(self, destination: str, producer: str, epoch: int, seq: int,
                        seen: int) -> str | None:
        """A producer's messages up to `seq` are taken; returns the producer forgotten past
        max_producers to make room, if any."""
        return self._producers_of(self._dup_address(destination)).restore(
            producer, epoch, seq, seen, self.settings.max_producers)

    # ----------------------------------------------------------------- paged logs

    def follow_moved(self, message: Message, queue_keys: list[str]
                     ) -> tuple[PagedLog, int] | None:
        """Is this ADD a copy (compaction) of a message this broker keeps in a paged log?
        Then (the log, its entry number): the store moves the entry there."""
        if queue_keys[0].startswith(STREAM_PREFIX):
            return None
        return self._in_log(queue_keys[0], message.order)

    def _in_log(self, queue_key: str, order: int) -> tuple[PagedLog, int] | None:
        if order < 0:
            return None
        q = self._followed_queue(queue_key, create=False)
        log = q.address.log if q is not None else None
        if log is None:
            return None
        number = log.find(order)
        return (log, number) if number is not None else None

    def _follow_to_log(self, message: Message, queue_keys: list[str]) -> bool:
        """A new message goes to its address's paged log on the backup by the rule the
        active routes by (core/broker/paging.py): the address is full under policy page, or a
        queue still has messages in the log."""
        if not message.persistent:
            return False
        queues: list[Queue] = []
        for key in queue_keys:
            q = self._followed_queue(key, create=True)
            if q is None or q.key is None:
                return False
            queues.append(q)
        address = queues[0].address
        if any(q.address is not address for q in queues):
            return False
        log = address.log
        if log is not None and message.order <= log.newest_order:
            return False  # older than what the log holds: a copy of a message in memory
        if not self._pages_to_log(address) and not (
                address.state is AddressState.FULL and address.policy is AddressFullPolicy.PAGE):
            return False
        self._to_log(address, queues, message)
        self._check_full(address)
        return True

    def _follow_log_remove(self, queue_key: str, order: int) -> None:
        found = self._in_log(queue_key, order)
        if found is None:
            return
        log, number = found
        q = self._followed_queue(queue_key, create=False)
        assert q is not None
        if q not in log.cursors or number < log.cursors[q]:
            return
        address = q.address
        address.size -= log.delete(q, number)
        self.moved_logs[log] = None
        if address.state is AddressState.FULL \
                and address.size <= address.limit * self.settings.resume_ratio:
            address.state = AddressState.OPEN  # as _consumed would (no one is told on a backup)

    # ----------------------------------------------------------------- internals

    def _dup_address(self, destination: str) -> Address:
        if destination.startswith(STREAM_PREFIX):
            return self._stream(destination).address
        return self._address(destination, QUEUE if destination.startswith("/queue/") else TOPIC)

    def _followed_queue(self, key: str, create: bool) -> Queue | None:
        if key.startswith(DURABLE_PREFIX):
            return self.durables.get(key[len(DURABLE_PREFIX):])
        return self._plain_queue(key) if create else self.queues.get(key)

    def _follow_push(self, q: Queue, entry: Entry) -> None:
        """Enqueue without dispatching (nobody consumes from a backup), with the accounting
        of a SEND: sizes, the memory guard, and a full destination paging what comes."""
        message = entry.message
        address = q.address
        if address.state is AddressState.FULL and address.policy is AddressFullPolicy.PAGE:
            message.page_out = True
        if not q.push_in_order(entry):
            self._unsorted.add(q)
        address.size += message.size
        capacity = self.capacity
        capacity.memory += message.size + INDEX_BYTES
        if capacity.memory > capacity.trip_at:
            self._server_changed(capacity.check_memory())
        self._check_full(address)

    def _follow_drop(self, key: str, entry: Entry) -> None:
        q = self._followed_queue(key, create=False)
        if q is not None and q.remove(entry):
            self._consumed(q, entry)
