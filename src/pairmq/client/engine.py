"""The failover client's decisions, without I/O: the blocking and the asyncio clients are
thin drivers around one `Engine` (in the manner of etcd raft's `Step`/`tick`).

The driver tells the engine what happened (a socket opened or failed, bytes read, the
socket lost, time passed) and what the application asked (send, subscribe, ack, ...), then
drains what the engine decided: bytes to write on the current socket (`take_output`),
operations finished (their `outcome` set), messages buffered per subscription, failover
events for the listeners. Time is always a parameter (`now`, monotonic seconds).

The link is one explicit state (client/link.py).

The engine is written in parts, which share one state (client/engine_state.py): what the
driver and the server tell it, and what it writes (here); what the application asks
(client/application_calls.py: how a persistent SEND is stamped and confirmed); what a
failover does to what was in flight (client/recovery.py); the client's transaction
(client/transacting.py).
"""

from __future__ import annotations

import os
import random
from dataclasses import fields

from pairmq.client.application_calls import ApplicationCalls
from pairmq.client.errors import ClientClosed, ClientError, ConnectionFailed, ServerError
from pairmq.client.link import Link
from pairmq.client.members import ClusterFailoverEvent, choose_member
from pairmq.client.options import Address, ClientOptions
from pairmq.client.outcomes import Outcome
from pairmq.client.recovery import Recovery
from pairmq.client.results import EventKind, FailoverEvent, Message, Op, SendResult
from pairmq.client.subscriptions import AckOp, SubOp, SubState
from pairmq.client.topology import Attempts, Servers
from pairmq.client.transacting import Transacting
from pairmq.client.transactions import TxOp
from pairmq.protocol import ClientSession, Frame, ProtocolError, SessionState
from pairmq.protocol.redirect import SCALED_DOWN_TO

# Refusals that no other server, and no waiting, will change.
_FATAL = ("authentication failed", "no common STOMP version")


class Engine(ApplicationCalls, Recovery, Transacting):
    """One failover client; not thread-safe (the drivers serialise calls)."""

    def __init__(self, options: ClientOptions, now: float, name: str | None = None) -> None:
        super().__init__(options, now, name)
        if options.members:
            # A cluster URL: one member at a time, the first picked at random (unless
            # pinned) so that the clients of one URL spread over the members.
            start = choose_member(len(options.members), options.cluster_member,
                                  random.Random(os.urandom(16)))
            self.servers = Servers(options.servers, options.members, start, options.tls)
            assert self.attempts is not None
            self.attempts = Attempts(self.servers, options, self.attempts.rounds, now)
        self._failed_member = self.servers.member  # the member of the failed connection

    # ------------------------------------------------------------ what the driver takes

    def take_forwarded(self) -> list[int]:
        forwarded, self.forwarded = self.forwarded, []
        return forwarded

    def take_restamped(self) -> list[tuple[int, dict[str, str]]]:
        """Outbox rows whose messages were numbered again (a refusal before them): the
        driver writes their new headers to the outbox."""
        restamped, self.restamped = self.restamped, []
        return restamped

    def wants_socket(self, socket_id: int) -> bool:
        """Whether the driver's socket `socket_id` is still the engine's (else close it)."""
        return self.session is not None and socket_id == self.socket_id

    def failing_since(self) -> float | None:
        """When the current failover began (None: not failing over)."""
        return self._failed_at if self.link in (Link.CONNECTING, Link.RECOVERING) \
            and self.generation else None

    def has_output(self) -> bool:
        return bool(self._out)

    def may_wait_to_write(self) -> bool:
        """True when what waits to be written may wait for the next answer of the server
        (one is owed for a frame already written, on a serving session, and not much
        waits): a driver then lets its reader write it, in one go with what else came
        meanwhile. A receipt asked for by a frame not yet written is owed nothing: that
        frame must go now, or reader and writer would wait for each other."""
        if self.link is not Link.UP or not self._awaiting or len(self._out) >= 128:
            return False
        oldest, _ = next(iter(self._awaiting.values()))  # the server answers in order
        return oldest <= self._handed

    def take_output(self) -> tuple[int, bytes]:
        """What to write on socket `socket_id` (drop it if that socket is gone)."""
        out = self._out
        if not out:
            return self.socket_id, b""
        self._out = []
        if self.session is not None:
            self._handed = self.session.frames_sent
        return self.socket_id, out[0] if len(out) == 1 else b"".join(out)

    def take_events(self) -> list[FailoverEvent]:
        events, self.events = self.events, []
        return events

    # ------------------------------------------------------------ connecting (the driver)

    def next_attempt(self, now: float) -> tuple[Address, float] | None:
        """The server to try next and when; None when no attempt is wanted (connected,
        closed, an attempt under way) or the client just gave up."""
        if self.link is not Link.CONNECTING or self.session is not None:
            return None
        assert self.attempts is not None
        plan = self.attempts.next(now)
        if plan is None:
            self.give_up(ConnectionFailed(
                f"no server of {self._server_list()} accepted the client: "
                f"{self.attempts.summary()}"), now)
        return plan

    def trying(self, address: Address) -> None:
        assert self.attempts is not None
        self.attempts.began(address)

    def attempt_failed(self, address: Address, why: str, now: float) -> None:
        """The TCP connection to `address` could not be made."""
        if self.attempts is not None:
            self.attempts.refused(address, why)

    def opened(self, address: Address, now: float) -> None:
        """A TCP connection to `address` is open: CONNECT goes out on it."""
        o = self.options
        headers = {"host": address[0]}
        if o.login is not None:
            headers["login"] = o.login
            headers["passcode"] = o.passcode or ""
        if o.client_id is not None:
            headers["client-id"] = o.client_id
        if o.connection_ttl:
            headers["connection-ttl"] = str(o.connection_ttl)
        if self._resume is not None:
            headers["resume-session"] = self._resume["session"]
            headers["resume-key"] = self._resume["key"]
            headers["resume-last-ack"] = str(self._last_ack)
        self.session = ClientSession(headers, now, heart_beat=o.heart_beat)
        self.address = address
        self.socket_id += 1
        self._connect_deadline = now + o.connect_timeout / 1000
        self._out = [self.session.connect_bytes(now)]
        self._handed = 0

    def _server_list(self) -> str:
        return ", ".join(f"{h}:{p}" for h, p in self.servers.everyone())

    # ------------------------------------------------------------ input (the driver)

    def receive(self, data: bytes, now: float) -> None:
        session = self.session
        if session is None:
            return
        try:
            for frame in session.receive(data, now):
                command = frame.command
                if command == "MESSAGE":
                    self._message(frame, now)
                elif command == "RECEIPT":
                    self._receipt(frame.headers["receipt-id"], now, frame.headers)
                elif command == "CONNECTED":
                    self._connected(frame, now)
                elif command == "ERROR":
                    self._error(frame, now)
                if self.session is not session:
                    return  # an ERROR or a fatal refusal ended it: the rest is moot
        except ProtocolError as e:
            if self.session is session:
                self.lost(f"the server broke the protocol: {e}", now)

    def tick(self, now: float) -> None:
        """Heart-beats out, a silent server or a late CONNECTED detected."""
        session = self.session
        if session is None:
            return
        if session.state is SessionState.CONNECTING:
            if now >= self._connect_deadline:
                self.lost(f"no CONNECTED within {self.options.connect_timeout} ms", now)
            return
        beat = session.tick(now)
        if beat:
            self._out.append(beat)
        if session.peer_silent(now):
            self.lost(f"nothing from the server for {session.silent_for(now):.1f} s "
                      "(heart-beats missed)", now)

    def next_deadline(self) -> float | None:
        session = self.session
        if session is None:
            return None
        if session.state is SessionState.CONNECTING:
            return self._connect_deadline
        return session.next_deadline()

    def lost(self, reason: str, now: float) -> None:
        """The current socket is gone (closed, reset, silent, or ended by an ERROR)."""
        session = self.session
        if session is None:
            return
        session.lost()
        self.session = None
        self._out = []
        address = self.address
        if self.link is Link.CLOSING:
            self._move("lost")
            self._finish_all(ClientClosed("the client was closed"))
            return
        if self.link is Link.CONNECTING:  # an attempt that did not get as far as serving
            assert self.attempts is not None and address is not None
            self.attempts.refused(address, reason)
            return
        # UP or RECOVERING: the connection failed
        if self._failed_at is None:
            self._failed_at = now
            self._failed_server = self.server
            self._failed_member = self.servers.member
        self._failure = reason
        self.attempts = Attempts(self.servers, self.options,
                                 -1 if self.options.outbox else self.options.reconnect_attempts,
                                 now)
        self._move("lost")

    def _error(self, frame: Frame, now: float) -> None:
        headers = frame.headers
        # a client on TLS follows only hints to TLS listeners (the server names both)
        hint = self.servers.named(headers.get(
            "active-server-tls" if self.options.tls else "active-server"))
        message = headers.get("message", "ERROR")
        receipt = headers.get("receipt-id")
        # a member that scaled down names the one that took its messages: go there
        moved_to = headers.get(SCALED_DOWN_TO)
        if self.link is Link.CONNECTING:
            if message.startswith(_FATAL):
                self.give_up(ConnectionFailed(f"{self.address}: {message}"), now)
                return
            assert self.attempts is not None and self.address is not None
            self.session = None
            self.attempts.refused(self.address, message, hint, answered=True)
            self._redirect(moved_to, now)
            return
        if receipt is not None and receipt in self._awaiting:
            _, op = self._awaiting.pop(receipt)
            self._refused(op, ServerError(frame, f"{op.kind} refused"))
        self.lost(f"ERROR from the server: {message}", now)
        self._redirect(moved_to, now)

    def _redirect(self, moved_to: str | None, now: float) -> None:
        if moved_to and self.attempts is not None \
                and self.servers.redirect(moved_to) is not None:
            self.attempts.redirected(now)

    # ------------------------------------------------------------ the server's answers

    def _connected(self, frame: Frame, now: float) -> None:
        headers = frame.headers
        assert self.address is not None
        self.servers.current = self.address
        self.servers.hint = None
        topology = headers.get("topology-tls" if self.options.tls else "topology")
        if topology:
            self.servers.learn(topology)
        if self.servers.cluster:
            self._learn_cluster(headers)
        cache = headers.get("dup-cache-size")
        self.sequences.dup_cache_size = int(cache) if cache is not None and cache.isdigit() \
            else None
        resumed = self._resume is not None and headers.get("resumed") == "true"
        key = headers.get("resume-key")
        # Resuming is offered only once the session serves: a session still re-creating
        # subscriptions when it fails is replaced, and recovery starts over.
        self._granted = {"session": headers.get("session", ""), "key": key} if key else None
        self._resume = None
        self.attempts = None
        if resumed:
            self._resumed(int(headers.get("resume-frames", "0")), now)
            return
        self._last_ack = 0
        self.generation += 1
        if self.generation == 1:
            self._up(now)
            return
        self._fresh_after_failure(now)

    def _learn_cluster(self, headers: dict[str, str]) -> None:
        """CONNECTED's `cluster-members` (over TLS, `cluster-members-tls` when the server
        sends it): the members the client did not know join those it moves between."""
        members = (self.options.tls and headers.get("cluster-members-tls")) \
            or headers.get("cluster-members")
        if members:
            self.servers.learn_members(members)
        name = headers.get("cluster-name")
        if name:
            self.servers.cluster_name = name

    def _event_failover(self, now: float, resumed: bool, resent: int) -> None:
        super()._event_failover(now, resumed, resent)
        self._name_members()

    def give_up(self, error: ClientError, now: float) -> None:
        super().give_up(error, now)
        self._name_members()

    def _name_members(self) -> None:
        """A cluster client's last event says which member it was on and which it is on."""
        event = self.events[-1] if self.events else None
        if not self.servers.cluster or event is None or isinstance(event, ClusterFailoverEvent):
            return
        old = self._failed_member
        new = self.servers.member if event.kind is EventKind.FAILOVER else None
        self.events[-1] = ClusterFailoverEvent(
            **{f.name: getattr(event, f.name) for f in fields(FailoverEvent)},
            old_member=self.servers.member_url(old),
            member=None if new is None else self.servers.member_url(new),
            member_changed=new is not None and new != old)

    def _up(self, now: float) -> None:
        self._move("up")
        self._resume = self._granted
        self._write_pending(now)

    def _receipt(self, receipt: str, now: float, headers: dict[str, str] | None = None
                 ) -> None:
        sub = self._recovering.pop(receipt, None)
        if sub is not None:
            self._awaiting.pop(receipt, None)
            if sub.op is not None:
                sub.op.receipt_headers = dict(headers or {})
                sub.op.finish(Outcome.CONFIRMED)
                sub.op = None
            if not self._recovering and self.link is Link.RECOVERING:
                self._recovered(now)
            return
        entry = self._awaiting.pop(receipt, None)
        if entry is None:
            return
        index, op = entry
        if not op.done:
            op.receipt_headers = dict(headers or {})
        log = self._log
        while log and log[0][0] <= index:
            log.popleft()
        acks = self._acks  # a receipt confirms every earlier frame of its session
        while acks and acks[0].written <= index:
            acks.popleft().finish(Outcome.CONFIRMED)
        self._done(receipt, op, now)

    def _done(self, receipt: str, op: Op, now: float) -> None:
        """What a RECEIPT (or a resumed session) confirms."""
        kind = op.kind
        if kind == "send":
            assert isinstance(op, SendResult)
            self._unconfirmed_done(op)
            op.finish(Outcome.CONFIRMED)
            outbox_id = op.outbox_id
            if outbox_id is not None:
                self.forwarded.append(outbox_id)
            return
        if kind == "ack":
            self._ack_receipt = None
        elif kind in ("commit", "abort"):
            assert isinstance(op, TxOp)
            outcome = Outcome.CONFIRMED if kind == "commit" else Outcome.ROLLED_BACK
            for result in op.tx.sends:
                result.finish(outcome)
        elif kind == "subscribe":
            assert isinstance(op, SubOp)
            sub = self.subscriptions.get(op.sub_id)
            if sub is not None and sub.op is op:
                sub.op = None
        elif kind == "disconnect" and self.link is Link.CLOSING:
            op.finish(Outcome.CONFIRMED)
            self._move("closed")
            self.session = None
            self._finish_all(ClientClosed("the client was closed"))
            return
        op.finish(Outcome.CONFIRMED)

    def _refused(self, op: Op, error: ServerError) -> None:
        """The server answered this operation with ERROR: it is not tried again."""
        if op.kind == "send":
            assert isinstance(op, SendResult)
            self._unconfirmed_done(op)
            self._renumber_after(op)
        elif isinstance(op, SubOp) and op.kind in ("subscribe", "resubscribe"):
            self._recovering.pop(op.receipt or "", None)
            sub = self.subscriptions.pop(op.sub_id, None)
            if sub is not None:
                sub.state = SubState.FAILED
                sub.error = error
                if sub.op is not None and sub.op is not op:
                    sub.op.finish(Outcome.FAILED, error)
        elif isinstance(op, TxOp) and op.kind == "commit":
            for result in op.tx.sends:
                result.finish(Outcome.ROLLED_BACK)
        op.finish(Outcome.FAILED, error)

    def _message(self, frame: Frame, now: float) -> None:
        headers = frame.headers
        sub = self.subscriptions.get(headers.get("subscription", ""))
        if sub is None:
            return  # unsubscribed meanwhile: the server takes it back
        ack_id = headers.get("ack")
        if ack_id is not None and ack_id.isdigit():
            number = int(ack_id)
            if number > self._last_ack:
                self._last_ack = number
        if ack_id is not None and self.in_doubt:
            key = (sub.id, headers.get("message-id", ""))
            if key in self.in_doubt:
                # The application acknowledged it on a connection that failed before the
                # ack was confirmed: it has it already. Acknowledge it again instead of
                # handing it out twice (mode client: the next cumulative ACK covers it).
                del self.in_doubt[key]
                self.stats["in_doubt_acked"] += 1
                if sub.ack == "client":
                    sub.unacked[ack_id] = key[1]
                else:
                    self._ack_frame([key], ack_id, None, "ACK", now)
                return
        sub.buffer.append(Message(frame.body, headers, sub.id, self.generation))

    def _unconfirmed_done(self, result: SendResult) -> None:
        if self.unconfirmed.pop(result.receipt or "", None) is not None and result.app_ids:
            self.sequences.settled_app_ids(result.destination, result.app_ids)

    # ------------------------------------------------------------ writing

    def _emit(self, frame: Frame, op: Op | None, log: bool, now: float) -> None:
        link = self.link
        if link is Link.UP:
            self._write(frame, op, log, now)
        elif link is Link.CONNECTING or link is Link.RECOVERING:
            self._pending.append((frame, op, log))
        else:
            raise self.closed_error()

    def _write(self, frame: Frame, op: Op | None, log: bool, now: float) -> None:
        session = self.session
        assert session is not None
        self._out.append(session.send(frame, now))
        index = session.frames_sent
        headers = frame.headers
        if op is not None:
            op.written = index
            receipt = headers.get("receipt")
            if receipt is not None:
                self._awaiting[receipt] = (index, op)
            elif op.kind == "send" and "transaction" not in headers:
                op.finish(Outcome.SENT)
            if isinstance(op, AckOp) and op.kind == "ack" and "transaction" not in headers:
                self._acks.append(op)
        if log:
            self._log.append((index, frame, op))

    def _write_pending(self, now: float) -> None:
        pending = self._pending
        while pending and self.link is Link.UP:
            frame, op, log = pending.popleft()
            self._write(frame, op, log, now)
