"""How a client connection logs in, and how its session outlives a broken socket: CONNECT
(version, refusal, credentials checked off the event loop for hashed passwords), CONNECTED,
and parking and resuming sessions (server/role/parking.py). Part of `StompConnection` (a mixin,
as core/broker/intake.py is of the Broker), kept apart because it is the one part of a connection
that deals with what happens before and after the frames it serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Final

from pairmq import __version__
from pairmq.core import CoreError
from pairmq.protocol import (
    Frame,
    HeartbeatClock,
    negotiate_heart_beat,
    negotiate_version,
    parse_heart_beat,
    serialize,
)
from pairmq.server.clock import now_ms
from pairmq.server.config import User
from pairmq.server.guards.passwords import Busy
from pairmq.server.role.parking import Parked, SessionRequest
from pairmq.server.stomp.commands import Commands
from pairmq.server.tls import common_name

log = logging.getLogger("pairmq.connection")
audit = logging.getLogger("pairmq.audit")  # logins, refusals, permission denials

SUPPORTED: Final = "1.0,1.1,1.2"



class Connecting(Commands):
    """CONNECT and the session's life (a mixin: StompConnection provides the state)."""

    __slots__ = ()  # all in ConnectionState's

    def _park(self) -> None:
        session = self.session
        self.role.parking.park(Parked(self.conn_id, self.token, self.asked.key, session.login,
                                      self.client_id, session.frames, self.last_ticket),
                               self.ttl_ms)

    def drop(self, why: str) -> None:
        """Close the socket without an ERROR (its client is silent, or back on another
        connection); the session is parked if its client asked for that."""
        if self.session.closed:
            return
        log.info("Closing connection %d from %s: %s", self.conn_id, self.peer, why)
        self.close(park=True)

    def on_connect(self, frame: Frame) -> None:
        h = frame.headers
        version = negotiate_version(h.get("accept-version"))
        if version is None:
            self.fail("no common STOMP version: this server supports 1.0, 1.1 and 1.2", frame,
                      extra={"version": SUPPORTED})
            return
        self.session.version = version
        refusal = self.role.refusal()
        if refusal is not None:
            self.fail(refusal.message, frame, extra=refusal.extra)
            return
        leaving = self.role.leaving
        if leaving is not None and leaving.refuses_connect(h.get("client-id")):
            self.fail(leaving.message, frame, extra=leaving.extra)
            return
        parse_heart_beat(h.get("heart-beat", "0,0"))  # a malformed one is refused now
        self.asked = SessionRequest.from_headers(h)
        login = h.get("login")
        if login is not None:
            self._log_in(frame, login)
            return
        # [tls] client_auth: a verified client certificate stands in for a login when its
        # common name is a configured user (roles come from the user)
        by_cert = common_name(self.transport.get_extra_info("peercert")
                              if self.transport is not None else None)
        if by_cert and by_cert in self.users:
            log.info("Connection %d from %s logged in as %r by its client certificate",
                     self.conn_id, self.peer, by_cert)
            self.finish_connect(frame, by_cert)
        elif self.config.allow_anonymous:
            self.finish_connect(frame, None)
        else:
            self.fail("authentication failed", frame,
                      detail="this server requires a login and passcode")

    def _log_in(self, frame: Frame, login: str) -> None:
        """Check a CONNECT's login and passcode: at once when they were verified a moment
        ago, else against their scrypt hash in a login thread (server/guards/passwords.py); later
        when its host's failed logins ask for a delay (server/guards/failed_logins.py)."""
        session = self.session
        wait = self.logins.admit(self.host, self.loop.time())
        if wait > 0:
            # Failed logins from this host: its attempts wait their turn
            # (server/guards/failed_logins.py).
            # Reading goes on, so that a client that leaves meanwhile is seen to leave (its
            # frames wait in the backlog, a few at most: StompConnection._take).
            session.step("checking")
            self._timers["login"] = self.loop.call_later(wait, self._log_in_later, frame,
                                                         login)
            return
        passcode = frame.headers.get("passcode", "")
        users = self.users
        if self.passwords.known(users, login, passcode, self.loop.time()) is not None:
            self.finish_connect(frame, login)  # verified a moment ago (server/guards/passwords.py)
            return
        # An scrypt takes tens of ms: in a login thread, later frames held meanwhile.
        try:
            checked = self.passwords.check(users, login, passcode, self.loop.time, self.host)
        except Busy as e:
            self.fail(str(e), frame)
            return
        # Reading goes on meanwhile, so that a client that leaves is seen to leave (and its
        # check, if still queued, is dropped): its frames wait in the backlog, a few at most.
        session.step("checking")
        self.checking = checked
        checked.add_done_callback(lambda f: self._auth_done(f, login, frame))

    def _log_in_later(self, frame: Frame, login: str) -> None:
        self._timers.pop("login", None)
        if self.session.closed:
            return
        self._log_in(frame, login)
        if not self.session.holds_frames:
            self.release_backlog()
        self.role.flush()

    @property
    def users(self) -> Mapping[str, User]:
        """The users in force: the file's, with those changed at run time over them."""
        return self.broker.accounts.over(self.config.users)

    @property
    def host(self) -> str:
        """The client's address without its port: what failed logins are counted by."""
        return self.peer.rpartition(":")[0] or self.peer

    def _auth_done(self, future: asyncio.Future[User | None], login: str, frame: Frame) -> None:
        self.checking = None
        if self.session.closed:
            return
        ok = not future.cancelled() and future.exception() is None \
            and future.result() is not None
        if ok:
            self.finish_connect(frame, login)
        else:
            self._auth_failed(login, frame)
        self.release_backlog()

    def _auth_failed(self, login: str, frame: Frame) -> None:
        delay = self.logins.failed(self.host, self.loop.time())
        log.warning("Refused login %r from %s: bad login or passcode", login, self.peer)
        audit.warning("login refused: %r from %s (connection %d): bad login or passcode; "
                      "its next attempt waits %.1f s", login, self.peer, self.conn_id, delay)
        self.fail("authentication failed", frame, detail="bad login or passcode")

    def finish_connect(self, frame: Frame, login: str | None) -> None:
        """The CONNECT is let in as `login` (None: anonymous): a broker session, new or
        resumed, then CONNECTED."""
        session = self.session
        version = session.version
        h = frame.headers
        cx, cy = parse_heart_beat(h.get("heart-beat", "0,0"))
        client_id = h.get("client-id")
        session.login = login
        if login is not None:
            self.logins.succeeded(self.host)
        audit.info("login: %s from %s (connection %d)",
                   repr(login) if login is not None else "anonymous", self.peer, self.conn_id)
        user = self.users.get(login) if login is not None else None
        session.roles = frozenset(user.roles) if user is not None else frozenset()
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
        session.step("logged-in")
        self.parser.version = version
        self.parser.max_frame_bytes = self.config.max_frame_bytes  # logged in: the full limit
        beat = self.config.heartbeat_ms
        outgoing, incoming = negotiate_heart_beat(beat, beat, cx, cy)
        headers = {"version": version, "heart-beat": f"{beat},{beat}",
                   "session": self.token, "server": f"pairmq/{__version__}",
                   # the fewest dup-ids a destination remembers (docs/stomp.md)
                   "dup-cache-size": str(self.broker.settings.smallest_dup_cache)}
        topology = self.role.topology()
        if topology is not None:
            headers["topology"] = topology
        headers.update(self.role.cluster_headers())
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
            headers["resume-frames"] = str(session.frames)
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
        self.session.frames = parked.frames
        self.last_ticket = parked.last_ticket
        returned = self.broker.resume_session(self.conn_id, self.asked.last_ack, now_ms())
        log.info("Connection %d from %s resumed session %s (%d frames applied, %d deliveries "
                 "not received went back to their queues)", self.conn_id, self.peer,
                 parked.token, parked.frames, returned)
