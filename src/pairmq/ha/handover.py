"""How the active server of the replication pair hands over and stops.

A part of `ReplicationMachine` (ha/replication.py; its state in ha/machine_state.py): failback,
failover on shutdown and on a stalled disk (close clients, let the backup catch up, give
the lease back keeping the backup as standby, say "go"), and a stop that gives the lease
back.

A stalled disk (issue 35): the journal's thread has had a write in flight past [store]
stall_timeout_ms. The in-sync backup holds every record this server appended (they are
streamed to it as they are appended, before this server's own fsync, and it acknowledges
after its own), so it can serve everything confirmed, and more. So an ACTIVE server hands
over to it at once, as a failback does, without waiting for heartbeats to lapse (they do
not: the event loop is well). Stepping down then reads the journal back once the write in
flight completes, so the server rejoins as a backup only when its disk works again.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from pairmq.ha import channel as ch
from pairmq.ha.events import CloseClients, ConfirmationsChanged, Log, Persist, Send
from pairmq.ha.machine_state import MachineState
from pairmq.ha.messages import Failback, FailbackStep, WitnessPurpose, WitnessReply
from pairmq.ha.phases import HandOver, HandOverStep, JournalDisk, Phase

INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR


class HandOverSteps(MachineState):
    def _start_hand_over(self, why: str, now: float, stopping: bool) -> None:
        """Failback or failover on shutdown: stop serving, let the backup catch up, hand
        over. The target is read at the next input, after `Persist` was carried out."""
        self._enter(Phase.HANDING_OVER, why,
                    hand_over=HandOver(why, HandOverStep.DRAINING,
                                       now + self.cfg.sync_timeout, stopping))
        self.witness.drop_renewals()
        self._emit(Log(INFO, f"Handing over to {self.peer.name}: {why}"))
        self._emit(CloseClients(f"this server is handing over to {self.peer.stomp} ({why})",
                                self.peer.stomp or None))
        self._emit(Persist())
        self._emit(ConfirmationsChanged())

    def _journal_stalled(self, waited: float) -> None:
        """The driver says the journal's disk stalled. ACTIVE hands over (the table of
        ha/decisions.py); any other phase says what the stall means there."""
        self.disk = JournalDisk.STALLED
        if self.phase is Phase.ACTIVE or self.phase is Phase.HANDING_OVER:
            return
        if self.serving:
            self._emit(Log(WARNING, f"The journal has not completed a write for {waited:.1f} s "
                                    "and no backup is in sync to hand over to: clients wait "
                                    "for the disk"))
        elif self.phase in (Phase.SYNCING, Phase.PASSIVE, Phase.FAILBACK_ASKED):
            self._emit(Log(WARNING, f"This backup's journal has not completed a write for "
                                    f"{waited:.1f} s: the active server drops it from "
                                    "synchronous replication; it synchronises again once its "
                                    "disk completes writes"))

    def _journal_flowing(self) -> None:
        self.disk = JournalDisk.FLOWING

    def _hand_over_stalled(self, now: float) -> None:
        self._start_hand_over("the journal's disk stopped completing writes "
                              "(stall_timeout_ms)", now, stopping=False)

    def _hand_over_progress(self, now: float) -> None:
        ho = self.hand_over
        if ho is None or ho.step is not HandOverStep.DRAINING:
            return
        if ho.target is None:
            ho = self.hand_over = replace(ho, target=self.journal.appended_seq)
        assert ho.target is not None
        if self.backup_acked >= ho.target:
            self.hand_over = replace(ho, step=HandOverStep.RELEASING)
            if self.cfg.witness:
                self._ask(WitnessPurpose.RELEASE, {"op": "release", "keep_standby": True})
            else:
                self._handed_over()
        elif now > ho.deadline:
            self._emit(Log(WARNING, f"Hand-over abandoned: the backup did not confirm seq "
                                    f"{ho.target}"))
            self._enter(Phase.ACTIVE, f"hand-over abandoned: the backup did not confirm seq "
                                      f"{ho.target}")
            if ho.stopping:
                self._stop_serving()

    def _handed_over(self) -> None:
        ho = self.hand_over
        assert ho is not None and ho.target is not None
        self.witness_lease.revoke()
        self._emit(Send(ch.FAILBACK, Failback(FailbackStep.GO, ho.target)))
        if ho.stopping:
            self._enter(Phase.STOPPED, f"{ho.why}: handed over")
            return
        self._step_down(ho.why, then=Phase.DEFERRING)

    def _released(self, reply: WitnessReply | None, requested_at: float) -> None:
        """HANDING_OVER: the witness answered the release (or could not be reached): say
        "go"."""
        self._handed_over()

    def _lease_given_back(self, reply: WitnessReply | None, requested_at: float) -> None:
        """STOPPING: the witness answered the release (or could not be reached): stop."""
        self._enter(Phase.STOPPED, "the lease is given back")

    def _shut_down_serving(self) -> None:
        """Shutdown while serving, without a hand-over: the peer hears the farewell, and does
        not take this server's silence for a failure (FAREWELL_HEARD)."""
        if self.connected:
            self._emit(Send(ch.FAILBACK, Failback(FailbackStep.SHUTDOWN)))
        self._stop_serving()

    def _stop_after_hand_over(self) -> None:
        """Shutdown while handing over: the process ends once it is handed over."""
        assert self.hand_over is not None
        self.hand_over = replace(self.hand_over, stopping=True)

    def _stop_serving(self) -> None:
        """Give the lease back (the backup waits for this server: no standby kept)."""
        self.witness.clear()
        if self.cfg.witness:
            self._enter(Phase.STOPPING, "stopping: giving the lease back")
            self._ask(WitnessPurpose.STOP, {"op": "release", "keep_standby": False})
        else:
            self._enter(Phase.STOPPED, "stopping")
