"""One client connection: bytes to frames (protocol), frames to broker commands (core).

An `asyncio.Protocol` rather than streams: data_received hands a whole socket read to
the parser, every frame in it is applied, and all output is written once at the end. The
connection's STOMP state, and whether a frame may be applied, are decided by its sans-IO
`ServerSession` (server/stomp/session.py); this is the asyncio shell around it.

Output that must wait for the journal (a RECEIPT, a MESSAGE of a persistent message whose
record is not confirmed yet) waits in `held` (server/stomp/held_output.py), in order, with whatever
comes after it on the connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, cast

from pairmq.core import CoreError
from pairmq.core.accounts import Accounts
from pairmq.core.admission import Admission, Cause, Outcome
from pairmq.core.broker.intake import TRANSPORT_HEADERS as NOT_KEPT
from pairmq.core.destinations import STREAM_PREFIX
from pairmq.core.permissions import PERMISSIONED, Exists, SecurityRules
from pairmq.core.queue import Address
from pairmq.core.rabbitmq import AMQ_QUEUE_PREFIX, amq_target
from pairmq.core.stream_log import Outgoing, StreamBatch
from pairmq.protocol import Frame, HeartbeatClock, ProtocolError
from pairmq.protocol.batch import SEND_BATCH_HEADER, decode_send_records, parse_send_batch
from pairmq.server.clock import now_ms
from pairmq.server.role.confirmations import Ticket
from pairmq.server.role.leaving import PRODUCER_COMMANDS
from pairmq.server.role.role import RolePhase
from pairmq.server.stomp import wire
from pairmq.server.stomp.connect import Connecting, audit
from pairmq.server.stomp.connection_state import Stall
from pairmq.server.stomp.session import COUNTED, OWN_RECEIPTS, Intake, Phase, Wait
from pairmq.server.stomp.sliced_frames import BATCH_SLICE, HELD

log = logging.getLogger("pairmq.connection")

AGREED: Final = (Phase.CONNECTED, Phase.DISCONNECTING)  # phases with a STOMP version agreed

PRE_LOGIN_FRAMES: Final = 4  # frames held behind a delayed login before reading pauses
TURN_BUDGET_S: Final = 0.01  # frames of all connections applied per turn of the loop, at most
CONNECT_TIMEOUT_S: Final = 30.0  # a socket that never sends CONNECT is closed, as ActiveMQ does
WRITE_HIGH_WATER: Final = 1024 * 1024
WRITE_LOW_WATER: Final = 256 * 1024


class StompConnection(Connecting):
    """A client connection; it belongs to the role it was accepted in, for life."""

    __slots__ = ()  # all in ConnectionState's

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it
        self.transport = stream
        stream.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.protocol = "stomp+tls" if transport.get_extra_info("ssl_object") else "stomp"
        self.clock = HeartbeatClock(0, 0, self.loop.time())
        self.role.attach(self)
        refusal = self.counts.refusal(self.host)
        if refusal is not None:
            log.warning("Refused connection %d from %s: %s", self.conn_id, self.peer, refusal)
            self.fail(refusal)
            return
        self.counted_as = self.host
        if self.role.throttled:
            stream.pause_reading()
        self._timers["connect"] = self.loop.call_later(CONNECT_TIMEOUT_S, self._connect_timeout)
        log.debug("Connection %d opened from %s (role %d)", self.conn_id, self.peer,
                  self.role.generation)

    def describe(self) -> dict[str, object]:
        """What an operator's connection list shows of it (server/manage/operator_api.py)."""
        session = self.broker.sessions.get(self.conn_id)
        return {"id": self.conn_id, "user": self.login, "address": self.peer,
                "protocol": self.protocol, "version": self.session.version,
                "state": self.session.phase.value, "opened": self.opened,
                "subscriptions": len(session.subs) + len(session.cursors) if session else 0}

    @property
    def closing(self) -> bool:
        """Closed: nothing more is written to it (what the role asks before writing)."""
        return self.session.closed

    @property
    def login(self) -> str | None:
        """The user it logged in as (None: anonymous, or not logged in)."""
        return self.session.login

    def data_received(self, data: bytes) -> None:
        if self.session.closed:
            return
        now = self.loop.time()
        self.clock.read(now)
        try:
            frames = self.parser.feed(data)
        except ProtocolError as e:
            # Frames completed before the bad bytes count, however the reads were split.
            if e.frames:
                self._take(e.frames)
            message = str(e)
            if message.startswith("frame too large") and not self.session.owns_broker_session:
                message += " before login (pre_login_frame_bytes; max_frame_bytes applies " \
                           "once CONNECTED)"
            self.fail(message, receipt=e.receipt)
            self.role.flush()
            return
        self._count_unfinished(bool(frames), now)
        if frames:
            try:
                self._take(frames)
                self.role.flush()
            except Exception:
                # A bug must not pass silently (uvloop would just close the socket).
                log.exception("Internal error while serving connection %d from %s",
                              self.conn_id, self.peer)
                self.fail("internal server error (logged on the server)")
                self.role.flush()

    def _take(self, frames: list[Frame]) -> None:
        if self.session.holds_frames or self.backlog:
            self.backlog.extend(frames)
            if self.session.phase is Phase.LOGGING_IN and len(self.backlog) > PRE_LOGIN_FRAMES \
                    and self.transport is not None:
                self.transport.pause_reading()  # a login being delayed: enough held
        else:
            self.process(frames)

    def connection_lost(self, exc: Exception | None) -> None:
        log.debug("Connection %d from %s closed%s", self.conn_id, self.peer,
                  f" ({exc})" if exc else "")
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self.checking is not None:
            self.checking.cancel()  # dropped if it still waits its turn (passwords.py)
        if self.counted_as is not None:
            self.counts.closed(self.counted_as)
            self.counted_as = None
        if self.unfinished.bytes:
            self.broker.add_frame_bytes(self.unfinished.fed(0, False, 0.0))
        self.role.detach(self)
        self.blocked_on.clear()
        if not self.session.closed:  # the peer or the network ended it, not this server
            self._to_closed(park=True)
        self.role.flush()

    def _to_closed(self, park: bool) -> None:
        """Enter CLOSED. A broker session this connection owns ends here: parked for its
        connection_ttl (when `park` and the client asked for one), or closed."""
        owned = self.session.owns_broker_session
        self.session.step("closed")
        if not owned:
            return
        if park and self.ttl_ms:
            self._park()
        else:
            self.role.parking.gone(self.token)
            self.broker.close_session(self.conn_id, now_ms())

    def _count_unfinished(self, completed: bool, now: float) -> None:
        """After a read: the bytes of an unfinished frame count in the server's memory, and
        the frame must be complete by [limits] frame_timeout_ms (unfinished_frame.py)."""
        unfinished = self.unfinished
        delta = unfinished.fed(self.parser.buffered, completed, now)
        if delta:
            self.broker.add_frame_bytes(delta)
        if unfinished.since is not None and "frame" not in self._timers \
                and unfinished.timeout_s:
            self._timers["frame"] = self.loop.call_later(unfinished.timeout_s,
                                                         self._frame_deadline)

    def _frame_deadline(self) -> None:
        self._timers.pop("frame", None)
        unfinished = self.unfinished
        if self.session.closed or unfinished.since is None:
            return
        now = self.loop.time()
        if self.session.holds_frames or self.role.throttled:
            unfinished.not_reading(now)  # this server paused reading, not the client
        if unfinished.overdue(now):
            self.fail(f"frame not completed within {unfinished.timeout_s:g} s "
                      f"(frame_timeout_ms): {unfinished.bytes} bytes of it arrived")
            self.role.flush()
            return
        due = unfinished.due()
        assert due is not None
        self._timers["frame"] = self.loop.call_later(due - now, self._frame_deadline)

    def pause_writing(self) -> None:
        self._stall(Stall.SOCKET, True)

    def resume_writing(self) -> None:
        if self._stall(Stall.SOCKET, False):
            self.role.flush()

    def _stall(self, reason: Stall, stalled: bool) -> bool:
        """Note why this connection can take no more deliveries; tell the broker when that
        changes. True when it may take them again."""
        stalls = self._stalls
        was_writable = not stalls
        if stalled:
            stalls.add(reason)
        else:
            stalls.discard(reason)
        writable = not stalls
        if writable == was_writable or not self.session.owns_broker_session:
            return False
        self.broker.set_writable(self.conn_id, writable, now_ms())
        return writable

    # ------------------------------------------------------------ frames

    def process(self, frames: list[Frame]) -> None:
        """Apply frames in order while this turn's budget lasts (TURN_BUDGET_S, shared by
        every connection: server/guards/turn_budget.py): one socket read can bring tens of
        thousands of messages (16 batched SENDs of 1,000), and a turn of the event loop that
        long delays every other client and the pair's heartbeats. What is left waits in the backlog,
        reading paused, until the next turn (issue 18). At least one frame is applied."""
        clock = time.perf_counter
        deadline = self.turn.start(clock())
        session = self.session
        for i, frame in enumerate(frames):
            intake = session.intake  # one value per frame (server/stomp/session.py)
            if intake is not _APPLY:
                if intake is _HOLD:
                    self.backlog.extend(frames[i:])
                return  # ignored: after a DISCONNECT, or closed
            if i and clock() > deadline:
                self.backlog.extend(frames[i:])
                session.wait = Wait.TURN
                if self.transport is not None:
                    self.transport.pause_reading()
                self.loop.call_soon(self.release_backlog)
                return
            self.handle(frame)

    def handle(self, frame: Frame) -> None:
        command = frame.command
        session = self.session
        if command not in session.applies:
            refusal = session.refusal(command)
            assert refusal is not None
            self.fail(refusal, frame)
            return
        role = self.role
        if role.phase is not _CURRENT:
            retired = role.refusal()
            assert retired is not None
            self.fail(retired.message, frame, extra=retired.extra)
            return
        leaving = role.leaving
        if leaving is not None and command in PRODUCER_COMMANDS:
            # scaling down: nothing more is taken here. No receipt-id: the client is not
            # told "refused" but "not taken", and sends it again where it reconnects.
            self.fail(leaving.message, extra=leaving.extra)
            return
        if command in PERMISSIONED:  # the commands [security] may refuse
            accounts = self.broker.accounts
            if accounts.version != self.rules_version:  # users or rules changed
                self._rules_changed(accounts)
            if self.rules is not None:  # none in force: nothing to refuse, no call
                denied = self._denied(frame, self.rules)
                if denied is not None:
                    self.fail(denied, frame)
                    return
        try:
            mark = role.frame_mark()
            # Every message's two frames are called directly: through the table the compiled
            # build makes a generic call, its arguments parsed again.
            if command == "SEND":
                held = self.on_send(frame)
            elif command == "ACK":
                self.on_ack(frame)
                held = None
            else:
                held = HANDLERS[command](self, frame)
            ticket = role.ticket_since(mark)
        except (CoreError, ProtocolError) as e:
            self.fail(str(e), frame)
            return
        if held is HELD:
            return
        extra = held if isinstance(held, dict) else None  # headers for this frame's RECEIPT
        if command in COUNTED:  # it counts among those a resumed session reports
            session.frames += 1
        # A RECEIPT says this frame and every earlier one of the connection were taken, so
        # it waits for the newest record this connection wrote: this frame's own (or, for a
        # dup-id hit, the original's) or, if it wrote none, that of an earlier frame (an
        # ACK sent without a receipt, say). Never for a record of somebody else's.
        if ticket is not None:
            self.last_ticket = ticket
        receipt = frame.headers.get("receipt")
        if receipt is not None and not session.closed and command not in OWN_RECEIPTS:
            self.drain_deliveries()
            self.confirm(self.last_ticket, wire.receipt(receipt, session.version, extra))

    def confirm(self, ticket: Ticket | None, frame_bytes: bytes) -> None:
        """Send a RECEIPT once the record it waits for is confirmed (on disk and, in a pair,
        on the backup), never earlier, and after every earlier output of this connection."""
        role = self.role
        # role.confirmed(ticket), written out: every RECEIPT comes here
        if not self.held and (ticket is None or (
                ticket.seq is not None and ticket.seq <= role.confirmed_seq)):
            self.out.append(frame_bytes)
            role.mark_dirty(self)
            return
        self._hold(ticket, frame_bytes)

    def _hold(self, ticket: Ticket | None, frame_bytes: bytes) -> None:
        """Keep a frame, behind what is kept already, until `ticket` is confirmed."""
        held = self.held
        if held.hold(ticket, frame_bytes) and ticket is not None:
            self.role.when_confirmed(ticket, self.release_held)
        if held.size > WRITE_HIGH_WATER and Stall.HELD not in self._stalls:
            self._stall(Stall.HELD, True)  # a stalled disk or backup: stop dispatching

    def release_held(self) -> None:
        if self.session.closed:
            return
        role = self.role
        held = self.held
        held.release(role.confirmed_seq, self.out)
        role.mark_dirty(self)
        if held.size <= WRITE_LOW_WATER and Stall.HELD in self._stalls:
            self._stall(Stall.HELD, False)  # whoever called flushes what is dispatched
        if self.session.phase is Phase.DISCONNECTING and not held:
            self.close()

    def hold(self, frame: Frame, address: Address | None = None,
             until: Ticket | None = None) -> object:
        """Keep this frame and those after it until there is room: in `address` (a full
        destination under address_full_policy block), else on the server (journal, disk,
        memory under full_policy block); or until the record `until` is confirmed. The
        frame is decided again when it is released."""
        self.session.wait = Wait.CONFIRM if until is not None else \
            Wait.ROOM if address is None else Wait.ADDRESS
        self.backlog.appendleft(frame)
        if self.transport is not None:
            self.transport.pause_reading()
        if until is not None:
            self.role.when_confirmed(until, self.release_backlog)
        elif address is None:
            self.role.wait_for_room(self)
        else:
            self.blocked_on.add(address)
            self.role.wait_for_address(self, address)
        return HELD

    def release_backlog(self) -> None:
        if self.blocked_on:
            return  # still blocked by a full destination: its unblocking releases us
        self.session.wait = Wait.NONE
        if not self.session.closed:
            if self.transport is not None and not self.role.throttled:
                self.transport.resume_reading()
            frames = list(self.backlog)
            self.backlog.clear()
            self.process(frames)
        self.role.flush()

    def _rules_changed(self, accounts: Accounts) -> None:
        """Users or rules changed (or none were read yet): the rules in force, and no SEND
        decision kept from before."""
        self.rules_version = accounts.version
        self.rules = accounts.rules_over(self.config.security)
        self.sends_allowed.clear()

    def _denied(self, frame: Frame, rules: SecurityRules) -> str | None:
        """Why [security] refuses this frame (ServerSession.denial), audited, or None. A
        SEND's decision is kept per destination until users or rules change (the session's
        roles are its login's, for its life): a producer is checked once, not per message."""
        command = frame.command
        headers = frame.headers
        sends_allowed = self.sends_allowed
        destination = headers.get("destination") if command == "SEND" else None
        if destination in sends_allowed:
            return None
        session = self.session
        exists = self.broker.exists_for(self.conn_id, command, headers) \
            if session.owns_broker_session else _NOTHING
        refusal = session.denial(command, headers, rules, exists)
        if refusal is not None:
            audit.warning("%s (connection %d from %s)", refusal, self.conn_id, self.peer)
            return str(refusal)
        if destination is not None:
            if len(sends_allowed) >= SENDS_ALLOWED_KEPT:
                sends_allowed.clear()
            sends_allowed.add(destination)
        return None

    def on_send(self, frame: Frame) -> object:
        h = frame.headers
        destination = h.get("destination")
        if destination is None:
            raise CoreError("SEND requires a destination header")
        if destination.startswith(AMQ_QUEUE_PREFIX):  # RabbitMQ's name (core/rabbitmq.py)
            destination = amq_target(destination, h, self.broker.streams)
        batched = h.get(SEND_BATCH_HEADER)
        if batched is not None:  # docs/stomp.md: its messages are taken or held as a whole
            count = parse_send_batch(batched)
            assert count is not None
            messages = decode_send_records(frame.body, count)
            self.limits.check_batch(messages, h, BATCH_NOT_KEPT)
            outcome = self.broker.send_batch(self.conn_id, destination, h, messages, now_ms(),
                                             h.get("transaction"),
                                             self.role.journal_full_reason(),
                                             slice_size=BATCH_SLICE)
            if self.broker.batch_open(self.conn_id):
                return self._route_later(frame)
            return self._no_room(frame, outcome)
        limits = self.limits
        if len(h) > limits.most_headers or len(frame.body) > limits.body_fits:
            limits.check(h, len(frame.body), not_kept=NOT_KEPT)  # it may not fit: look
        journal_full = self.role.journal_full_reason() if h.get("persistent") == "true" \
            or destination.startswith(STREAM_PREFIX) else None
        outcome = self.broker.send(self.conn_id, destination, h, frame.body, now_ms(),
                                   h.get("transaction"), journal_full)
        admission = outcome.admission
        if admission is not _HELD and admission is not _FAILED:
            return None  # taken (or paged, dropped, a duplicate): the usual case, no call
        return self._no_room(frame, outcome)

    def _no_room(self, frame: Frame, outcome: Outcome) -> object:
        """Carry out what the broker decided (core/admission.py): hold the frame, or ERROR
        and close; everything else (taken, paged, dropped, duplicate) is answered."""
        admission = outcome.admission
        if admission is _HELD:
            return self.hold(frame, outcome.address)
        if admission is _FAILED:
            waiting = self.held.newest_unconfirmed(self.role.confirmed_seq)
            if waiting is not None and outcome.cause is not Cause.JOURNAL:
                # RECEIPTs of earlier frames and MESSAGEs still wait for their records
                # (which a working journal will confirm): the ERROR, and the close after
                # it, must not overtake them. Decided again once they are out.
                return self.hold(frame, until=waiting)
            raise CoreError(outcome.reason)
        return None

    def on_disconnect(self, frame: Frame) -> None:
        self.drain_deliveries()
        receipt = frame.headers.get("receipt")
        self.session.step("DISCONNECT")
        if self.transport is not None:
            self.transport.pause_reading()
        if receipt is not None:
            # After every earlier receipt, and once everything this connection wrote is
            # confirmed: the client may rely on all its frames having been taken.
            self.confirm(self.last_ticket, wire.receipt(receipt, self.session.version))
        if not self.held:
            self.close()

    # ------------------------------------------------------------ output

    def write_deliveries(self, deliveries: list[Outgoing]) -> None:
        """MESSAGE frames, in order; one of a persistent message waits until the record that
        added it is confirmed (as a RECEIPT would), and everything after it waits too."""
        version = self.session.version
        lines = self.sub_lines
        out = self.out
        role = self.role
        read_body = role.read_body
        gate = role.delivery_gate if self.gated else None
        held = self.held
        for delivery in deliveries:
            sub_id = delivery.subscription.id
            line = lines.get(sub_id)
            if line is None:
                line = lines[sub_id] = wire.subscription_line(sub_id, version)
            if isinstance(delivery, StreamBatch):  # x-stream-batch: records are persistent
                data = wire.encode_batch(delivery, version, line, role.read_bodies)
                ticket = role.batch_gate(delivery.messages) if self.gated else None
            else:
                data = wire.encode_delivery(delivery, version, line, read_body)
                message = delivery.entry.message
                ticket = gate(message) if gate is not None and message.persistent else None
            if ticket is None and not held:
                out.append(data)
            else:
                self._hold(ticket, data)
        role.mark_dirty(self)
        if self.broker.take_capped(self.conn_id):
            self.loop.call_soon(self._deliver_more)  # after what else waits to run

    def _deliver_more(self) -> None:
        """The rest of a backlog an auto-ack consumer is owed, one turn at a time."""
        if not self.session.owns_broker_session or self._stalls:
            return  # resume_writing (or nothing, when closing) asks again
        self.broker.set_writable(self.conn_id, True, now_ms())
        self.role.flush()

    def drain_deliveries(self) -> None:
        """Take this connection's deliveries now, so a RECEIPT never overtakes them."""
        box = self.broker.outbox.pop(self.conn_id, None)
        if box:
            self.write_deliveries(box)

    def flush_out(self) -> None:
        if self.out and self.transport is not None:
            data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
            self.out.clear()
            self.transport.write(data)
            self.clock.wrote(self.loop.time())

    def fail(self, message: str, frame: Frame | None = None, detail: str = "",
             extra: dict[str, str] | None = None, receipt: str | None = None) -> None:
        """ERROR naming the problem, then close: the specification requires both. Output
        still waiting for its record is dropped, as a connection lost would drop it: no
        RECEIPT is owed for what is not confirmed, and an unconfirmed message is not
        delivered (with ack client it goes back to its queue)."""
        if self.session.closed:
            return
        if frame is not None:
            receipt = frame.headers.get("receipt")
        if self.session.owns_broker_session:
            self.drain_deliveries()
        log.info("Closing connection %d from %s: %s", self.conn_id, self.peer, message)
        # An ERROR that answers a CONNECT is written unescaped, as CONNECTED is: no version
        # was agreed, and clients (stompjs) unescape only after CONNECTED, so they would
        # read `active-server` as "HOST\\cPORT". A raw colon in a value parses everywhere.
        version = self.session.version if self.session.phase in AGREED else "1.0"
        self.out.append(wire.error(message, version, receipt, detail, extra))
        self.close()

    def close(self, park: bool = False) -> None:
        """The server ends the connection: what is written goes out, then the socket closes
        (its broker session ends now: _to_closed)."""
        if not self.session.closed:
            self._to_closed(park)
        self.flush_out()
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------ flow control

    def throttle(self, paused: bool) -> None:
        """The role pauses reading from every client while the backup is far behind."""
        if self.transport is None or self.session.closed:
            return
        if paused:
            self.transport.pause_reading()
        elif not self.session.holds_frames:
            self.transport.resume_reading()

    def unblock(self, address: Address) -> None:
        self.blocked_on.discard(address)
        if not self.blocked_on and not self.session.closed:
            self.release_backlog()

    # ------------------------------------------------------------ timers

    def _connect_timeout(self) -> None:
        if self.session.phase in (Phase.AWAITING_CONNECT, Phase.LOGGING_IN):
            log.info("Closing connection %d from %s: no CONNECT within %.0f s", self.conn_id,
                     self.peer, CONNECT_TIMEOUT_S)
            self.close()

    def _beat(self) -> None:
        if self.session.closed or self.transport is None:
            return
        now = self.loop.time()
        clock = self.clock
        if clock.beat_due(now):
            self.transport.write(b"\n")
            clock.wrote(now)
        due = clock.next_beat()
        assert due is not None
        self._timers["beat"] = self.loop.call_later(due - now, self._beat)

    def _watch(self) -> None:
        if self.session.closed:
            return
        now = self.loop.time()
        clock = self.clock
        if clock.peer_silent(now):
            self.drop(f"no heart-beat for {clock.silent_for(now) * 1000:.0f} ms")
            return
        due = clock.next_check()
        assert due is not None
        self._timers["watch"] = self.loop.call_later(max(due - now, 0.01), self._watch)


_HELD, _FAILED = Admission.HELD, Admission.FAILED  # for every SEND: no class lookups
_APPLY, _HOLD = Intake.APPLY, Intake.HOLD  # for every frame
_CURRENT: Final = RolePhase.CURRENT
SENDS_ALLOWED_KEPT: Final = 1024  # destinations a connection remembers it may send to
_NOTHING: Final = Exists()
BATCH_NOT_KEPT: Final = NOT_KEPT | {SEND_BATCH_HEADER}  # a batched SEND's own header stays with it

HANDLERS: dict[str, Callable[[StompConnection, Frame], object]] = {
    "CONNECT": StompConnection.on_connect,
    "STOMP": StompConnection.on_connect,
    "SEND": StompConnection.on_send,
    "SUBSCRIBE": StompConnection.on_subscribe,
    "UNSUBSCRIBE": StompConnection.on_unsubscribe,
    "ACK": StompConnection.on_ack,
    "NACK": StompConnection.on_nack,
    "BEGIN": StompConnection.on_begin,
    "COMMIT": StompConnection.on_commit,
    "ABORT": StompConnection.on_abort,
    "DISCONNECT": StompConnection.on_disconnect,
}
