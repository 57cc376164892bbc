"""What one role of the server serves with: its broker, its store, its confirmation pipeline.

A role is made anew at every role change (start, activation, stepping down), with a
generation number one higher than the last. A client connection belongs to the role it
was accepted in and talks to it only through the methods of `Role` below. When the role
retires, its connections are closed with an ERROR naming the active server: no connection
ever outlives the broker and store it was using, so nothing it sends can be applied to a
broker that will never journal it, and no RECEIPT can be released by another role's disk.

RECEIPTs wait for a `Ticket`: the sequence number of the journal record that holds the
frame's own changes. The changes of one socket read (or timer) are journaled as one
record when the role flushes, and only then does the ticket learn its number; a number
other connections' records could reach is never used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Final, Protocol, TypeVar

from pairmq.core import Broker, BrokerEvent, CoreError, Message
from pairmq.core.cluster import is_bridge
from pairmq.core.commit_ledger import CommitRun, CommitStep
from pairmq.core.queue import Address
from pairmq.core.stream_log import Outgoing
from pairmq.protocol import Frame
from pairmq.server.clock import now_ms
from pairmq.server.guards.turn_budget import ReadBudget
from pairmq.server.pair.policy import PairPolicy
from pairmq.server.role.commit_slices import CommitDriver, DriverState
from pairmq.server.role.confirmations import Ticket, Waiting
from pairmq.server.role.leaving import Gate, Leaving
from pairmq.server.role.parking import Parking
from pairmq.store.store import Store

# Paged messages and stream records are read back from the journal for at most this long
# in a turn of the event loop, over every flush of the turn, by the last reads' cost per
# record (server/guards/turn_budget.py ReadBudget): a paged message is decoded into a Message, about
# 10 us (4,096 held turns of 40-70 ms in a drain); a stream record is also encoded and sent
# in the same turn, 15-25 us (a Spark read of 4,096 1 KiB records held the loop for
# 100-170 ms). The first read of a turn may take READS_FLOOR, a queue's window (1,024,
# core/broker/paging.py) or a stream reader's batch of 1,000, whatever they cost.
READS_TURN_S: Final = 0.03
READS_FLOOR: Final = 1024

log = logging.getLogger("pairmq.server")
T = TypeVar("T")


class RoleKind(StrEnum):
    SERVING = "serving"  # the journal is open for appends: clients are served
    STANDBY = "standby"  # recovered but not yet active, or mirroring the peer: clients refused


class RolePhase(StrEnum):
    CURRENT = "current"
    RETIRED = "retired"  # a newer role took over: its connections are closed


@dataclass(frozen=True)
class Refusal:
    """Why a role does not serve a client, and where the active server is (if known)."""

    message: str
    active: str | None
    active_tls: str | None = None  # its STOMP TLS listener, for clients on TLS

    @property
    def extra(self) -> dict[str, str] | None:
        return hint_headers(self.active, self.active_tls)


def hint_headers(active: str | None, active_tls: str | None) -> dict[str, str] | None:
    """`active-server` (and `active-server-tls`, for clients on TLS) of an ERROR."""
    headers = {}
    if active:
        headers["active-server"] = active
    if active_tls:
        headers["active-server-tls"] = active_tls
    return headers or None


class Client(Protocol):
    """What a role needs of a client connection."""

    conn_id: int
    client_id: str | None

    @property
    def closing(self) -> bool: ...

    @property
    def login(self) -> str | None: ...

    def fail(self, message: str, frame: Frame | None = None, detail: str = "",
             extra: dict[str, str] | None = None) -> None: ...

    def write_deliveries(self, deliveries: list[Outgoing]) -> None: ...

    def commit_finished(self, run: CommitRun, ticket: Ticket | None) -> None: ...

    def flush_out(self) -> None: ...

    def unblock(self, address: Address) -> None: ...

    def release_backlog(self) -> None: ...

    def throttle(self, paused: bool) -> None: ...

    def describe(self) -> dict[str, object]: ...


FrameMark = tuple[int, int]  # (records pending, duplicates seen) before a frame


class Role:
    def __init__(self, generation: int, kind: RoleKind, broker: Broker, store: Store,
                 policy: PairPolicy, own_address: str, own_tls: str | None = None,
                 cluster: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.generation = generation
        self._cluster = cluster  # what CONNECTED says of the cluster (server/cluster/node.py)
        self.kind = kind
        self.phase = RolePhase.CURRENT
        self.broker = broker
        self.store = store
        self._policy = policy
        self._own_address = own_address
        self._own_tls = own_tls  # the STOMP TLS listener's address, if there is one
        self.connections: dict[int, Client] = {}
        self.throttled = False  # reading from clients paused: replication is behind
        self.leaving: Leaving | None = None  # scaling down: what clients are told
        self._dirty: set[Client] = set()  # connections with output waiting
        self._address_waiters: dict[Address, set[Client]] = {}  # full address -> producers
        self._room_waiters: set[Client] = set()  # held while the journal is full
        self.confirmed_seq = 0  # receipts may go out for every record up to here
        self._confirm_waiters = Waiting()  # callbacks of the tickets not confirmed yet
        self._batch: Ticket | None = None  # the ticket of the record the next flush writes
        self._gate: Ticket | None = None  # the last delivery gate handed out (shared by seq)
        # sessions kept for clients whose connection broke (connection TTL)
        self.parking = Parking(broker, self.flush)
        self._reads = ReadBudget(READS_TURN_S, READS_FLOOR)  # reading back, per loop turn
        self.commit_driver = CommitDriver(self)  # COMMITs applied in slices (commit_slices.py)

    def __repr__(self) -> str:
        return f"<Role {self.generation} {self.kind} {self.phase}>"

    # ------------------------------------------------------------ lifecycle (the server)

    def open_for_serving(self, loop: asyncio.AbstractEventLoop) -> None:
        """Account the recovered state and open the journal for appends."""
        store = self.store
        if store.writer is None:
            store.start(self.broker, loop)
        writer = store.writer
        assert writer is not None
        writer.on_synced(lambda _seq: self._synced())
        writer.on_append(self._policy.on_append)
        writer.on_stall(self._stalled)
        store.on_full_change(self._store_full_changed)
        self.confirmed_seq = store.synced_seq
        if self.kind is RoleKind.SERVING:
            self.broker.settle_commits()  # COMMITs left by a crash or a takeover
            self.persist()  # the TX_DROP of each undecided one
            self.commit_driver.wake()

    def watch_mirror(self) -> None:
        """A standby mirroring the peer: tell the policy when the copy reaches the disk."""
        writer = self.store.writer
        assert writer is not None
        writer.on_synced(self._mirror_synced)
        writer.on_stall(self._stalled)

    def _mirror_synced(self, seq: int) -> None:
        # The writer outlives this role (the next one serves from the same journal): only
        # the current standby role acknowledges the copy.
        if self.kind is RoleKind.STANDBY and self.phase is RolePhase.CURRENT:
            self._policy.mirror_synced(seq)

    def _stalled(self, waited: float | None) -> None:
        # As `_mirror_synced`: a writer outlives the role, only the current one reports.
        if self.phase is RolePhase.CURRENT:
            self._policy.journal_stalled(waited)

    def retire(self, message: str, active: str | None) -> None:
        """A newer role took over: close every connection of this one (naming the active
        server) and forget every receipt still waiting. The store is the server's to close."""
        if self.phase is RolePhase.RETIRED:
            return
        self.phase = RolePhase.RETIRED
        self.close_clients(message, active)
        self.parking.close_all()
        self._confirm_waiters.clear()
        self._batch = None

    def throttle(self, paused: bool) -> None:
        """Clients' frames are not read while the backup is too far behind
        (server/pair/replication.py); a connection that holds frames for its own reason
        stays paused."""
        self.throttled = paused
        for conn in self.connections.values():
            conn.throttle(paused)

    def leave(self, leaving: Leaving | None) -> None:
        """Scaling down: refuse producers from now on; with a member to go to, send every
        client there (the other members' bridges stay). None: a scale-down that failed,
        serving as before."""
        self.leaving = leaving
        if leaving is None or leaving.gate is not Gate.REDIRECTING:
            return
        for conn in list(self.connections.values()):
            if leaving.refuses_connect(conn.client_id):
                conn.fail(leaving.message, extra=leaving.extra)
        self._write_dirty()

    def committing(self) -> bool:
        """A COMMIT is being applied in slices (commit_slices.py)."""
        return self.commit_driver.state is not DriverState.IDLE

    def clients(self) -> int:
        """Client connections, the other members' bridges left out."""
        return sum(1 for conn in self.connections.values() if not is_bridge(conn.client_id))

    def close_clients(self, message: str, active: str | None) -> None:
        extra = hint_headers(active, self._policy.active_address(True) if active else None)
        for conn in list(self.connections.values()):
            conn.fail(message, extra=extra)
        self._write_dirty()

    # ------------------------------------------------------------ the connection interface

    def refusal(self) -> Refusal | None:
        """None when this role serves clients now; otherwise why not, and where to go."""
        if self.phase is RolePhase.RETIRED:
            return Refusal(f"this server changed role (role {self.generation} ended): reconnect",
                           self._policy.active_address(), self._policy.active_address(True))
        state = self._policy.state
        policy = self._policy
        if (peer := policy.handing_over_to()) is not None:
            return Refusal(f"this server is handing over to {peer}: connect to it", peer,
                           policy.handing_over_to(True))
        if self.kind is RoleKind.SERVING and state.serving:
            return None
        if state.serving:  # the pair says serve, this role has not opened its journal yet
            return Refusal("this server is starting: try again", None)
        active = self._policy.active_address()
        where = f": connect to the active server at {active}" if active else \
            ": no server of the pair is active right now"
        return Refusal(f"this server is {state.value}{where}", active,
                       self._policy.active_address(True))

    def topology(self) -> str | None:
        return self._policy.topology(self._own_address)

    def cluster_headers(self) -> Mapping[str, str]:
        """CONNECTED's cluster-name, cluster-member and cluster-members (none outside one)."""
        return self._cluster() if self._cluster is not None else {}

    def topology_tls(self) -> str | None:
        """The pair's STOMP TLS listeners, this server's first (for clients on TLS)."""
        return self._policy.topology(self._own_tls, True) if self._own_tls else None

    def attach(self, conn: Client) -> None:
        self.connections[conn.conn_id] = conn

    def detach(self, conn: Client) -> None:
        self.connections.pop(conn.conn_id, None)
        self._dirty.discard(conn)
        for waiting in self._address_waiters.values():
            waiting.discard(conn)
        self._room_waiters.discard(conn)

    def mark_dirty(self, conn: Client) -> None:
        self._dirty.add(conn)

    def frame_mark(self) -> FrameMark:
        broker = self.broker
        return len(broker.records), broker.stats["duplicates"]

    def ticket_since(self, mark: FrameMark) -> Ticket | None:
        """What a frame's RECEIPT waits for: the record holding what it changed, or, for a
        duplicate, one at or after the original's; None when it wrote nothing."""
        broker = self.broker
        if len(broker.records) > mark[0]:
            return self._batch_ticket()
        if broker.stats["duplicates"] != mark[1]:
            # The original is in the journal already, or among the records not yet written.
            return self._batch_ticket() if broker.records else Ticket(self.store.appended_seq)
        return None

    def _batch_ticket(self) -> Ticket:
        if self._batch is None:
            self._batch = Ticket()
        return self._batch

    def confirmed(self, ticket: Ticket) -> bool:
        return ticket.seq is not None and ticket.seq <= self.confirmed_seq

    def delivery_gate(self, message: Message) -> Ticket | None:
        """What a MESSAGE frame of this persistent message waits for: the journal record
        that added it, while that is not confirmed (None: nothing, it may go out now). So a
        consumer never sees a message the next active server could lack, which its producer,
        never receipted, would send there again."""
        seq = message.journal_seq
        if seq == 0:
            # Never journaled yet: its ADD may be among the records the next flush writes
            # (a delivery written before a RECEIPT); otherwise it is recovered or not
            # journaled at all (a non-durable topic subscription), and nothing is to wait for.
            if message.journal_queues is None and self.broker.records:
                return self._batch_ticket()
            return None
        if seq <= self.confirmed_seq:
            return None
        gate = self._gate
        if gate is None or gate.seq != seq:
            gate = self._gate = Ticket(seq)
        return gate

    def batch_gate(self, messages: list[Message]) -> Ticket | None:
        """What a batched stream MESSAGE waits for: the newest of its records' gates, so
        it goes out once every record in it is confirmed."""
        newest: Ticket | None = None
        for message in messages:
            ticket = self.delivery_gate(message)
            if ticket is None or ticket is newest:
                continue
            if newest is None or ticket.seq is None or (
                    newest.seq is not None and ticket.seq > newest.seq):
                newest = ticket
        return newest

    async def change_accounts(self, change: Callable[[Broker], None], timeout: float) -> None:
        """A run-time change of users (core/accounts.py), journaled, once its record is
        confirmed: on disk and, in a pair, on the backup. Only a serving role writes."""
        await self.operate(change, timeout)

    async def operate(self, change: Callable[[Broker], T], timeout: float) -> T:
        """An operator's change of the broker (users, a purge, a move), answered once its
        records are confirmed, as a client's RECEIPT would be. Only a serving role writes;
        CoreError from the change is raised with nothing changed."""
        mark = self.frame_mark()
        result = change(self.broker)
        ticket = self.ticket_since(mark)
        self.flush()
        if ticket is not None:
            done = asyncio.get_running_loop().create_future()
            self.when_confirmed(ticket, partial(_resolve, done))
            await asyncio.wait_for(done, timeout)
        return result

    def logged_in(self, login: str) -> list[Client]:
        """The connections of one user (a removed user's are closed)."""
        return [c for c in self.connections.values() if c.login == login]

    def when_confirmed(self, ticket: Ticket, callback: Callable[[], None]) -> None:
        if self.confirmed(ticket):
            callback()
        else:
            self._confirm_waiters.add(ticket, callback)

    def journal_full_reason(self) -> str | None:
        """Why new persistent messages cannot be journaled now (None: they can)."""
        store = self.store
        return store.full_reason() if store.full else None

    @property
    def full_policy(self) -> str:
        return self.store.settings.full_policy

    def wait_for_room(self, conn: Client) -> None:
        self._room_waiters.add(conn)

    def wait_for_address(self, conn: Client, address: Address) -> None:
        self._address_waiters.setdefault(address, set()).add(conn)

    def read_body(self, message: Message) -> bytes:
        return self.store.read_body(message)

    def browse(self, destination: str, limit: int) -> list[Message]:
        """The first `limit` messages waiting in a queue, left there (core/browsing.py): a
        paging queue's next ones are read back from the journal, not handed to it."""
        seen = self.broker.browse(destination, limit)
        if seen.log is None or not seen.numbers or self.store.writer is None:
            return seen.messages
        try:
            return seen.messages + self.store.read_stream(seen.log, seen.numbers)
        except OSError as e:
            raise CoreError(f"cannot read the paged messages of {destination} back from the "
                            f"journal: {e}") from None

    def read_bodies(self, messages: list[Message]) -> list[bytes | memoryview]:
        return self.store.read_bodies(messages)

    # ------------------------------------------------------------ journal and confirmations

    def persist(self) -> None:
        """Journal what the broker changed since the last call (one atomic group) and give
        the waiting ticket its sequence number."""
        broker = self.broker
        if not broker.records:
            return
        store = self.store
        if self.phase is RolePhase.RETIRED:
            return  # a closing connection's leftovers: this broker is gone with its role
        if self.kind is not RoleKind.SERVING or store.writer is None or store.mirror:
            # Never silently: whoever relied on these changes is told, none is confirmed.
            log.error("Internal error: %d journal records in role %d (%s, %s), which cannot "
                      "journal them: closing its connections", len(broker.records),
                      self.generation, self.kind, self.phase)
            broker.take_records()
            self._batch = None
            self.close_clients("internal server error: this server cannot store anything now "
                               "(logged on the server)", self._policy.active_address())
            return
        seq = store.persist(broker.take_records())
        if self._batch is not None:
            self._batch.seq = seq
            self._batch = None

    def _synced(self) -> None:
        self.update_confirmed()
        self.flush()

    def update_confirmed(self) -> None:
        """Receipts wait for the local disk and whatever else the pair requires."""
        if self.kind is not RoleKind.SERVING or self.phase is RolePhase.RETIRED:
            return
        new = self._policy.confirmable(self.store.synced_seq, self.confirmed_seq)
        if new <= self.confirmed_seq:
            return
        self.confirmed_seq = new
        self._confirm_waiters.release(new)
        self.flush()

    async def synced(self, seq: int) -> None:
        """Wait until this role's journal has everything up to seq on disk."""
        store = self.store
        if store.writer is None or seq <= store.synced_seq:
            return
        done = asyncio.get_running_loop().create_future()
        store.when_synced(seq, partial(_resolve, done))
        await done

    # ------------------------------------------------------------ output

    def flush(self) -> None:
        """Turn the broker's records, deliveries and events into journal appends and socket
        writes, once per read. A retired role only writes what its closing connections
        still hold: its broker may be a newer role's (handed over at activation)."""
        if self.phase is RolePhase.RETIRED:
            self._write_dirty()
            return
        broker = self.broker
        if broker.records:
            self.persist()
        read_back = 0
        if broker.page_wanted or broker.moved_logs or broker.stream_reads:
            started = time.perf_counter()
            read_back = self._serve_pages(started)
        if broker.outbox:
            for conn_id, deliveries in broker.take_outbox().items():
                conn = self.connections.get(conn_id)
                if conn is not None and not conn.closing:
                    conn.write_deliveries(deliveries)
        if read_back:  # what reading them back, and sending them, cost
            self._reads.took(read_back, time.perf_counter() - started)
        if broker.events:
            for event in broker.take_events():
                self._on_event(event)
        self._write_dirty()
        if broker.commits.runs:
            self.commit_driver.wake()

    # ------------------------------------------------------------ COMMITs in slices

    def commits_to_drive(self) -> bool:
        store = self.store
        return bool(self.broker.commits.runs) and self.kind is RoleKind.SERVING \
            and self.phase is not RolePhase.RETIRED and store.writer is not None \
            and not store.mirror

    def step_commit_slice(self, stage: int, route: int) -> tuple[CommitStep, Ticket | None]:
        """One slice of the COMMITs under way (core/broker/committing.py), journaled as its own
        record; returns what it did and the ticket of that record."""
        mark = self.frame_mark()
        step = self.broker.step_commits(now_ms(), self.journal_full_reason(), route, stage)
        ticket = self.ticket_since(mark)
        self.flush()
        return step, ticket

    def commit_finished(self, run: CommitRun, ticket: Ticket | None) -> None:
        conn = self.connections.get(run.conn_id) if run.conn_id is not None else None
        if conn is not None:
            conn.commit_finished(run, ticket)

    def _serve_pages(self, now: float) -> int:
        """Read back the windows paging queues asked for (core/broker/paging.py) and the records
        stream readers reached (core/broker/streams.py), as many as this turn of the loop's read
        budget allows, whichever flush reads them (the rest at the next turn), and release
        the journal entries every reader has passed. Returns how many were read back."""
        broker, store = self.broker, self.store
        read_back = 0
        if self.kind is RoleKind.SERVING and store.writer is not None and not store.mirror:
            reads = self._reads
            budget = reads.room(now)
            fresh = reads.fresh  # the turn's first read: it may be cut to the budget
            wanted = broker.take_page_wanted()
            paged_at = now_ms()  # the broker's time (ms); `now` is the loop's (s)
            for i, (q, paged, numbers) in enumerate(wanted):
                if budget <= 0:  # asked again at the next turn
                    for later, *_ in wanted[i:]:
                        broker.page_wanted[later] = None
                    asyncio.get_running_loop().call_soon(self.flush)
                    break
                numbers = numbers[:budget]
                budget -= len(numbers)
                read_back += len(numbers)
                try:
                    messages = store.page_in(paged, numbers, q.key or "")
                except OSError as e:
                    log.error("Cannot read paged messages of %s back from the journal: %s",
                              q.name, e)
                    continue
                broker.paged_in(q, numbers, messages, paged_at)
            # a reader's run is cut short only by a turn that has read nothing else
            for cursor, offsets in broker.take_stream_reads(budget, cut=fresh):
                read_back += len(offsets)
                try:
                    records = store.read_stream(cursor.stream.log, offsets)
                except OSError as e:
                    log.error("Cannot read records of %s back from the journal: %s",
                              cursor.destination, e)
                    continue
                broker.stream_read(cursor, offsets, records)
            if broker.stream_reads:  # readers that read on (no ACK will come to wake them)
                asyncio.get_running_loop().call_soon(self.flush)
        for paged in broker.take_moved_logs():
            store.release_paged(paged)
        return read_back

    def _write_dirty(self) -> None:
        if self._dirty:
            for conn in self._dirty:
                conn.flush_out()
            self._dirty.clear()

    def disk_usage(self, percent: float) -> None:
        """A sample of the data directory's disk usage, for the max_disk_usage guard."""
        if self.kind is RoleKind.SERVING and self.phase is RolePhase.CURRENT:
            self.broker.set_disk_usage(percent)
            self.flush()

    def sweep(self, now: int) -> None:
        """Expire what is due (timer)."""
        if self.kind is RoleKind.SERVING and self.phase is RolePhase.CURRENT:
            self.broker.sweep_expired(now)
            self.flush()

    def _on_event(self, event: BrokerEvent) -> None:
        address = event.address
        kind = event.kind
        if kind == "address-full" and address is not None:
            policy = address.policy.value
            what = {"page": "new persistent messages keep their bodies on disk only",
                    "block": "blocking its producers", "fail": "refusing new messages with "
                    "an ERROR", "drop": "dropping new messages"}[policy]
            log.warning("Destination %s is full (%s): %s until consumers catch up "
                        "(address_full_policy %s)", address.name, event.detail, what, policy)
        elif kind == "address-resumed" and address is not None:
            log.info("Destination %s is below its limit again (%s): address_full_policy %s "
                     "no longer applies", address.name, event.detail, address.policy.value)
            for conn in self._address_waiters.pop(address, set()):
                conn.unblock(address)
        elif kind == "server-full":
            log.warning("Server is full: %s (full_policy %s)", event.detail, self.full_policy)
        elif kind == "server-resumed":
            log.info("Server has room again: %s", event.detail)
            self._release_room_waiters()
        elif kind == "dead-lettered":
            log.debug("Dead-lettered %s into %s", event.detail,
                      address.name if address else "?")
        elif kind == "expired":
            log.debug("Dropped expired message %s", event.detail)
        elif kind == "producers-evicted":
            log.warning("Producer sequences: %s", event.detail)
        elif kind == "destinations-deleted":
            log.info("Deleted empty, unused destinations (auto_delete_queues): %s",
                     event.detail)

    def _store_full_changed(self, full: bool) -> None:
        if full:
            action = ("held" if self.full_policy == "block" else "refused with an ERROR")
            log.warning("%s: new persistent messages are %s until there is room",
                        self.store.full_reason().capitalize(), action)
            return
        if self._room_waiters:
            log.info("Journal has room again: %d held connections resume",
                     len(self._room_waiters))
        self._release_room_waiters()

    def _release_room_waiters(self) -> None:
        """Held for room on the server: each decides its frame again (another shortage may
        hold it anew)."""
        waiting, self._room_waiters = self._room_waiters, set()
        for conn in waiting:
            if not conn.closing:
                conn.release_backlog()


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
