"""What the parts of the failover client's engine share: its state, the one way the link
changes, the ids it numbers frames with, and the steps each part asks of another.

`Engine` (client/engine.py) is written in four parts, one file each: what the driver and
the server tell it, and what it writes (engine.py), what the application asks
(application_calls.py), what a failover does to what was in flight (recovery.py), and the
client's transaction (transacting.py). Each part extends this class, so every member a
part reads is declared here, with its type; a step one part asks of another is declared
below with its signature, and defined by the part that owns it
(tests/client/test_engine_parts.py checks that the Engine defines each).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, deque

from pairmq.client.errors import ClientClosed, ClientError
from pairmq.client.link import LINK, Link
from pairmq.client.options import Address, ClientOptions
from pairmq.client.results import FailoverEvent, Op, SendResult
from pairmq.client.sequences import Sequences, new_producer_id
from pairmq.client.subscriptions import AckKey, AckOp, SubscriptionState
from pairmq.client.topology import Attempts, Servers
from pairmq.client.transactions import Transaction
from pairmq.protocol import ClientSession, Frame


class EngineState:
    """One failover client's state; not thread-safe (the drivers serialise calls)."""

    def __init__(self, options: ClientOptions, now: float, name: str | None = None) -> None:
        self.options = options
        self.name = name or uuid.uuid4().hex[:12]
        self.sequences = Sequences(new_producer_id(self.name))  # client/sequences.py
        self.restamped: list[tuple[int, dict[str, str]]] = []  # outbox rows renumbered
        self.link = Link.CONNECTING
        self.servers = Servers(options.servers)
        rounds = -1 if options.outbox else options.initial_connect_attempts
        self.attempts: Attempts | None = Attempts(self.servers, options, rounds, now)
        self.error: ClientError | None = None  # why the client FAILED
        # the current socket
        self.session: ClientSession | None = None
        self.address: Address | None = None
        self.socket_id = 0
        self._connect_deadline = 0.0
        self._out: list[bytes] = []
        self._handed = 0  # frames of this socket the driver has taken to write
        # the current session (a resume keeps it, a fresh one replaces it)
        self.generation = 0  # 0 until the first CONNECTED
        self._resume: dict[str, str] | None = None  # token and key, when the server grants
        self._last_ack = 0  # highest ack id received on this session
        # what the server owes
        self._seq = 0
        self.unconfirmed: dict[str, SendResult] = {}  # persistent, outside transactions
        self._awaiting: dict[str, tuple[int, Op]] = {}  # receipt -> (frame index, op)
        self._log: deque[tuple[int, Frame, Op | None]] = deque()  # may be written again
        self._pending: deque[tuple[Frame, Op | None, bool]] = deque()  # waiting for UP
        self._resend: list[SendResult] = []  # after recovery, before the pending frames
        self._acks: deque[AckOp] = deque()  # ACKs written on this session, unconfirmed
        self._ack_receipt: str | None = None  # the one ACK receipt asked for, if any
        self.in_doubt: OrderedDict[AckKey, None] = OrderedDict()
        self.subscriptions: dict[str, SubscriptionState] = {}
        self._recovering: dict[str, SubscriptionState] = {}  # resubscribe receipt -> subscription
        self._granted: dict[str, str] | None = None  # resume token and key, until UP
        self.tx: Transaction | None = None
        self.forwarded: list[int] = []  # outbox rows confirmed since the driver last looked
        # failover bookkeeping
        self._failed_at: float | None = None
        self._failed_server: str | None = None
        self._failure: str = ""
        self._rolled_back: tuple[str, ...] = ()
        self.events: list[FailoverEvent] = []
        self.stats = {"failovers": 0, "resumed": 0, "resent": 0, "in_doubt_acked": 0,
                      "rolled_back": 0}

    # ------------------------------------------------------------ queries

    @property
    def server(self) -> str | None:
        """HOST:PORT of the server the client is connected to (or last was)."""
        address = self.servers.current
        return f"{address[0]}:{address[1]}" if address else None

    def closed_error(self) -> ClientError:
        """What a call on a closed (or given up) client raises."""
        if self.link is Link.FAILED and self.error is not None:
            return ClientClosed(f"the client gave up: {self.error}")
        return ClientClosed("the client is closed")

    # ------------------------------------------------------------ the link, ids

    def _move(self, event: str) -> None:
        """The one way the link changes: a transition client/link.py's table allows."""
        next_link = LINK.get((self.link, event))
        if next_link is None:
            raise ClientError(f"internal: {event} while the link is {self.link}")
        self.link = next_link

    def _next_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}{self._seq}"

    # ------------------------------------------------------------ steps of other parts

    def _emit(self, frame: Frame, op: Op | None, log: bool, now: float) -> None:
        """Write a frame now, or queue it until the link is UP (engine.py)."""
        raise NotImplementedError

    def _write(self, frame: Frame, op: Op | None, log: bool, now: float) -> None:
        """Write a frame on the current session, awaiting its receipt (engine.py)."""
        raise NotImplementedError

    def _write_pending(self, now: float) -> None:
        """Write the frames queued while the link was not UP (engine.py)."""
        raise NotImplementedError

    def _done(self, receipt: str, op: Op, now: float) -> None:
        """What a RECEIPT (or a resumed session) confirms (engine.py)."""
        raise NotImplementedError

    def _ack_frame(self, keys: list[AckKey], ack_id: str, tx: Transaction | None,
                   command: str, now: float) -> Op:
        """An ACK or NACK (application_calls.py)."""
        raise NotImplementedError

    def _finish_all(self, error: ClientError) -> None:
        """Closed or given up: every operation still open ends (recovery.py)."""
        raise NotImplementedError
