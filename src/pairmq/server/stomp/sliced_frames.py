"""Frames applied over several turns of the server, a slice per turn, so that none holds
every other client back: a large batched SEND (`pairmq-batch`) and a large COMMIT
(core/broker/committing.py). Meanwhile the connection's later frames wait, reading paused; the
RECEIPT comes after the last slice. Part of `StompConnection` (a mixin, as
server/stomp/commands.py is).
"""

from __future__ import annotations

import logging
from typing import Final

from pairmq.core import CoreError
from pairmq.core.commit_ledger import CommitPhase, CommitRun
from pairmq.protocol import Frame
from pairmq.server.clock import now_ms
from pairmq.server.role.confirmations import Ticket
from pairmq.server.stomp import wire
from pairmq.server.stomp.connection_state import ConnectionState
from pairmq.server.stomp.session import Wait

log = logging.getLogger("pairmq.connection")

BATCH_SLICE: Final = 256  # messages of a batched SEND routed per turn
HELD: Final = object()  # a handler's answer when it kept the frame for later


class SlicedFrames(ConnectionState):
    """Batched SENDs and COMMITs applied a slice per turn (a mixin: StompConnection
    provides the state)."""

    __slots__ = ()  # all in ConnectionState's

    def _route_later(self, frame: Frame) -> object:
        """A big batch was admitted and its first slice routed: the rest goes a slice per
        turn (a turn stays short), frames after it waiting, and its RECEIPT after the
        last slice."""
        self.session.wait = Wait.BATCH
        if self.transport is not None:
            self.transport.pause_reading()
        self.loop.call_soon(self._next_slice, frame)
        return HELD

    def _next_slice(self, frame: Frame) -> None:
        if self.session.closed or not self.broker.batch_open(self.conn_id):
            return
        role = self.role
        mark = role.frame_mark()
        try:
            done = self.broker.continue_batch(self.conn_id, BATCH_SLICE, now_ms())
        except Exception:
            log.exception("Internal error while routing a batch of connection %d",
                          self.conn_id)
            self.fail("internal server error (logged on the server)", frame)
            role.flush()
            return
        if not done:
            role.flush()
            self.loop.call_soon(self._next_slice, frame)
            return
        self._applied_later(frame, role.ticket_since(mark))

    def _applied_later(self, frame: Frame, ticket: Ticket | None) -> None:
        """A frame applied over several turns is done: its RECEIPT once `ticket` (its last
        record) is confirmed, then the frames that came meanwhile, and reading again."""
        self.session.frames += 1
        if ticket is not None:
            self.last_ticket = ticket
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self.drain_deliveries()
            self.confirm(self.last_ticket, wire.receipt(receipt, self.session.version))
        self.release_backlog()

    def on_commit(self, frame: Frame) -> object:
        outcome = self.broker.commit(self.conn_id, self._transaction(frame), now_ms(),
                                     self.role.journal_full_reason())
        if self.broker.commit_open(self.conn_id):
            # Applied a slice per turn by the role (core/broker/committing.py): the frames after
            # it wait, and its RECEIPT comes once its last slice is confirmed.
            self.session.wait = Wait.COMMIT
            self._committing = frame
            if self.transport is not None:
                self.transport.pause_reading()
            self.role.flush()
            return HELD
        return self._no_room(frame, outcome)

    def commit_finished(self, run: CommitRun, ticket: Ticket | None) -> None:
        """The role applied this connection's COMMIT (DONE), or could not decide it
        (DROPPED: held or refused as a one-turn COMMIT would be; its transaction is open)."""
        frame, self._committing = self._committing, None
        if frame is None or self.session.closed:
            return
        if run.phase is CommitPhase.DONE:
            self._applied_later(frame, ticket)
            return
        try:
            self._no_room(frame, run.outcome)  # held: COMMIT decided again once released
        except CoreError as e:
            self.fail(str(e), frame)
        self.role.flush()
