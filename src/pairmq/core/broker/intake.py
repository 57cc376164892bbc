"""How messages come in: SEND (and a COMMIT's sends), the admission decision, full
destinations and the server-wide guards. Part of the Broker (core/broker/broker.py), kept apart
because it is the path every message takes and the one flow control changes.

Deterministic: the guards' numbers (bytes the store paged out, disk usage, whether the
journal is full) come in as inputs, like `now`; what a SEND became is its `Outcome`
(core/admission.py), and transitions are left in `events` for the server to log and act
on (release held producers).
"""

from __future__ import annotations

from typing import Final

from pairmq.core import records as rec
from pairmq.core.admission import (
    ACCEPTED,
    DUPLICATE,
    PAGED,
    Admission,
    Cause,
    Outcome,
    decide,
    refusal,
)
from pairmq.core.broker.acking import Acknowledgements
from pairmq.core.broker.events import BrokerEvent
from pairmq.core.capacity import INDEX_BYTES, Shortage
from pairmq.core.commit_ledger import staged_bytes
from pairmq.core.destinations import QUEUE, REPLY, STREAM, TEMP, TOPIC, parse_destination
from pairmq.core.errors import CoreError
from pairmq.core.message import DEFAULT_PRIORITY, Entry, Message
from pairmq.core.producers import (
    STAMP_HEADERS,
    Producers,
    SequenceRefused,
    Stamp,
    stamp_of,
)
from pairmq.core.queue import Address, AddressState, Queue
from pairmq.core.session import BatchRest, PendingSend, Session, Transaction
from pairmq.core.settings import AddressFullPolicy
from pairmq.protocol.batch import SEND_BATCH_HEADER
from pairmq.protocol.stamps import EPOCH_HEADER, PRODUCER_HEADER, SEQ_HEADER

_NAMED: Final = (QUEUE, TOPIC, STREAM)  # kinds whose address is found by the destination's name
# Enum members as module constants: the SEND path tests them for every message, and a
# member looked up on its class costs about 90 ns each time (Python 3.11).
_OPEN: Final = AddressState.OPEN
_IS_ACCEPTED: Final = Admission.ACCEPTED
_IS_PAGED: Final = Admission.PAGED

# Address-full policies under which a message can be held or refused (page and drop take
# every message, core/admission.py).
_HOLDING_POLICIES: Final = frozenset({AddressFullPolicy.BLOCK, AddressFullPolicy.FAIL})
_PRIORITIES: Final = frozenset("0123456789")
# Headers that describe one frame's transport, not the message: never stored or forwarded.
TRANSPORT_HEADERS: Final = frozenset({
    "receipt", "transaction", "content-length", "destination", "message-id", "subscription",
    "ack", "redelivered", "delivery-count", *STAMP_HEADERS,
})


class Intake(Acknowledgements):
    """The Broker's SEND path (a mixin)."""

    def send(self, conn_id: int, destination: str, headers: dict[str, str], body: bytes,
             now: int, transaction: str | None = None,
             journal_full: str | None = None) -> Outcome:
        """Take a message, or not: the Outcome says which and what the server must do.
        `journal_full`: why the journal takes no more persistent messages (None: it does).
        Inside a transaction the message only waits for COMMIT, where it is decided."""
        session = self._session(conn_id)
        kind, name = parse_destination(destination)
        if destination not in self.addresses:  # the usual case needs no call
            self._may_create(destination, kind)
        _check_message_headers(headers)
        # stamp_of(headers), without its call for a SEND that names no producer stamp
        stamp = stamp_of(headers) if (PRODUCER_HEADER in headers or SEQ_HEADER in headers
                                      or EPOCH_HEADER in headers) else None
        if kind == REPLY and name not in self.reply_queues:
            raise CoreError(f"temporary queue {destination!r} no longer exists")
        if transaction is not None:
            if stamp is not None:
                raise _stamp_in_transaction()
            self._stage(transaction, self._tx(session, transaction),
                        [PendingSend(destination, headers, body)])
            return ACCEPTED
        if stamp is None:
            return self._route(session, destination, kind, name, headers, body, now,
                               journal_full)
        address = self._existing_address(session, destination, kind, name)
        try:
            if address is not None and address.producers is not None \
                    and address.producers.duplicates(stamp, 1, destination):
                self.stats["duplicates"] += 1  # taken already: confirm again, store nothing
                return DUPLICATE
        except SequenceRefused as e:
            return Outcome(Admission.FAILED, Cause.SEQUENCE, None, str(e))
        outcome = self._route(session, destination, kind, name, headers, body, now,
                              journal_full)
        if outcome.admission is not Admission.HELD and outcome.admission is not Admission.FAILED:
            self._took(session, destination, kind, name, stamp, stamp.seq, now,
                       headers.get("persistent") == "true")
        return outcome

    def send_batch(self, conn_id: int, destination: str, headers: dict[str, str],
                   messages: list[tuple[dict[str, str], bytes]], now: int,
                   transaction: str | None = None, journal_full: str | None = None,
                   slice_size: int = 0) -> Outcome:
        """A batched SEND (`pairmq-batch`, docs/stomp.md): each of `messages` is one message to
        `destination`, with the frame's headers and its own over them. Taken as a COMMIT
        takes its sends: held or refused as a whole when one message would be, else every
        message routed (a duplicate answered, page and drop applied message by message).
        Inside a transaction the messages wait for its COMMIT. With `slice_size`, at most
        that many are routed now: the rest waits in the session (`batch_open`) for
        `continue_batch`, one slice per turn of the server (a turn must stay short)."""
        session = self._session(conn_id)
        kind, name = parse_destination(destination)
        self._may_create(destination, kind)
        if "dup-id" in headers:
            raise CoreError("a batched SEND carries a dup-id per message, in its records, "
                            "not on the frame")
        stamp = stamp_of(headers)
        if kind == REPLY and name not in self.reply_queues:
            raise CoreError(f"temporary queue {destination!r} no longer exists")
        common = {k: v for k, v in headers.items() if k != SEND_BATCH_HEADER}
        merged = [({**common, **own} if own else common, body) for own, body in messages]
        for i, (hdrs, _) in enumerate(merged):
            _check_message_headers(hdrs)
            own = messages[i][0]
            if own and not STAMP_HEADERS.isdisjoint(own):
                raise CoreError(f"message {i + 1} of a batched SEND names its producer "
                                "stamp: a batch's stamp is on the frame (pairmq-seq numbers "
                                "its first message, the others follow)")
        if transaction is not None:
            if stamp is not None:
                raise _stamp_in_transaction()
            self._stage(transaction, self._tx(session, transaction),
                        [PendingSend(destination, hdrs, body) for hdrs, body in merged])
            return ACCEPTED
        address = self._existing_address(session, destination, kind, name)
        count = len(merged)
        if stamp is not None and address is not None and address.producers is not None:
            try:
                taken = address.producers.duplicates(stamp, count, destination)
            except SequenceRefused as e:
                return Outcome(Admission.FAILED, Cause.SEQUENCE, None, str(e))
            if taken:  # the first `taken` messages came before: confirmed, not stored again
                self.stats["duplicates"] += taken
                if taken == count:
                    return DUPLICATE
                merged = merged[taken:]
        if journal_full is not None or self.capacity.shortages or (
                address is not None and address.state is not _OPEN
                and address.policy in _HOLDING_POLICIES):
            # One message held or refused holds or refuses them all: check every one
            # before changing anything. Nothing else holds or refuses (a full destination
            # under page or drop takes each message its own way, in _route).
            for hdrs, _ in merged:
                admission, cause, address = self._admission(session, destination, kind, name,
                                                             hdrs, journal_full)
                if admission is Admission.HELD or admission is Admission.FAILED:
                    return refusal(admission, cause, address, self.capacity, journal_full)
        if stamp is not None and len(merged) < count:
            stamp = stamp._replace(seq=stamp.seq + count - len(merged))
        rest = BatchRest(destination, kind, name, merged, journal_full, stamp)
        if not self._route_slice(session, rest, slice_size or len(merged), now):
            session.batch = rest
        return ACCEPTED

    def _stage(self, name: str, tx: Transaction, sends: list[PendingSend]) -> None:
        """Keep sends for the transaction's COMMIT, within its limits; their bytes count
        in the server's memory until then (`_unstage`)."""
        settings = self.settings
        if tx.held() + len(sends) > settings.max_transaction_messages:
            raise CoreError(f"transaction {name!r} would hold more than "
                            f"max_transaction_messages ({settings.max_transaction_messages}) "
                            "messages: COMMIT it before sending more")
        size = sum(map(staged_bytes, sends))
        if tx.bytes + size > settings.max_transaction_bytes:
            raise CoreError(f"transaction {name!r} would hold more than "
                            f"max_transaction_bytes ({settings.max_transaction_bytes}) bytes: "
                            "COMMIT it before sending more")
        tx.sends.extend(sends)
        tx.bytes += size
        capacity = self.capacity
        capacity.memory += size
        self._server_changed(capacity.check_memory())

    def _unstage(self, tx: Transaction) -> None:
        """The transaction's sends leave (COMMIT routes them, counted as messages then;
        ABORT or a closed session drops them)."""
        if tx.bytes:
            capacity = self.capacity
            capacity.memory -= tx.bytes
            tx.bytes = 0
            self._server_changed(capacity.check_memory())

    def batch_open(self, conn_id: int) -> bool:
        """A batched SEND of this connection is not routed whole yet."""
        session = self.sessions.get(conn_id)
        return session is not None and session.batch is not None

    def continue_batch(self, conn_id: int, most: int, now: int) -> bool:
        """Route the next `most` messages of the open batch; True once it is all routed."""
        session = self._session(conn_id)
        rest = session.batch
        assert rest is not None, "no batch open"
        stamp = rest.stamp
        if stamp is not None:  # numbers taken meanwhile (a resend on another connection)
            address = self._existing_address(session, rest.destination, rest.kind, rest.name)
            producers = address.producers if address is not None else None
            first = stamp._replace(seq=stamp.seq + rest.done)
            left = len(rest.messages) - rest.done
            taken = producers.duplicates(first, left, rest.destination) \
                if producers is not None else 0
            if taken:
                self.stats["duplicates"] += taken
                rest.done += taken
        if self._route_slice(session, rest, most, now):
            session.batch = None
            return True
        return False

    def _route_slice(self, session: Session, rest: BatchRest, most: int, now: int) -> bool:
        """Route the next `most` messages of a batch; True when none is left."""
        start = rest.done
        end = min(len(rest.messages), start + most)
        for hdrs, body in rest.messages[start:end]:
            self._route(session, rest.destination, rest.kind, rest.name, hdrs, body, now,
                        rest.journal_full, admitted=True)
        rest.done = end
        stamp = rest.stamp
        if stamp is not None and end > start:  # journaled if any is (a record may say so)
            self._took(session, rest.destination, rest.kind, rest.name, stamp,
                       stamp.seq + end - 1, now,
                       any(hdrs.get("persistent") == "true"
                           for hdrs, _ in rest.messages[start:end]))
        return end >= len(rest.messages)

    def _admission(self, session: Session | None, destination: str, kind: str, name: str,
                   headers: dict[str, str], journal_full: str | None
                   ) -> tuple[Admission, Cause, Address | None]:
        """What decide() says of this message now; changes nothing."""
        address = self._existing_address(session, destination, kind, name)
        dup_id = headers.get("dup-id")
        duplicate = address is not None and dup_id is not None and dup_id in address.dups
        full = address is not None and address.state is AddressState.FULL
        shortages = self.capacity.shortages
        if journal_full is not None:
            shortages = shortages | {Shortage.JOURNAL}
        if not (duplicate or full or shortages):
            return Admission.ACCEPTED, Cause.NONE, address
        persistent = headers.get("persistent") == "true" or kind == STREAM
        pageable = (persistent and full and address is not None and bool(address.queues)
                    and all(q.key is not None for q in address.queues))
        admission, cause = decide(
            duplicate=duplicate, persistent=persistent, pageable=pageable,
            destination_full=full, policy=address.policy if address is not None
            else self.settings.address_full_policy, shortages=shortages,
            full_policy=self.settings.full_policy)
        return admission, cause, address

    def _route(self, session: Session | None, destination: str, kind: str, name: str,
               headers: dict[str, str], body: bytes, now: int, journal_full: str | None = None,
               admitted: bool = False) -> Outcome:
        """Decide, then route. `admitted`: a COMMIT already decided it is not held or
        refused (only page and drop still apply message by message)."""
        address = self.addresses.get(destination) if kind in _NAMED \
            else self._existing_address(session, destination, kind, name)
        if journal_full is None and not self.capacity.shortages and (
                address is None or (address.state is _OPEN and (
                    "dup-id" not in headers or headers["dup-id"] not in address.dups))):
            admission = _IS_ACCEPTED  # the common case, decided quickly
        else:
            admission, cause, address = self._admission(session, destination, kind, name,
                                                         headers, journal_full)
        if admission is not _IS_ACCEPTED and admission is not _IS_PAGED:
            if admission is Admission.DUPLICATE:
                # Already accepted: confirm again, deliver nothing, count nothing.
                self.stats["duplicates"] += 1
                return DUPLICATE
            if admission is Admission.DROPPED:
                assert address is not None
                self.stats["dropped"] += 1
                address.dropped += 1
                address.period_dropped += 1
                return Outcome(admission, cause, address)
            if not admitted:
                return refusal(admission, cause, address, self.capacity, journal_full)
            admission = Admission.ACCEPTED
        stored = {}
        size = 64 + len(body)
        for k, v in headers.items():
            if k not in TRANSPORT_HEADERS:
                stored[k] = v
                size += len(k) + len(v)
        reply_to = stored.get("reply-to")
        if reply_to is not None and session is not None and reply_to.startswith("/temp-queue/"):
            temp_name = reply_to[len("/temp-queue/"):]
            if temp_name:  # made, and its sender subscribed to it (as RabbitMQ does)
                self._reply_temp_queue(session, temp_name, now)
                stored["reply-to"] = f"/reply-queue/{session.token}.{temp_name}"
        if kind == STREAM:  # core/broker/streams.py
            return self._stream_route(destination, stored, body, now)
        if kind == TOPIC:
            address = self._address(destination, TOPIC)
            targets = address.queues
        else:
            if kind == QUEUE:
                q = self._plain_queue(destination)
            elif kind == TEMP:
                assert session is not None, "a temporary queue needs its connection"
                q = self._temp_queue(session, name)
            else:
                reply = self.reply_queues.get(name)
                if reply is None:
                    raise CoreError(f"temporary queue {destination!r} no longer exists")
                q = reply
            address = q.address
            targets = [q]
        dup_id = stored.get("dup-id")
        if dup_id is not None:
            self._remember_dup(address, dup_id)
        self._message_seq += 1
        self._order_seq += 1
        message_id = f"{self.id_prefix}{self._message_seq}"
        if "timestamp" not in stored:
            stored["timestamp"] = stamp = str(now)
            size += 9 + len(stamp)
        priority = int(stored.get("priority", DEFAULT_PRIORITY))
        expires = int(stored.get("expires", 0) or 0)
        if kind == QUEUE and self.queue_args:  # x-message-ttl (core/broker/configured.py)
            expires = self._queue_expires(destination, expires, now)
        message = Message(message_id, destination, stored, body,
                          stored.get("persistent") == "true", priority, expires, size,
                          self._order_seq)
        self.stats["received"] += 1
        address.enqueued += 1
        if kind == TOPIC and targets and any(q.accepts is not None for q in targets):
            # subscriptions with a selector keep only what matches (core/selector.py)
            targets = [q for q in targets
                       if q.accepts is None or q.accepts.matches_message(message)]
        if not targets:
            self.stats["unroutable_topic"] += 1
            return ACCEPTED
        keys = None
        if message.persistent:
            keys = [q.key for q in targets if q.key is not None]
            if keys:
                self.records.append((rec.ADD, message, keys))
        if keys and len(keys) == len(targets) and (admission is _IS_PAGED or (
                (log := address.log) is not None and log.busy)):  # `_pages_to_log`, inline
            self._to_log(address, targets, message)  # core/broker/paging.py: no object kept
        else:
            for q in list(targets):
                self._enqueue(q, Entry(message), now)
        if address.size > address.limit and address.limit:
            self._check_full(address)
        return PAGED if admission is _IS_PAGED else ACCEPTED

    def _check_full(self, address: Address) -> None:
        """Past its limit: FULL, once, until it drains under resume_ratio of it."""
        if address.limit and address.size > address.limit \
                and address.state is AddressState.OPEN:
            address.state = AddressState.FULL
            address.period_dropped = 0
            self.events.append(BrokerEvent("address-full", address,
                                           f"{address.size} bytes, limit {address.limit}"))

    def _existing_address(self, session: Session | None, destination: str, kind: str,
                          name: str) -> Address | None:
        if kind in _NAMED:
            return self.addresses.get(destination)
        if kind == TEMP:
            q = session.temp_queues.get(name) if session is not None else None
        else:
            q = self.reply_queues.get(name)
        return q.address if q is not None else None

    def _remember_dup(self, address: Address, dup_id: str) -> None:
        dups = address.dups
        dups[dup_id] = None
        durable = address.kind != TEMP  # a temp queue dies with its connection anyway
        if durable:
            self.records.append((rec.DUP, address.name, dup_id))
        if len(dups) > address.dup_limit:
            oldest = dups.popitem(last=False)[0]
            if durable:
                self.records.append((rec.DUP_EVICT, address.name, oldest))

    def _took(self, session: Session, destination: str, kind: str, name: str, stamp: Stamp,
              last: int, now: int, persistent: bool) -> None:
        """A producer's messages up to number `last` are taken: remember it (journaled
        with them when they are persistent; a temporary queue's dies with it anyway)."""
        address = self._existing_address(session, destination, kind, name)
        if address is None:
            return
        evicted = self._producers_of(address).took(stamp.producer, stamp.epoch, last, now,
                                                   self.settings.max_producers)
        if address.kind == TEMP:
            return
        if persistent or kind == STREAM:
            self.records.append((rec.PRODUCER, address.name, stamp.producer, stamp.epoch, last,
                                 now))
        if evicted is not None:
            self.records.append((rec.PRODUCER_FORGET, address.name, evicted))
            self.stats["producers_evicted"] += 1
            if self.stats["producers_evicted"] == 1:
                self.events.append(BrokerEvent(
                    "producers-evicted", address,
                    f"more than max_producers ({self.settings.max_producers}) producers "
                    f"sent to {address.name}: the least recently active one ({evicted!r}) "
                    "is forgotten before producer_expiry_ms; a resend of its messages "
                    "would be taken as new"))

    @staticmethod
    def _producers_of(address: Address) -> Producers:
        producers = address.producers
        if producers is None:
            producers = address.producers = Producers()
        return producers

    def _restore_producers(self, replayed: dict[str, dict[str, tuple[int, int, int]]]) -> None:
        for destination, states in replayed.items():
            producers = self._producers_of(self._dup_address(destination))
            for producer, (epoch, seq, seen) in states.items():
                producers.restore(producer, epoch, seq, seen)
            producers.order_by_time()  # least recently active first, as before the restart

    def expire_producers(self, now: int) -> int:
        """Forget producers that took nothing for `producer_expiry_ms`; returns how many."""
        idle = self.settings.producer_expiry_ms
        count = 0
        for address in self.addresses.values():
            producers = address.producers
            if producers is None:
                continue
            for producer in producers.expire(now, idle):
                self.records.append((rec.PRODUCER_FORGET, address.name, producer))
                count += 1
        return count

    def _enqueue(self, q: Queue, entry: Entry, now: int) -> None:
        size = entry.message.size
        q.address.size += size
        capacity = self.capacity
        capacity.memory += size + INDEX_BYTES
        if capacity.memory > capacity.trip_at:
            self._server_changed(capacity.check_memory())
        q.push(entry)
        if q.consumers:
            self._dispatch(q, now)
        if self.queue_args:  # drop-head past x-max-length (core/broker/configured.py)
            self._bound(q, now)

    def _resumed(self, address: Address, detail: str) -> None:
        address.state = AddressState.OPEN
        if address.period_dropped:
            detail += f"; {address.period_dropped} messages were dropped while it was full"
        self.events.append(BrokerEvent("address-resumed", address, detail))

    # ----------------------------------------------------------------- server-wide guards

    def set_paged_bytes(self, paged_bytes: int) -> None:
        """Input from the store: message bodies it keeps on disk only."""
        capacity = self.capacity
        capacity.set_paged(paged_bytes)
        self._server_changed(capacity.check_memory())

    def add_frame_bytes(self, delta: int) -> None:
        """Input from the server: the bytes of unfinished frames its connections hold
        changed by `delta`; they count in global_max_size_bytes (issue 20)."""
        capacity = self.capacity
        capacity.memory += delta
        self._server_changed(capacity.check_memory())

    def set_disk_usage(self, percent: float) -> None:
        """Input from the server: the data directory's file system, percent used."""
        self._server_changed(self.capacity.check_disk(percent))

    def _server_changed(self, change: tuple[bool, str] | None) -> None:
        if change is not None:
            entered, sentence = change
            self.events.append(BrokerEvent("server-full" if entered else "server-resumed",
                                           None, sentence))


def _stamp_in_transaction() -> CoreError:
    return CoreError("a SEND inside a transaction carries no producer stamp (pairmq-producer): "
                     "the transaction is taken whole at its COMMIT; name its messages with "
                     "dup-id instead")


def _check_message_headers(headers: dict[str, str]) -> None:
    priority = headers.get("priority")
    if priority is not None and priority not in _PRIORITIES:
        raise CoreError(f"priority must be an integer from 0 to 9, got {priority[:40]!r}")
    expires = headers.get("expires")
    if expires is not None and expires != "" and not (
            expires.isascii() and expires.isdigit() and len(expires) <= 19):
        raise CoreError(f"expires must be a time in ms since the epoch, got {expires[:40]!r}")
