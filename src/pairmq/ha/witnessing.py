"""The replication machine's requests to the witness: one out at a time, in order.

`WitnessQueue` (ha/witness_queue.py) owns the requests. The `WitnessRequests` part of
`ReplicationMachine` (ha/replication.py) sends them and takes the replies to the step
that asked: lease renewals, and adoption by a witness that was away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pairmq.ha.events import BeginEpoch, ConfirmationsChanged, Log, WitnessReplied
from pairmq.ha.machine_state import MachineState
from pairmq.ha.messages import WitnessPurpose, WitnessReply
from pairmq.ha.phases import Phase

INFO, ERROR = logging.INFO, logging.ERROR
RENEW = WitnessPurpose.RENEW
# What a phase does with the witness's answer to its request: (reply, requested_at).
Reaction = Callable[[WitnessReply | None, float], None]


class WitnessRequests(MachineState):
    def _ask(self, purpose: WitnessPurpose, fields: dict[str, Any]) -> None:
        """Queue a witness request; one is out at a time, in order."""
        self.witness.ask(purpose, fields)
        self._next_request()

    def _next_request(self) -> None:
        renewal = (None if not self.serving or self.phase is Phase.HANDING_OVER
                   else {"op": "renew", "standby": self._standby()})
        request = self.witness.next(renewal, self.journal.epoch, self.cfg.activation_ms)
        if request is not None:
            self._emit(request)

    def _standby(self) -> str | None:
        return self.peer.identity if self.phase is Phase.ACTIVE else None

    def _renew(self) -> None:
        if self.cfg.witness:
            self._ask(RENEW, {})

    def _witness_replied(self, replied: WitnessReplied, use: Reaction | None = None) -> None:
        """Every phase takes the witness's reply to the request out (any other one is late:
        ignored): it is recorded, `use`d by the step that asked for it (the phase's step
        names it), and the next request goes out."""
        if not self.witness.answered(replied.purpose):
            return
        reply = replied.reply
        if reply is not None:
            self.witness_info = reply
        if use is not None:
            use(reply, replied.requested_at)
        self._next_request()

    def _on_renewed(self, reply: WitnessReply | None, requested_at: float) -> None:
        if reply is None:
            return
        standby = self._standby()
        if reply.granted:
            self.witness_lease.granted(requested_at, self.cfg.activation_ms)
            if self.phase is Phase.DROPPING_BACKUP and reply.standby is None:
                self._enter(Phase.STANDALONE, "backup lost; the witness knows")
            self._leased()
            self._emit(ConfirmationsChanged())
        elif reply.holder != self.cfg.identity \
                and reply.holder in (None, standby) and not reply.remaining_ms:
            # The witness was away (restarted without its memory, or the pair elected this
            # server while it was unreachable): nobody else holds a lease, and the server
            # it last knew as active, if any, is this server's in-sync backup.
            witness_epoch = reply.epoch
            epoch = self.journal.epoch
            if epoch <= witness_epoch:
                epoch = self.cfg.next_epoch(witness_epoch)
                self._emit(BeginEpoch(epoch))
            self._ask(WitnessPurpose.ADOPT, {"op": "adopt", "standby": standby, "epoch": epoch})
        elif reply.epoch > self.journal.epoch:
            self._emit(Log(ERROR, f"The witness says epoch {reply.epoch} is active "
                                  f"(mine is {self.journal.epoch}): stepping down"))
            self._step_down("the pair moved on to a higher epoch")

    def _leased(self) -> None:
        """Elected with the peer, and now the witness grants the lease: on a renewal it
        still names this server the holder, so it granted the peer nothing since (an
        adoption needs a witness that forgot: docs/ha.md, design limit). The lease grounds
        serving alone from now on, whatever the peer's journal says."""
        if self.phase is Phase.ELECTED:
            self._enter(Phase.STANDALONE, "the witness grants this server the lease")

    def _on_adopted(self, reply: WitnessReply | None, requested_at: float) -> None:
        if reply is not None and reply.granted:
            self.witness_lease.granted(requested_at, self.cfg.activation_ms)
            self._emit(Log(INFO, f"The witness knows this server as active again (epoch "
                                 f"{reply.epoch}, in-sync backup {self._standby()})"))
            self._leased()
            self._emit(ConfirmationsChanged())
        elif reply is not None:
            self._emit(Log(INFO, f"The witness does not take this server as active: "
                                 f"{reply.reason}"))
