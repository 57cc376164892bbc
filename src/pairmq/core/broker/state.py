"""What the parts of the Broker share: its state, two queries on it, and the steps each
part asks of another.

`Broker` (broker.py) is written in parts, one per file of this package, stacked in one
line over this class (core/broker/__init__.py), so every member a part reads is declared
here once, with its type, and a step one part asks of another is declared below with its
signature and the file of the part that defines it. Those declarations raise
NotImplementedError: they sit at the end of the Broker's MRO, behind every part, so the
part's own method is always the one found (tests/core/test_broker_state.py checks that
each is defined by exactly one part).
"""

from __future__ import annotations

from pairmq.core.accounts import Accounts
from pairmq.core.admission import Admission, Cause, Outcome
from pairmq.core.broker.events import BrokerEvent
from pairmq.core.capacity import Capacity
from pairmq.core.commit_ledger import CommitLedger
from pairmq.core.errors import CoreError
from pairmq.core.message import Entry, Message
from pairmq.core.paged_log import PagedLog
from pairmq.core.producers import Producers
from pairmq.core.queue import Address, Queue
from pairmq.core.queue_args import QueueArgs
from pairmq.core.records import Record
from pairmq.core.session import PendingSend, Session, Transaction
from pairmq.core.settings import CoreSettings
from pairmq.core.stream_log import Outgoing, StreamCursor, StreamLog


class BrokerState:
    def __init__(self, settings: CoreSettings | None = None, id_prefix: str = "ID:pairmq-"
                 ) -> None:
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
        self.records: list[Record] = []  # durable state changes for the journal (core.records)
        self.stats = {"received": 0, "delivered": 0, "acknowledged": 0, "expired": 0,
                      "dead_lettered": 0, "unroutable_topic": 0, "duplicates": 0,
                      "dropped": 0, "producers_evicted": 0, "paged": 0, "paged_in": 0}
        self.page_wanted: dict[Queue, None] = {}  # asking for their next window (paging.py)
        self.moved_logs: dict[PagedLog, None] = {}  # whose readers moved: the store may release
        # stream cursors whose next records are only on disk, for a read back (streams.py)
        self.stream_reads: dict[StreamCursor, None] = {}
        self.capacity = Capacity(self.settings)
        self._message_seq = 0
        self._order_seq = 0
        self._session_seq = 0
        self._index: dict[str, dict[str, Entry]] | None = None  # while following (follow.py)
        self._unsorted: set[Queue] = set()
        self._idle_since: dict[str, int] = {}  # destination -> when a look first found it idle
        self._idle_round: list[str] = []  # destinations this round has still to look at (idle.py)
        self._sweep_round: list[Queue] = []  # queues sweep_expired has still to look at
        self.commits = CommitLedger()  # COMMITs applied in slices (committing.py)

    # ------------------------------------------------------------ queries

    @property
    def following(self) -> bool:
        """A backup's broker, applying the active's journal (follow.py)."""
        return self._index is not None

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

    # ------------------------------------------------------------ steps of other parts

    def _dispatch(self, q: Queue, now: int) -> None:
        """Hand waiting messages to consumers with room, round-robin (broker.py)."""
        raise NotImplementedError

    def _consumed(self, q: Queue, entry: Entry) -> None:
        """The entry leaves the broker: release its bytes (broker.py)."""
        raise NotImplementedError

    def _return(self, q: Queue, entries: list[Entry], now: int) -> None:
        """Delivered, not acknowledged: back to the head, or dead-lettered (broker.py)."""
        raise NotImplementedError

    def _dead_letter(self, q: Queue, entry: Entry, reason: str, now: int) -> None:
        """The entry leaves `q` for its dead-letter queue (broker.py)."""
        raise NotImplementedError

    def _may_create(self, destination: str, kind: str) -> None:
        """A client's frame may make this destination: max_destinations (broker.py)."""
        raise NotImplementedError

    def _address(self, name: str, kind: str) -> Address:
        """The address of this name, made if new (broker.py)."""
        raise NotImplementedError

    def _plain_queue(self, destination: str, args: QueueArgs | None = None) -> Queue:
        """The /queue/ destination's queue, made if new (broker.py)."""
        raise NotImplementedError

    def _temp_queue(self, session: Session, name: str) -> Queue:
        """The session's temporary queue of this name, made if new (broker.py)."""
        raise NotImplementedError

    def _delete_queue(self, q: Queue) -> None:
        """The queue goes, with what waits in it (broker.py)."""
        raise NotImplementedError

    def _reply_temp_queue(self, session: Session, name: str, now: int) -> None:
        """A reply-to's temporary queue, its sender subscribed (subscribing.py)."""
        raise NotImplementedError

    def _admission(self, session: Session | None, destination: str, kind: str, name: str,
                   headers: dict[str, str], journal_full: str | None
                   ) -> tuple[Admission, Cause, Address | None]:
        """What decide() says of this message now; changes nothing (intake.py)."""
        raise NotImplementedError

    def _route(self, session: Session | None, destination: str, kind: str, name: str,
               headers: dict[str, str], body: bytes, now: int, journal_full: str | None = None,
               admitted: bool = False) -> Outcome:
        """Decide, then route one message (intake.py)."""
        raise NotImplementedError

    def _enqueue(self, q: Queue, entry: Entry, now: int) -> None:
        """The entry waits in `q`, counted, offered to its consumers (intake.py)."""
        raise NotImplementedError

    def _check_full(self, address: Address) -> None:
        """Past its limit: FULL, once (intake.py)."""
        raise NotImplementedError

    def _remember_dup(self, address: Address, dup_id: str) -> None:
        """The address's cache of dup-ids takes this one, journaled (intake.py)."""
        raise NotImplementedError

    @staticmethod
    def _producers_of(address: Address) -> Producers:
        """The address's producer sequences, made if new (intake.py)."""
        raise NotImplementedError

    def _unstage(self, tx: Transaction) -> None:
        """The transaction's sends no longer count in memory (intake.py)."""
        raise NotImplementedError

    def _server_changed(self, change: tuple[bool, str] | None) -> None:
        """A server-wide guard tripped or cleared: an event (intake.py)."""
        raise NotImplementedError

    def _refused(self, session: Session, sends: list[PendingSend], transaction: str,
                 journal_full: str | None) -> Outcome | None:
        """Why a COMMIT's sends are held or refused now, as a whole (acking.py)."""
        raise NotImplementedError

    def _settle_transaction(self, tx: Transaction, now: int) -> None:
        """A COMMIT's acked and nacked deliveries settled (acking.py)."""
        raise NotImplementedError

    @staticmethod
    def _forget_legacy(session: Session, sub_id: str, message_id: str, ack_id: str) -> None:
        """A delivery leaves the STOMP 1.0/1.1 message-id index (acking.py)."""
        raise NotImplementedError

    def _begin_run(self, conn_id: int, transaction: str, tx: Transaction, now: int
                   ) -> Outcome:
        """A COMMIT too large for one turn becomes a run (committing.py)."""
        raise NotImplementedError

    def _configured(self, q: Queue, args: QueueArgs | None) -> Record:
        """Give a new plain queue its settings; its DEST record (configured.py)."""
        raise NotImplementedError

    def _queue_expires(self, destination: str, expires: int, now: int) -> int:
        """A message's expiry in this queue, with its x-message-ttl (configured.py)."""
        raise NotImplementedError

    def _bound(self, q: Queue, now: int) -> None:
        """drop-head: the oldest messages go while `q` is past a limit (configured.py)."""
        raise NotImplementedError

    def _dup_address(self, destination: str) -> Address:
        """The address a journaled dup-id or producer names, made if new (follow.py)."""
        raise NotImplementedError

    def _delete_destination(self, address: Address) -> None:
        """An empty, unused destination goes (idle.py)."""
        raise NotImplementedError

    def _to_log(self, address: Address, targets: list[Queue], message: Message) -> None:
        """The message lives in the address's paged log only (paging.py)."""
        raise NotImplementedError

    @staticmethod
    def _pages_to_log(address: Address) -> bool:
        """New messages of the address go to its paged log (paging.py)."""
        raise NotImplementedError

    @staticmethod
    def paged_waiting(q: Queue) -> int:
        """`q`'s messages in its address's paged log, not paged in yet (paging.py)."""
        raise NotImplementedError

    def _leave_log(self, q: Queue) -> None:
        """A durable queue goes: it reads the paged log no more (paging.py)."""
        raise NotImplementedError

    def _stream(self, destination: str) -> StreamLog:
        """The stream's log, made if new (streams.py)."""
        raise NotImplementedError

    def _stream_route(self, destination: str, stored: dict[str, str], body: bytes,
                      now: int) -> Outcome:
        """A SEND to a stream: a group commit, or an append (streams.py)."""
        raise NotImplementedError

    def _stream_located(self, log: PagedLog) -> None:
        """Records of a stream are on disk now (streams.py)."""
        raise NotImplementedError

    def _stream_acked(self, session: Session, ack_id: str) -> bool:
        """An ACK or NACK of a stream delivery: credit back (streams.py)."""
        raise NotImplementedError

    def _stream_unsubscribe(self, session: Session, sub_id: str | None) -> bool:
        """An UNSUBSCRIBE of a stream subscription: its cursor closed (streams.py)."""
        raise NotImplementedError

    def _feed_streams(self, session: Session) -> None:
        """The session's stream subscriptions deliver what they may (streams.py)."""
        raise NotImplementedError

    def _resume_cursors(self, session: Session, last_ack: int) -> int:
        """Stream deliveries after `last_ack` are read again (streams.py)."""
        raise NotImplementedError

    def _follow_stream_add(self, key: str, message: Message) -> Message:
        """A backup: the stream's message, appended (streams.py)."""
        raise NotImplementedError

    def _follow_stream_remove(self, key: str, message_id: str, order: int = -1
                              ) -> Message | None:
        """A backup: retention removed the stream's head (streams.py)."""
        raise NotImplementedError

    def _settle_streams(self) -> list[Message]:
        """Following ends: the streams' records in place (streams.py)."""
        raise NotImplementedError
