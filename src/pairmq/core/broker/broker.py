"""The messaging model: applies client commands, returns deliveries and events.

Deterministic and free of I/O: time comes in as `now` (ms since the epoch), message ids
from a counter, the server-wide guards' numbers (disk usage, bytes the store paged out,
whether the journal is full) as inputs too, and everything a command causes is left in
`outbox` (deliveries per connection) and `events` (destinations or the server full and
resumed) for the server to act on; a SEND's fate is its returned `Outcome`. The journal
can therefore record commands and replay them into the same state.

The Broker is written in parts (core/broker/__init__.py lists them), over the state they
share (core/broker/state.py). This file keeps what every part leans on: sessions, the
dispatch of waiting messages to consumers, and destinations made and deleted. The SEND
path, with flow control, is in core/broker/intake.py; SUBSCRIBE and UNSUBSCRIBE, in
core/broker/subscribing.py; how a backup's broker follows the active's journal entry by
entry, in core/broker/follow.py; how a session outlives its connection, in
core/broker/resume.py.
"""

from __future__ import annotations

from typing import Final

from pairmq.core import records as rec
from pairmq.core.broker.events import BrokerEvent
from pairmq.core.broker.paging import PAGE_LOW
from pairmq.core.broker.subscribing import Subscribing
from pairmq.core.browsing import Browse, browse
from pairmq.core.capacity import INDEX_BYTES, Shortage
from pairmq.core.destinations import QUEUE, REPLY, STREAM_PREFIX, TEMP, TOPIC, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.message import Entry
from pairmq.core.queue import Address, AddressState, Queue
from pairmq.core.queue_args import QueueArgs, args_from_text
from pairmq.core.replay import Replay
from pairmq.core.session import Session
from pairmq.core.stream_log import Outgoing
from pairmq.core.subscription import ACK_AUTO, Delivery, Subscription

# Queues sweep_expired looks at per call (every second), at most: an expired message waits
# up to (queues / SWEEP_SLICE) seconds longer to go.
SWEEP_SLICE: Final = 20_000

_FULL: Final = AddressState.FULL  # tested for every message consumed (see core/broker/intake.py)


class Broker(Subscribing):
    """The messaging model's one object: BrokerState's state (state.py), and one part per
    concern, stacked in one line (core/broker/__init__.py)."""

    # ----------------------------------------------------------------- recovery

    def restore(self, replay: Replay) -> None:
        """Load what the journal replay rebuilt; only on an empty broker, before clients."""
        assert not self.sessions and not self.addresses, "restore needs an empty broker"
        self.accounts = replay.accounts
        for destination in replay.destinations:
            if destination.startswith(STREAM_PREFIX):
                self._stream(destination)
            else:
                text = replay.queue_args.get(destination)  # its x- arguments (configured.py)
                self._plain_queue(destination,
                                  args_from_text(text, destination) if text else None)
        for key, topic in replay.durables.items():
            address = self._address(topic, TOPIC)
            q = Queue(f"durable:{key}", address, topic[len("/topic/"):])
            q.durable_key = key
            q.key = f"durable:{key}"
            address.queues.append(q)
            self.durables[key] = q
        top = self._restore_streams(replay)
        for queue_key, held in replay.queues.items():
            if queue_key.startswith(STREAM_PREFIX):
                continue
            if queue_key.startswith("durable:"):
                durable = self.durables.get(queue_key[len("durable:"):])
                if durable is None:
                    continue  # its subscription was deleted
                q = durable
            else:
                q = self._plain_queue(queue_key)
            entries = list(held.values())
            if not entries:
                continue
            if any(entries[i].message.order > entries[i + 1].message.order
                   for i in range(len(entries) - 1)):
                entries.sort(key=lambda e: e.message.order)  # compaction copies came later
            taken = q.extend(entries)
            q.address.size += taken
            self.capacity.memory += taken + len(entries) * INDEX_BYTES
            top = max(top, entries[-1].message.order)
        for destination, ids in replay.dups.items():
            self._dup_address(destination).dups.update(ids)
        self._restore_producers(replay.producers)
        top = max(top, self._restore_logs(replay.logs))
        self._order_seq = max(self._order_seq, top)
        for address in self.addresses.values():
            self._check_full(address)
        self.commits = replay.commits  # settled when this server serves (settle_commits)
        self.records.clear()  # restoring writes nothing new

    # ----------------------------------------------------------------- sessions

    def open_session(self, conn_id: int, version: str, client_id: str | None = None) -> Session:
        if conn_id in self.sessions:
            raise CoreError(f"connection {conn_id} already has a session")
        if client_id is not None:
            if client_id in self.client_ids:
                raise CoreError(f"client-id {client_id!r} is already in use by another connection")
            self.client_ids[client_id] = conn_id
        self._session_seq += 1
        session = Session(conn_id, f"s{self._session_seq}", version, client_id)
        self.sessions[conn_id] = session
        return session

    def close_session(self, conn_id: int, now: int) -> None:
        """The connection is gone: return what it held, abort its transactions."""
        session = self.sessions.pop(conn_id, None)
        if session is None:
            return
        self._orphan_run(conn_id)
        for tx in session.txs.values():
            self._undo(tx, now)
        session.txs.clear()
        for sub in list(session.subs.values()):
            self._detach(sub, now, delete=False)
        session.subs.clear()
        self._drop_cursors(session)
        for name, q in session.temp_queues.items():
            self.reply_queues.pop(f"{session.token}.{name}", None)
            self._delete_queue(q)
        if session.client_id is not None:
            self.client_ids.pop(session.client_id, None)
        self.outbox.pop(conn_id, None)

    def set_writable(self, conn_id: int, writable: bool, now: int) -> None:
        """The server's socket buffer for this connection filled up or drained."""
        session = self.sessions[conn_id]
        session.writable = writable
        if writable:
            for sub in list(session.subs.values()):
                self._dispatch(sub.queue, now)
            self._feed_streams(session)

    def take_capped(self, conn_id: int) -> bool:
        """True (once) when this connection's deliveries stopped at the per-turn limit
        (`_turn_full`) with more waiting."""
        if conn_id in self._capped:
            self._capped.discard(conn_id)
            return True
        return False

    def take_outbox(self) -> dict[int, list[Outgoing]]:
        out, self.outbox = self.outbox, {}
        return out

    def take_events(self) -> list[BrokerEvent]:
        events, self.events = self.events, []
        return events

    def take_records(self) -> list[rec.Record]:
        records, self.records = self.records, []
        return records

    # ----------------------------------------------------------------- queries, accounts

    def browse(self, destination: str, limit: int) -> Browse:
        """The first `limit` messages waiting in a queue, left where they are
        (core/browsing.py); a queue that does not exist is empty and stays absent."""
        kind, _name = parse_destination(destination)
        if kind != QUEUE:
            raise CoreError(f"only a /queue/ destination can be browsed, not {destination!r}")
        return browse(self.queues.get(destination), limit)

    def set_user(self, name: str, password: str, roles: tuple[str, ...]) -> None:
        """Add or change a user at run time (core/accounts.py); `password` is a hash."""
        self.accounts.set_user(name, password, roles)
        self.records.append((rec.USER, name, password, tuple(roles)))

    def remove_user(self, name: str) -> None:
        self.accounts.remove_user(name)
        self.records.append((rec.UNUSER, name))

    def set_rule(self, pattern: str, grants: tuple[tuple[str, tuple[str, ...]], ...]
                 ) -> None:
        """Set a permission rule at run time (core/accounts.py, core/permissions.py)."""
        self.accounts.set_rule(pattern, grants)
        self.records.append((rec.RULE, pattern, self.accounts.rules[pattern]))

    def remove_rule(self, pattern: str) -> None:
        self.accounts.remove_rule(pattern)
        self.records.append((rec.UNRULE, pattern))

    # ----------------------------------------------------------------- expiry

    def sweep_expired(self, now: int) -> int:
        """Expire waiting messages past their `expires` (and apply the streams' retention);
        returns how many expired."""
        self.retain_streams(now)
        self.expire_producers(now)
        self.delete_idle(now)
        count = 0
        left = self._sweep_round  # a slice a call: 100,000 queues took 25 ms a pass
        if not left:
            left.extend(q for a in self.addresses.values() for q in a.queues)
            left.extend(self.reply_queues.values())  # temporary queues
        for _ in range(min(SWEEP_SLICE, len(left))):
            q = left.pop()
            if q.expiring and not q.deleted:
                for entry in q.remove_where(lambda e: 0 < e.message.expires <= now):
                    self._expire(q, entry, now)
                    count += 1
        return count

    def _expire(self, q: Queue, entry: Entry, now: int) -> None:
        self.stats["expired"] += 1
        if self.settings.expired_policy == "dead-letter" and not q.is_dead_letter:
            self._dead_letter(q, entry, "expired", now)
        else:
            self._consumed(q, entry)
            self.events.append(BrokerEvent("expired", q.address, entry.message.message_id))

    # ----------------------------------------------------------------- dispatch

    def _dispatch(self, q: Queue, now: int) -> None:
        """Hand waiting messages to consumers with room, round-robin."""
        consumers = q.consumers
        n = len(consumers)
        if not n or (not q.count and q.address.log is None):
            return  # nobody to hand anything to, or nothing to hand out nor to read back
        idle = 0
        outbox = self.outbox
        while q.count:
            sub = consumers[q.rr % n]
            q.rr += 1
            session = sub.session
            box = outbox.get(session.id)
            # sub.can_take(), written out (this loop runs for every message handed out)
            if not session.writable or (sub.ack_mode != ACK_AUTO
                                        and len(sub.unacked) >= sub.prefetch) \
                    or (box is not None and len(box) >= sub.turn_cap and self._turn_full(sub)):
                idle += 1
                if idle >= n:
                    break
                continue
            index = sub.index
            if index is None:
                entry = q.pop()
                if entry is None:
                    break
            else:  # a selector: the first entry it matches, wherever it waits
                found = index.first()
                if found is None:
                    idle += 1
                    if idle >= n:
                        break
                    continue
                entry = q.take(found)
            expires = entry.message.expires
            if expires and expires <= now:
                self._expire(q, entry, now)
                continue
            idle = 0
            self._deliver(sub, entry)
        if q.address.log is not None and q.count < PAGE_LOW:
            self._want_pages(q)  # core/broker/paging.py: the next window, read by the store

    def _turn_full(self, sub: Subscription) -> bool:
        """A session takes at most TURN_DELIVERIES messages per turn of the server (an
        auto-ack consumer at most its `prefetch`, nothing else bounds it): a backlog handed
        out in one turn would keep the event loop, and the pair's lease renewal, waiting
        (a client-ack consumer acknowledging 2,000 messages at once got 2,000 new ones in
        the same turn: 100 ms). The rest comes at the next turns (`take_capped`)."""
        box = self.outbox.get(sub.session.id)
        if box is not None and len(box) >= sub.turn_cap:
            self._capped.add(sub.session.id)
            return True
        return False

    def _deliver(self, sub: Subscription, entry: Entry) -> None:
        entry.deliveries += 1
        session = sub.session
        if sub.ack_mode == ACK_AUTO:
            ack_id = None
            self._consumed(sub.queue, entry)
        else:
            message = entry.message
            if message.persistent and sub.queue.key is not None:
                self.records.append((rec.DELIVERED, sub.queue.key, message, entry.deliveries))
            session.ack_seq += 1
            ack_id = str(session.ack_seq)
            sub.unacked[ack_id] = entry
            session.acks[ack_id] = sub
            index = session.legacy_index
            if index is not None:
                message_id = entry.message.message_id
                index[(sub.id, message_id)] = ack_id
                index[("", message_id)] = ack_id
        self.stats["delivered"] += 1
        box = self.outbox.get(session.id)
        if box is None:
            box = self.outbox[session.id] = []
        box.append(Delivery(sub, entry, ack_id, entry.deliveries))

    def _consumed(self, q: Queue, entry: Entry) -> None:
        """The entry leaves the broker: release its bytes, maybe resuming producers."""
        address = q.address
        message = entry.message
        address.size -= message.size
        address.dequeued += 1
        capacity = self.capacity
        capacity.memory -= message.size + INDEX_BYTES
        if message.persistent and q.key is not None:
            self.records.append((rec.DEL, q.key, message))
        if address.state is _FULL and address.size <= address.limit * self.settings.resume_ratio:
            self._resumed(address, f"{address.size} bytes")
        if capacity.shortages and Shortage.MEMORY in capacity.shortages:
            self._server_changed(capacity.check_memory())

    def _return(self, q: Queue, entries: list[Entry], now: int) -> None:
        """Delivered but not acknowledged: back to the head, or to the dead-letter queue."""
        if q.deleted:
            for entry in entries:
                self._consumed(q, entry)
            return
        limit = self.settings.max_delivery_attempts
        keep = []
        for entry in entries:
            if limit and entry.deliveries >= limit and not q.is_dead_letter:
                self._dead_letter(q, entry, "max-delivery-attempts", now)
            else:
                keep.append(entry)
        if keep:
            q.push_front(keep)

    def _dead_letter(self, q: Queue, entry: Entry, reason: str, now: int) -> None:
        self._consumed(q, entry)
        old = entry.message
        headers = dict(old.headers)
        headers.pop("expires", None)
        headers["original-destination"] = old.destination
        headers["dead-letter-reason"] = reason
        destination = self._dead_letter_destination(q)  # core/broker/configured.py
        dlq = self._plain_queue(destination)
        self.stats["dead_lettered"] += 1
        self.events.append(BrokerEvent("dead-lettered", dlq.address,
                                       f"{old.message_id} from {old.destination}: {reason}"))
        self._copy_to(dlq, old, headers, 0, now)

    # ----------------------------------------------------------------- destinations

    def _may_create(self, destination: str, kind: str) -> None:
        """A client's frame may make this destination: the server holds fewer than
        max_destinations, temporary queues included (those are checked as they are made,
        `_temp_queue`)."""
        if kind != TEMP and kind != REPLY and destination not in self.addresses:
            self._room_for(destination)

    def _room_for(self, destination: str) -> None:
        most = self.settings.max_destinations
        if most and len(self.addresses) + len(self.reply_queues) >= most:
            raise CoreError(f"too many destinations: the server holds max_destinations "
                            f"({most}); {destination} is not made")

    def _address(self, name: str, kind: str) -> Address:
        address = self.addresses.get(name)
        if address is None:
            rule = self.settings.rule_for(name)
            address = self.addresses[name] = Address(name, kind, rule.max_size_bytes,
                                                     rule.policy, rule.dup_cache_size)
        return address

    def _plain_queue(self, destination: str, args: QueueArgs | None = None) -> Queue:
        """The queue, made if new (with the settings `args`, core/broker/configured.py; a queue
        that exists keeps its own)."""
        q = self.queues.get(destination)
        if q is None:
            address = self._address(destination, QUEUE)
            name = destination[len("/queue/"):]
            q = self.queues[destination] = Queue(destination, address, name)
            q.is_dead_letter = name.startswith(self.settings.dead_letter_prefix)
            q.key = destination
            address.queues.append(q)
            self.records.append(self._configured(q, args))  # (DEST, destination[, args])
        return q

    def _temp_queue(self, session: Session, name: str) -> Queue:
        q = session.temp_queues.get(name)
        if q is None:
            self._room_for(f"/temp-queue/{name}")
            token = f"{session.token}.{name}"
            # No pattern names a temporary queue: the defaults apply.
            address = Address(f"/reply-queue/{token}", TEMP, self.settings.max_size_bytes,
                              self.settings.address_full_policy, self.settings.dup_cache_size)
            q = Queue(f"/temp-queue/{name}", address, f"temp.{name}")
            q.owner = session.id
            address.queues.append(q)
            session.temp_queues[name] = q
            self.reply_queues[token] = q
        return q

    def _delete_queue(self, q: Queue) -> None:
        self._leave_log(q)
        address = q.address
        if q in address.queues:
            address.queues.remove(q)
        for entry in q.clear():
            self._consumed(q, entry)
        q.deleted = True
        if q.address.kind == TEMP and address.state is AddressState.FULL:
            self._resumed(address, "deleted")
