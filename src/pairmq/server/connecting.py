"""How a client connection logs in, and how its session outlives a broken socket: CONNECT
(version, refusal, credentials checked off the event loop for hashed passwords), CONNECTED,
and parking and resuming sessions (server/parking.py). Part of `StompConnection` (a mixin,
as core/intake.py is of the Broker), kept apart because it is the one part of a connection
that deals with what happens before and after the frames it serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pairmq import __version__
from pairmq.core import Broker, CoreError
from pairmq.protocol import (
    Frame,
    FrameParser,
    HeartbeatClock,
    negotiate_heart_beat,
    negotiate_version,
    parse_heart_beat,
    serialize,
)
from pairmq.server.auth import check_login, is_hashed, verify_password
from pairmq.server.config import ServerConfig, User
from pairmq.server.logins import LoginThrottle
from pairmq.server.parking import Parked, SessionRequest
from pairmq.server.role import Role, Ticket
from pairmq.server.tls import common_name

log = logging.getLogger("pairmq.connection")
audit = logging.getLogger("pairmq.audit")  # logins, refusals, permission denials

SUPPORTED = "1.0,1.1,1.2"


def now_ms() -> int:
    return int(time.time() * 1000)


class Connecting:
    """CONNECT and the session's life (a mixin: StompConnection provides the state)."""

    config: ServerConfig
    role: Role
    broker: Broker
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    parser: FrameParser
    conn_id: int
    peer: str
    version: str
    connected: bool
    closing: bool
    waiting: bool
    out: list[bytes]
    last_ticket: Ticket | None
    _timers: dict[str, asyncio.TimerHandle]
    clock: HeartbeatClock
    asked: SessionRequest
    ttl_ms: int
    frames: int
    login: str | None
    roles: frozenset[str]
    logins: LoginThrottle
    client_id: str | None
    token: str

    if TYPE_CHECKING:  # provided by StompConnection
        def fail(self, message: str, frame: Frame | None = None, detail: str = "",
                 extra: dict[str, str] | None = None) -> None: ...
        def close(self) -> None: ...
        def release_backlog(self) -> None: ...
        def confirm(self, ticket: Ticket | None, frame_bytes: bytes) -> None: ...
        def _beat(self) -> None: ...
        def _watch(self) -> None: ...

    def _park(self) -> None:
        self.connected = False
        self.role.parking.park(Parked(self.conn_id, self.token, self.asked.key, self.login,
                                      self.client_id, self.frames, self.last_ticket),
                               self.ttl_ms)

    def drop(self, why: str) -> None:
        """Close the socket without an ERROR (its client is silent, or back on another
        connection); the session is parked if its client asked for that."""
        if self.closing:
            return
        log.info("Closing connection %d from %s: %s", self.conn_id, self.peer, why)
        if self.connected and self.ttl_ms:
            self._park()
        self.close()

    def on_connect(self, frame: Frame) -> None:
        if self.connected or self.waiting:
            raise CoreError("already connected")
        h = frame.headers
        version = negotiate_version(h.get("accept-version"))
        if version is None:
            self.fail("no common STOMP version: this server supports 1.0, 1.1 and 1.2", frame,
                      extra={"version": SUPPORTED})
            return
        self.version = version
        refusal = self.role.refusal()
        if refusal is not None:
            self.fail(refusal.message, frame, extra=refusal.extra)
            return
        cx, cy = parse_heart_beat(h.get("heart-beat", "0,0"))
        self.asked = SessionRequest.from_headers(h)
        client_id = h.get("client-id")
        login = h.get("login")
        if login is None:
            # [tls] client_auth: a verified client certificate stands in for a login when its
            # common name is a configured user (roles come from the user)
            by_cert = common_name(self.transport.get_extra_info("peercert")
                                  if self.transport is not None else None)
            if by_cert and by_cert in self.users:
                log.info("Connection %d from %s logged in as %r by its client certificate",
                         self.conn_id, self.peer, by_cert)
                self.finish_connect(version, cx, cy, client_id, by_cert)
            elif self.config.allow_anonymous:
                self.finish_connect(version, cx, cy, client_id, None)
            else:
                self.fail("authentication failed", frame,
                          detail="this server requires a login and passcode")
            return
        wait = self.logins.admit(self.host, self.loop.time())
        if wait > 0:
            # Failed logins from this host: its attempts wait their turn (server/logins.py).
            # Reading goes on, so that a client that leaves meanwhile is seen to leave (its
            # frames wait in the backlog, a few at most: StompConnection._take).
            self.waiting = True
            self._timers["login"] = self.loop.call_later(wait, self._connect_later, frame)
            return
        passcode = h.get("passcode", "")
        users = self.users
        user = users.get(login)
        if user is not None and not is_hashed(user.password):
            if verify_password(user.password, passcode):
                self.finish_connect(version, cx, cy, client_id, login)
            else:
                self._auth_failed(login, frame)
            return
        # A hash takes tens of ms to check: do it in a thread and hold later frames meanwhile.
        self.waiting = True
        assert self.transport is not None
        self.transport.pause_reading()
        future = self.loop.run_in_executor(None, check_login, users, login, passcode)
        future.add_done_callback(
            lambda f: self._auth_done(f, version, cx, cy, client_id, login, frame))

    def _connect_later(self, frame: Frame) -> None:
        self._timers.pop("login", None)
        self.waiting = False
        if self.closing:
            return
        self.on_connect(frame)
        if not self.waiting:
            self.release_backlog()

    @property
    def users(self) -> Mapping[str, User]:
        """The users in force: the file's, with those changed at run time over them."""
        return self.broker.accounts.over(self.config.users)

    @property
    def host(self) -> str:
        """The client's address without its port: what failed logins are counted by."""
        return self.peer.rpartition(":")[0] or self.peer

    def _auth_done(self, future: asyncio.Future, version: str, cx: int, cy: int,
                   client_id: str | None, login: str, frame: Frame) -> None:
        self.waiting = False
        if self.closing:
            return
        ok = not future.cancelled() and future.exception() is None and future.result()
        if ok:
            self.finish_connect(version, cx, cy, client_id, login)
        else:
            self._auth_failed(login, frame)
        self.release_backlog()

    def _auth_failed(self, login: str, frame: Frame) -> None:
        delay = self.logins.failed(self.host, self.loop.time())
        log.warning("Refused login %r from %s: bad login or passcode", login, self.peer)
        audit.warning("login refused: %r from %s (connection %d): bad login or passcode; "
                      "its next attempt waits %.1f s", login, self.peer, self.conn_id, delay)
        self.fail("authentication failed", frame, detail="bad login or passcode")

    def finish_connect(self, version: str, cx: int, cy: int, client_id: str | None,
                       login: str | None) -> None:
        self.login = login
        if login is not None:
            self.logins.succeeded(self.host)
        audit.info("login: %s from %s (connection %d)",
                   repr(login) if login is not None else "anonymous", self.peer, self.conn_id)
        user = self.users.get(login) if login is not None else None
        self.roles = frozenset(user.roles) if user is not None else frozenset()
        self.client_id = client_id
        asked = self.asked
        parking = self.role.parking
        resumed = None if asked.token is None else parking.claim(asked.token, asked.key, login)
        if resumed is not None:
            self._resume(resumed)
        else:
            if client_id is not None:
                parking.release_client_id(client_id, login)
            try:
                self.token = self.broker.open_session(self.conn_id, version, client_id).token
            except CoreError as e:
                self.fail(str(e))
                return
        self.connected = True
        self.parser.version = version
        beat = self.config.heartbeat_ms
        outgoing, incoming = negotiate_heart_beat(beat, beat, cx, cy)
        headers = {"version": version, "heart-beat": f"{beat},{beat}",
                   "session": self.token, "server": f"pairmq/{__version__}",
                   # the fewest dup-ids a destination remembers (docs/stomp.md)
                   "dup-cache-size": str(self.broker.settings.smallest_dup_cache)}
        topology = self.role.topology()
        if topology is not None:
            headers["topology"] = topology
        topology_tls = self.role.topology_tls()
        if topology_tls is not None:  # for clients on TLS: the listeners they can use
            headers["topology-tls"] = topology_tls
        self.ttl_ms = min(asked.ttl_ms, self.config.connection_ttl_max_ms)
        if self.ttl_ms:
            self.asked = SessionRequest(self.ttl_ms, self.token, parking.new_key())
            parking.serving(self.token, self.asked.key, login, self)
            headers["connection-ttl"] = str(self.ttl_ms)
            headers["resume-key"] = self.asked.key
        if resumed is None:
            self.out.append(serialize(Frame("CONNECTED", headers), version))
            self.role.mark_dirty(self)
        else:
            # Sent once everything the session wrote is confirmed: every frame it counts
            # as applied is then confirmed too, and the client resends only the others.
            headers["resumed"] = "true"
            headers["resume-frames"] = str(self.frames)
            self.confirm(self.last_ticket, serialize(Frame("CONNECTED", headers), version))
        loop = self.loop
        self.clock = HeartbeatClock(outgoing, incoming, loop.time())
        if outgoing:
            self._timers["beat"] = loop.call_later(outgoing / 1000, self._beat)
        if incoming:
            self._timers["watch"] = loop.call_later(incoming / 1000, self._watch)
        log.debug("Connection %d from %s logged in as %r (STOMP %s, heart-beat out %d ms, "
                  "in %d ms)", self.conn_id, self.peer, login, version, outgoing, incoming)

    def _resume(self, parked: Parked) -> None:
        """Take over a parked session: its connection id, its count of frames applied, its
        newest record; deliveries the client never received go back to their queues."""
        role = self.role
        role.detach(self)
        self.conn_id = parked.conn_id
        role.attach(self)
        self.token = parked.token
        self.frames = parked.frames
        self.last_ticket = parked.last_ticket
        returned = self.broker.resume_session(self.conn_id, self.asked.last_ack, now_ms())
        log.info("Connection %d from %s resumed session %s (%d frames applied, %d deliveries "
                 "not received went back to their queues)", self.conn_id, self.peer,
                 parked.token, parked.frames, returned)
