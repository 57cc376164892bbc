"""What the parts of a client connection share: its state, set once, and the steps one
part asks of another.

`StompConnection` (connection.py) is written in parts, one file each: frames, output and
flow control (connection.py), CONNECT and the session's life (connect.py), subscriptions,
acknowledgements and transactions (commands.py), and frames applied over several turns
(sliced_frames.py). The parts are stacked in one line over this class (StompConnection,
Connecting, Commands, SlicedFrames, ConnectionState, asyncio.Protocol: single
inheritance, which mypyc compiles to a native class, as core/broker/__init__.py says of
the Broker's), so every member a part reads is declared here with its type, and a step
one part asks of another is declared below with its signature and defined by the part
that owns it (a test checks that every one is).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from enum import StrEnum

from pairmq.core import Broker
from pairmq.core.admission import Outcome
from pairmq.core.commit_ledger import CommitRun
from pairmq.core.permissions import SecurityRules
from pairmq.core.queue import Address
from pairmq.core.stream_log import Outgoing
from pairmq.protocol import Frame, FrameParser, HeartbeatClock
from pairmq.protocol.limits import MessageLimits
from pairmq.server.config import ServerConfig, User
from pairmq.server.guards import Guards
from pairmq.server.role.confirmations import Ticket
from pairmq.server.role.parking import SessionRequest
from pairmq.server.role.role import Role
from pairmq.server.stomp.held_output import HeldOutput
from pairmq.server.stomp.session import ServerSession
from pairmq.server.stomp.unfinished_frame import UnfinishedFrame


class Stall(StrEnum):
    """Why the broker must hand this connection nothing more for now."""

    SOCKET = "socket"  # the transport's buffer is above its high-water mark
    HELD = "held"  # too many bytes wait for their records to be confirmed


class ConnectionState(asyncio.Protocol):
    """A client connection's state; it belongs to the role it was accepted in, for life."""

    # Slots, not a __dict__: past 30 attributes an instance's dict no longer shares its
    # class's keys, and Python 3.11 then looks up every `self.method()` and most attributes
    # the slow way (a method call about a third longer; 37 attributes here, and every frame
    # makes dozens of such calls). The classes built on this one add no slots (`__slots__ = ()`).
    __slots__ = ("_committing", "_stalls", "_timers", "asked", "backlog", "blocked_on",
                 "broker", "checking", "client_id", "clock", "config", "conn_id",
                 "counted_as", "counts", "gated", "held", "last_ticket", "limits", "logins",
                 "loop", "opened", "out", "parser", "passwords", "peer", "protocol", "role",
                 "rules", "rules_version", "sends_allowed", "session", "sub_lines", "token",
                 "transport", "ttl_ms", "turn", "unfinished")

    def __init__(self, config: ServerConfig, role: Role, conn_id: int,
                 loop: asyncio.AbstractEventLoop, guards: Guards) -> None:
        self.config = config
        self.turn = guards.turn  # shared by every connection (server/guards/__init__.py)
        self.logins = guards.logins
        self.counts = guards.counts
        self.passwords = guards.passwords
        self.counted_as: str | None = None  # the host it is counted under, once let in
        # its login's password check, running
        self.checking: asyncio.Future[User | None] | None = None
        self.role = role
        self.broker: Broker = role.broker
        self.loop = loop
        self.conn_id = conn_id
        cfg = config
        # a smaller frame limit until the client has logged in (connect.py raises it)
        self.parser = FrameParser(max_frame_bytes=min(cfg.max_frame_bytes,
                                                      cfg.pre_login_frame_bytes),
                                  max_headers=cfg.max_headers,
                                  max_header_bytes=cfg.max_header_bytes)
        # what one message may hold, so that its MESSAGEs fit them too (protocol/limits.py)
        self.limits = MessageLimits(cfg.max_frame_bytes, cfg.max_headers, cfg.max_header_bytes)
        self.unfinished = UnfinishedFrame(cfg.frame_timeout_ms / 1000)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.protocol = "stomp"  # how its client reaches it: stomp, stomp+tls, stomp+ws(s)
        self.opened = time.time()  # for the operator's connection list
        self.session = ServerSession()  # phase, why frames wait, what may be applied
        self.last_ticket: Ticket | None = None  # the newest record this connection wrote
        self._committing: Frame | None = None  # a COMMIT applied a slice per turn
        self.held = HeldOutput()  # RECEIPTs and MESSAGEs waiting for their records
        self._stalls: set[Stall] = set()  # the broker delivers only while this is empty
        # Persistent messages go out once their record is confirmed ([server]
        # deliver_unconfirmed turns that off).
        self.gated = not config.deliver_unconfirmed
        self.backlog: deque[Frame] = deque()
        self.out: list[bytes] = []
        self.blocked_on: set[Address] = set()
        self.sub_lines: dict[str, bytes] = {}
        self.clock = HeartbeatClock(0, 0, 0.0)  # the negotiated heart-beats, once CONNECTED
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # the session's life beyond this socket (server/role/parking.py)
        self.asked = SessionRequest()
        self.ttl_ms = 0  # granted: the session is parked this long if the socket breaks
        self.client_id: str | None = None
        self.token = ""
        # the [security] rules in force (None: none at all), as of the accounts' version
        # `rules_version`, and the destinations they let this connection send to
        # (connection.py `_denied`)
        self.rules: SecurityRules | None = None
        self.rules_version = -1
        self.sends_allowed: set[str] = set()

    # ------------------------------------------------------------ steps of other parts
    # connection.py: frames, output and flow control

    def fail(self, message: str, frame: Frame | None = None, detail: str = "",
             extra: dict[str, str] | None = None, receipt: str | None = None) -> None:
        """ERROR naming the problem, then close (connection.py)."""
        raise NotImplementedError

    def close(self, park: bool = False) -> None:
        """Write what is written, close the socket (connection.py)."""
        raise NotImplementedError

    def confirm(self, ticket: Ticket | None, frame_bytes: bytes) -> None:
        """Send a RECEIPT once `ticket` is confirmed, after earlier output (connection.py)."""
        raise NotImplementedError

    def drain_deliveries(self) -> None:
        """Write this connection's deliveries now: a RECEIPT never overtakes them
        (connection.py)."""
        raise NotImplementedError

    def release_backlog(self) -> None:
        """Apply the frames held back, now that they may be (connection.py)."""
        raise NotImplementedError

    def _no_room(self, frame: Frame, outcome: Outcome) -> object:
        """Hold the frame, or ERROR, as the broker decided (connection.py)."""
        raise NotImplementedError

    def _beat(self) -> None:
        """Send a heart-beat when due (connection.py)."""
        raise NotImplementedError

    def _watch(self) -> None:
        """Drop the client when its heart-beats stop (connection.py)."""
        raise NotImplementedError

    # commands.py

    def _transaction(self, frame: Frame) -> str:
        """The frame's transaction header, required (commands.py)."""
        raise NotImplementedError

    # ------------------------------------------------------------ what a role asks of it
    # (server/role/role.py `Client`; connect.py hands `self` to its role)

    @property
    def closing(self) -> bool:
        """Closed: nothing more is written to it (connection.py)."""
        raise NotImplementedError

    @property
    def login(self) -> str | None:
        """The user it logged in as (connection.py)."""
        raise NotImplementedError

    def write_deliveries(self, deliveries: list[Outgoing]) -> None:
        """MESSAGE frames, in order, each once its record is confirmed (connection.py)."""
        raise NotImplementedError

    def flush_out(self) -> None:
        """Write what waits, in one write (connection.py)."""
        raise NotImplementedError

    def unblock(self, address: Address) -> None:
        """A full destination it waited for has room (connection.py)."""
        raise NotImplementedError

    def throttle(self, paused: bool) -> None:
        """Pause or resume reading for the role (connection.py)."""
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        """What the operator's connection list shows of it (connection.py)."""
        raise NotImplementedError

    def commit_finished(self, run: CommitRun, ticket: Ticket | None) -> None:
        """A COMMIT applied in slices is done (sliced_frames.py)."""
        raise NotImplementedError
