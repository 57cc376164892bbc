"""The messaging model: applies client commands, returns deliveries and events.

Deterministic and free of I/O: time comes in as `now` (ms since the epoch), message ids
from a counter, the server-wide guards' numbers (disk usage, bytes the store paged out,
whether the journal is full) as inputs too, and everything a command causes is left in
`outbox` (deliveries per connection) and `events` (destinations or the server full and
resumed) for the server to act on; a SEND's fate is its returned `Outcome`. The journal
can therefore record commands and replay them into the same state. The SEND path, with
flow control, is in core/broker/intake.py; how a backup's broker follows the active's journal
entry by entry, in core/broker/follow.py; how a session outlives its connection, in
core/broker/resume.py.
"""

from __future__ import annotations

from pairmq.core import records as rec
from pairmq.core.accounts import Accounts
from pairmq.core.broker.acking import Acknowledgements
from pairmq.core.broker.committing import CommitLedger, Committing
from pairmq.core.broker.configured import ConfiguredQueues
from pairmq.core.broker.follow import Follow
from pairmq.core.broker.idle import IdleDestinations
from pairmq.core.broker.intake import BrokerEvent, Intake
from pairmq.core.broker.operations import Operations
from pairmq.core.broker.paging import PAGE_LOW, Paging
from pairmq.core.broker.resume import Resume
from pairmq.core.broker.streams import Streams
from pairmq.core.browsing import Browse, browse
from pairmq.core.capacity import INDEX_BYTES, Capacity, Shortage
from pairmq.core.destinations import QUEUE, REPLY, STREAM_PREFIX, TEMP, TOPIC, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.message import Entry
from pairmq.core.paged_log import PagedLog
from pairmq.core.permissions import Exists
from pairmq.core.permissions import durable_name as durable_name_of
from pairmq.core.queue import Address, AddressState, Queue
from pairmq.core.queue_args import QueueArgs, args_from_text
from pairmq.core.replay import Replay
from pairmq.core.selective import SelectorIndex
from pairmq.core.selector import Selector, compile_selector
from pairmq.core.session import Session, Transaction
from pairmq.core.settings import CoreSettings
from pairmq.core.stream_log import Outgoing, StreamCursor, StreamLog
from pairmq.core.subscription import ACK_AUTO, Delivery, Subscription, ack_mode_of

NOTHING = Exists()
# Queues sweep_expired looks at per call (every second), at most: an expired message waits
# up to (queues / SWEEP_SLICE) seconds longer to go.
SWEEP_SLICE = 20_000

__all__ = ["Broker", "BrokerEvent", "Delivery"]  # BrokerEvent: core/broker/intake.py

_FULL = AddressState.FULL  # tested for every message consumed (see core/broker/intake.py)
TURN_DELIVERIES = 512  # messages one session is handed per turn of the server, at most


class Broker(Intake, Acknowledgements, Committing, Follow, Resume, Streams, Paging,
             IdleDestinations, Operations, ConfiguredQueues):
    def __init__(self, settings: CoreSettings | None = None, id_prefix: str = "ID:pairmq-") -> None:
        self.settings = settings or CoreSettings()
        self.id_prefix = id_prefix
        self.addresses: dict[str, Address] = {}
        self.queues: dict[str, Queue] = {}  # "/queue/NAME" -> queue
        self.durables: dict[str, Queue] = {}  # durable subscription key -> its queue
        self.accounts = Accounts()  # users changed at run time (core/accounts.py)
        # "/stream/NAME" -> its log (core/broker/streams.py)
        self.streams: dict[str, StreamLog] = {}
        self.sessions: dict[int, Session] = {}
        self.client_ids: dict[str, int] = {}
        self.reply_queues: dict[str, Queue] = {}  # reply-queue token -> temp queue
        self.queue_args: dict[str, QueueArgs] = {}  # x- arguments of queues (configured.py)
        self.outbox: dict[int, list[Outgoing]] = {}
        # Sessions whose auto-ack deliveries stopped at the per-turn limit: the server
        # writes what they got, then asks for more (`take_capped`, `set_writable`).
        self._capped: set[int] = set()
        self.events: list[BrokerEvent] = []
        self.records: list[rec.Record] = []  # durable state changes for the journal (core.records)
        self.stats = {"received": 0, "delivered": 0, "acknowledged": 0, "expired": 0,
                      "dead_lettered": 0, "unroutable_topic": 0, "duplicates": 0,
                      "dropped": 0, "producers_evicted": 0, "paged": 0, "paged_in": 0}
        self.page_wanted: dict[Queue, None] = {}  # core/broker/paging.py
        self.moved_logs: dict[PagedLog, None] = {}  # logs whose readers moved
        # stream cursors waiting for a read back (streams.py)
        self.stream_reads: dict[StreamCursor, None] = {}
        self.capacity = Capacity(self.settings)
        self._message_seq = 0
        self._order_seq = 0
        self._session_seq = 0
        self._index: dict[str, dict[str, Entry]] | None = None  # while following (follow.py)
        self._unsorted: set[Queue] = set()
        self._idle_since: dict[str, int] = {}  # core/broker/idle.py
        self._idle_round: list[str] = []
        self._sweep_round: list[Queue] = []  # queues sweep_expired has still to look at
        self.commits = CommitLedger()  # COMMITs applied in slices (core/broker/committing.py)

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

    # ----------------------------------------------------------------- SUBSCRIBE

    def subscribe(self, conn_id: int, sub_id: str, destination: str, now: int,
                  ack: str = "auto", prefetch: int | None = None,
                  durable_name: str | None = None, selector: str | None = None,
                  queue_args: QueueArgs | None = None) -> Subscription:
        """`selector`: a JMS message selector (core/selector.py), parsed here once: a
        topic subscription keeps only what matches; a queue consumer takes only what
        matches and leaves the rest for others (core/selective.py)."""
        session = self._session(conn_id)
        session.check_free(sub_id, self.settings.max_subscriptions_per_connection)
        ack_mode = ack_mode_of(ack)
        chosen = compile_selector(selector) if selector is not None else None
        if prefetch is None or prefetch <= 0:
            prefetch = self.settings.default_prefetch
        kind, name = parse_destination(destination)
        self._may_create(destination, kind)
        durable = False
        if kind == QUEUE:
            q = self._plain_queue(destination, queue_args)  # settings if made now
        elif kind == TEMP:
            q = self._temp_queue(session, name)
        elif kind == REPLY:
            found = self.reply_queues.get(name)
            if found is None:
                raise CoreError(f"temporary queue {destination!r} no longer exists")
            if found.owner != conn_id:
                raise CoreError("only the connection that created a temporary queue may "
                                "subscribe to it")
            q = found
        else:
            address = self._address(destination, TOPIC)
            if durable_name:
                durable = True
                q = self._durable_queue(session, address, name, durable_name)
                self._reselect(q, chosen)
            else:
                q = Queue(f"{destination}#{session.token}/{sub_id}", address, name)
                q.accepts = chosen
                address.queues.append(q)
        index = None
        if chosen is not None and kind != TOPIC:
            index = SelectorIndex(chosen)
            index.fill(q.entries())
            q.selective.append(index)
        sub = Subscription(session, sub_id, destination, q, ack_mode, prefetch, durable, index)
        session.subs[sub_id] = sub
        q.consumers.append(sub)
        self._dispatch(q, now)
        return sub

    def _reselect(self, q: Queue, chosen: Selector | None) -> None:
        """A durable subscription keeps what its subscriber's selector matches. A
        subscriber coming back with another selector (or after a restart or a failover,
        where the selector, held in memory, was lost) changes it; what waits and does not
        match is dropped, as JMS does when a durable subscriber changes its selector."""
        before = q.accepts
        q.accepts = chosen
        if chosen is None or (before is not None and before.text == chosen.text):
            return
        for entry in q.remove_where(lambda e: not chosen.matches_message(e.message)):
            self._consumed(q, entry)

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

    def exists_for(self, conn_id: int, command: str, headers: dict[str, str]) -> Exists:
        """What a SUBSCRIBE or UNSUBSCRIBE finds on this connection (its client-id's
        durable subscription, the non-durable topic subscription it ends): what its
        permission check asks (core/permissions.py)."""
        if command not in ("SUBSCRIBE", "UNSUBSCRIBE"):
            return NOTHING
        session = self._session(conn_id)
        name = durable_name_of(headers)
        if name is not None:
            key = f"{session.client_id}:{name}" if session.client_id else name
            q = self.durables.get(key)
            return Exists(durable_topic=None if q is None else q.address.name)
        sub = session.subs.get(headers.get("id", "")) if command == "UNSUBSCRIBE" else None
        if sub is not None and not sub.durable and sub.queue.address.kind == TOPIC:
            return Exists(non_durable_topic=sub.queue.address.name)
        return NOTHING

    def _durable_queue(self, session: Session, address: Address, topic_name: str,
                       durable_name: str) -> Queue:
        key = f"{session.client_id}:{durable_name}" if session.client_id else durable_name
        q = self.durables.get(key)
        if q is not None and q.consumers:
            raise CoreError(f"durable subscription {key!r} is already active on another "
                            "connection")
        if q is not None and q.address is not address:
            # Re-subscribing a durable name to another topic replaces it, as in ActiveMQ.
            self._drop_durable(key)
            q = None
        if q is None:
            q = Queue(f"durable:{key}", address, topic_name)
            q.durable_key = key
            q.key = f"durable:{key}"
            address.queues.append(q)
            self.durables[key] = q
            self.records.append((rec.DURABLE, key, address.name))
        return q

    def unsubscribe(self, conn_id: int, sub_id: str | None, now: int,
                    delete_durable: bool = False, durable_name: str | None = None) -> None:
        """Remove a subscription; with delete_durable, also the durable subscription behind it."""
        session = self._session(conn_id)
        if self._stream_unsubscribe(session, sub_id):
            return
        sub = session.subs.pop(sub_id, None) if sub_id is not None else None
        if sub is not None:
            self._detach(sub, now, delete=delete_durable)
            return
        if delete_durable and durable_name:
            key = f"{session.client_id}:{durable_name}" if session.client_id else durable_name
            q = self.durables.get(key)
            if q is None:
                raise CoreError(f"no durable subscription {key!r}")
            if q.consumers:
                raise CoreError(f"durable subscription {key!r} is active on another connection")
            self._drop_durable(key)
            return
        raise CoreError(f"no subscription with id {sub_id!r} on this connection")

    def _detach(self, sub: Subscription, now: int, delete: bool) -> None:
        q = sub.queue
        session = sub.session
        if sub in q.consumers:
            q.consumers.remove(sub)
        if sub.index is not None and sub.index in q.selective:
            q.selective.remove(sub.index)
        held = list(sub.unacked.items())
        sub.unacked.clear()
        for ack_id, entry in held:
            session.acks.pop(ack_id, None)
            self._forget_legacy(session, sub.id, entry.message.message_id, ack_id)
        entries = [entry for _, entry in held]
        temporary_topic_queue = q.address.kind == TOPIC and q.durable_key is None
        if temporary_topic_queue or (delete and q.durable_key is not None):
            for entry in entries:
                self._consumed(q, entry)
            if q.durable_key is not None:
                self._drop_durable(q.durable_key)
            else:
                self._delete_queue(q)
            return
        self._return(q, entries, now)
        self._dispatch(q, now)

    def _drop_durable(self, key: str) -> None:
        q = self.durables.pop(key)
        self._delete_queue(q)
        self.records.append((rec.UNDURABLE, key))

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

    # ----------------------------------------------------------------- internals

    def _dispatch(self, q: Queue, now: int) -> None:
        """Hand waiting messages to consumers with room, round-robin."""
        consumers = q.consumers
        n = len(consumers)
        if not n:
            return
        idle = 0
        while q.count:
            sub = consumers[q.rr % n]
            q.rr += 1
            if not sub.can_take() or self._turn_full(sub):
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
        if q.count < PAGE_LOW and q.address.log is not None:
            self._want_pages(q)  # core/broker/paging.py: the next window, read by the store

    def _turn_full(self, sub: Subscription) -> bool:
        """A session takes at most TURN_DELIVERIES messages per turn of the server (an
        auto-ack consumer at most its `prefetch`, nothing else bounds it): a backlog handed
        out in one turn would keep the event loop, and the pair's lease renewal, waiting
        (a client-ack consumer acknowledging 2,000 messages at once got 2,000 new ones in
        the same turn: 100 ms). The rest comes at the next turns (`take_capped`)."""
        box = self.outbox.get(sub.session.id)
        if box is not None and len(box) >= min(sub.prefetch, TURN_DELIVERIES):
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

    def _reply_temp_queue(self, session: Session, name: str, now: int) -> None:
        """A SEND's `reply-to:/temp-queue/NAME` makes that temporary queue and, as RabbitMQ
        does, subscribes its sender to it: id `/temp-queue/NAME`, ack auto, so that replies
        reach it without a SUBSCRIBE. Not when the sender has a subscription there already
        (nor when the id is taken or the connection has all the subscriptions it may: a
        COMMIT applies whole, so this never refuses). An explicit SUBSCRIBE to the temp
        queue later takes its place (`end_auto_reply`)."""
        q = self._temp_queue(session, name)
        sub_id = f"/temp-queue/{name}"
        most = self.settings.max_subscriptions_per_connection
        if q.consumers or sub_id in session.subs or sub_id in session.cursors or (
                most and len(session.subs) + len(session.cursors) >= most):
            return
        session.auto_replies[sub_id] = self.subscribe(session.id, sub_id, sub_id, now)

    def end_auto_reply(self, conn_id: int, destination: str, now: int) -> None:
        """A SUBSCRIBE to `/temp-queue/NAME`: the subscription a reply-to made there, if
        it is still there, ends first (its replies are not shared with the new one)."""
        session = self._session(conn_id)
        sub = session.auto_replies.pop(destination, None)
        if sub is not None and session.subs.get(destination) is sub:
            self.unsubscribe(conn_id, destination, now)

    def _session(self, conn_id: int) -> Session:
        session = self.sessions.get(conn_id)
        if session is None:
            raise CoreError("not connected")
        return session

    @staticmethod
    def _tx(session: Session, transaction: str) -> Transaction:
        tx = session.txs.get(transaction)
        if tx is None:
            raise CoreError(f"unknown transaction {transaction!r}")
        return tx


