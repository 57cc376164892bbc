"""How a server of the replication pair becomes active: the steps of an activation.

A part of `ReplicationMachine` (ha/replication.py; its state in ha/machine_state.py): the query to
the witness, the grant at a new epoch, the journal opened for serving, the renewal after
it, and the election with a connected peer while the witness cannot be reached. Each step
is a value of `Activation.step`; a refused attempt returns to `Activation.back_to`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from pairmq.ha import channel as ch
from pairmq.ha.events import BecomeActive, Log, Send
from pairmq.ha.machine_state import MachineState
from pairmq.ha.messages import WitnessPurpose, WitnessReply
from pairmq.ha.phases import IN_SYNC, Activation, Elected, Phase, Step
from pairmq.ha.states import State

INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR


class ActivationSteps(MachineState):
    def _activate_alone(self) -> None:
        """Started (or left) alone: serve only if this journal is certainly the newest."""
        journal = self.journal
        fresh = self.cfg.role == "primary" and journal.epoch == 0 and journal.appended_seq == 0
        if self.order:
            self._activate("an operator forced it", force=True)
        elif not self.cfg.witness:
            if fresh:
                self._activate("new pair, primary, empty journal")
            else:
                self._enter(Phase.WAITING, "without a witness, a server alone cannot "
                            "know whether its journal is the newest (`pairmq activate` "
                            "forces it)")
        else:
            self._activate("alone: the witness decides", query=True, fresh=fresh)


    def _activate(self, why: str, *, force: bool = False, query: bool = False,
                  fresh: bool = False, won: bool = False, back_to: Phase | None = None) -> None:
        if self._now < self.retry_at:
            return  # a refused attempt: the next one at retry_at (deadline) or a tick
        back = back_to or (self.phase if self.phase is not Phase.DEFERRING else Phase.WAITING)
        # Above both our journal's epoch and any the witness granted (a grant may have
        # gone unused: a server that crashed right after it, or gave it back).
        epoch = self.cfg.next_epoch(max(self.journal.epoch,
                                        self.witness_info.epoch))
        act = Activation(why, Step.GRANT, back, epoch, force, fresh, won)
        self._enter(Phase.ACTIVATING, why, activation=act)
        if not self.cfg.witness:
            self._emit(Log(WARNING, "Activating without a witness: nothing prevents split "
                                    "brain"))
            self._recover(act)
        elif query and not force:
            self._revise(replace(act, step=Step.QUERY), "asking the witness")
            self._ask(WitnessPurpose.ACTIVATION, {"op": "query"})
        else:
            self._ask_grant(act)

    def _ask_grant(self, act: Activation) -> None:
        self._revise(replace(act, step=Step.GRANT), "asking the witness for the lease")
        self._ask(WitnessPurpose.ACTIVATION,
                  {"op": "activate", "epoch": act.epoch, "force": act.force})

    def _recover(self, act: Activation) -> None:
        self._revise(replace(act, step=Step.RECOVER), "opening the journal for serving")
        self._emit(BecomeActive(act.epoch))

    def _activation_refused(self, why: str | None) -> None:
        """The attempt ends without serving; back to where it started (WAITING if that was
        STARTING or the server can no longer follow a peer), to be decided again."""
        act = self.activation
        assert act is not None
        # Not again at once (that would be hundreds of witness requests a second): when
        # the witness says another lease still runs, right after it ends; else a heartbeat.
        remaining = self.witness_info.remaining_ms / 1000
        self.retry_at = self._now + (min(remaining, self.cfg.heartbeat) + 0.001 if remaining
                                     else self.cfg.heartbeat)
        back = act.back_to
        if back in IN_SYNC and not self.connected:
            back = Phase.ORPHANED
        if why is not None:
            back = Phase.WAITING
        self._enter(back, why or "activation refused")

    def _on_activation_reply(self, reply: WitnessReply | None, requested_at: float) -> None:
        act = self.activation
        assert act is not None
        if act.step is Step.QUERY:
            if reply is None:
                peer = self.peer.name if self.connected else None
                if peer and self._forked():
                    # Neither journal grew out of the other's newest epoch: only the
                    # witness knows which history holds confirmed records (seed 36008).
                    why = (f"cannot reach the witness, and this journal and {peer}'s each "
                           "opened an epoch after they went separate ways: only the "
                           "witness can tell which one holds every confirmed message")
                    if act.won:
                        self._emit(Log(WARNING, f"Not activating without the witness: {why}"))
                    self._activation_refused(why)
                    return
                if act.won and self._peer_agrees() and self._won():
                    self._activate_with_peer(act)
                    return
                self._activation_refused("cannot reach the witness" + (
                    f"; {peer} holds the newer journal and activates" if peer
                    else " or the peer"))
                return
            if not self._may_activate(reply, act.fresh,
                                      act.won and (not self.connected or self._won())):
                waiting = act.back_to in (Phase.STARTING, Phase.WAITING)
                self._activation_refused(
                    f"the witness says {reply.holder} was last active in epoch "
                    f"{reply.epoch}: waiting for it rather than serving older data"
                    if waiting else None)
                return
            holder = reply.holder
            if holder not in (None, self.cfg.identity) and self._now < self.promise_until:
                # Taking over from another server: it may still confirm on a promise this
                # server gave before a restart it does not remember (simulator seed 31169).
                self._activation_refused(
                    f"not taking over from {holder} within an activation interval of this "
                    "server's start (it may have promised not to before it restarted)")
                self.retry_at = max(self.retry_at, self.promise_until)
                return
            epoch = self.cfg.next_epoch(max(self.journal.epoch, reply.epoch))
            self._ask_grant(replace(act, epoch=epoch))
        elif act.step is Step.GRANT:
            if reply is None or not reply.granted:
                reason = reply.reason if reply else "the witness is unreachable"
                if self.order:
                    self._emit(Log(INFO, f"Forced activation not granted yet ({reason}): "
                                         "trying again"))
                self._activation_refused(f"not activating: {reason}"
                                         if act.back_to is Phase.STARTING else None)
                return
            self.witness_lease.granted(requested_at, self.cfg.activation_ms)
            if self.connected and self.peer_state.serving:
                # The peer came back serving meanwhile: give the lease back, sync from it.
                self.witness_lease.revoke()
                self._revise(replace(act, step=Step.RELEASE), "giving the grant back")
                self._ask(WitnessPurpose.ACTIVATION,
                          {"op": "release", "epoch": act.epoch, "keep_standby": True})
                return
            self._recover(act)
        elif act.step is Step.RELEASE:
            self._activation_refused(None)
        elif act.step is Step.RENEW:
            if reply is None or not reply.granted:
                reason = reply.reason if reply else "the witness is unreachable"
                self._emit(Log(ERROR, f"Lease not renewed after recovery ({reason}): not "
                                      "serving"))
                self._step_down(f"lease lost while recovering: {reason}")
                return
            self.witness_lease.granted(requested_at, self.cfg.activation_ms)
            self._serve(act)

    def _on_recovered(self, epoch: int) -> None:
        """ACTIVATING: the journal is open for serving (its step RECOVER; at another step,
        the answer to an earlier attempt: ignored)."""
        act = self.activation
        assert act is not None
        if act.step is not Step.RECOVER:
            return
        if act.with_peer:
            if not self._peer_agrees() or not self._election_stands(
                    act.peer_journal, (self.peer.epoch, self.peer.last_seq)):
                self._step_down(f"{self.peer.name} left or took over while this "
                                "server activated without the witness")
                return
            self._serve(act)
        elif self.cfg.witness:
            self._revise(replace(act, step=Step.RENEW), "renewing the lease before serving")
            self._ask(WitnessPurpose.ACTIVATION, {"op": "renew", "standby": None, "epoch": epoch})
        else:
            self._serve(act)

    def _serve(self, act: Activation) -> None:
        self.backup_acked = 0
        self.sync_done_seq = None
        self.order = False
        self.next_renew = self._now + self.cfg.heartbeat
        if act.with_peer:  # until the peer follows: its journal must stay as elected over
            self._enter(Phase.ELECTED, f"{act.why}: elected with {self.peer.name} while the "
                                       f"witness is unreachable; epoch {act.epoch}",
                        elected=Elected(act.peer_journal))
        else:
            self._enter(Phase.STANDALONE, f"{act.why}; epoch {act.epoch}")
        if self.connected:
            self._emit(Send(ch.HEARTBEAT, self.hello(self._now)))

    def _election_stands(self, elected_over: tuple[int, int],
                         says: tuple[int, int]) -> bool:
        """Whether the election with the peer still stands when it says its journal is
        `says` (epoch, last seq): only on the very journal it was taken on. Any other one
        means the peer served meanwhile (it journals its new epoch first), whose records
        this server's journal may lack (simulator seeds 7217, 10715: `Elected`)."""
        if says == elected_over:
            return True
        self._emit(Log(ERROR, f"{self.peer.name}'s journal is at epoch {says[0]}, seq "
                              f"{says[1]}, not at epoch {elected_over[0]}, seq "
                              f"{elected_over[1]} as when this server was elected with "
                              "it: it may have served meanwhile. Stepping down"))
        return False

    def _keep_election(self, says: tuple[int, int]) -> bool:
        """ELECTED: the peer said its journal (a hello, or its synchronisation request);
        step down unless the election still stands. True: it stands, or this server is no
        longer ELECTED (an input's earlier rule in the same step may have left it: the
        simulator finds such seeds)."""
        elected = self.elected
        if elected is None or self._election_stands(elected.peer_journal, says):
            return True
        self._step_down(f"{self.peer.name} served after this server was elected with it")
        return False

    def _peer_agrees(self) -> bool:
        """The peer is connected and serves nothing: it compares the same journals and so
        stays a backup (docs/ha.md, electing without the witness)."""
        return self.connected and self.peer_state in (State.STARTING, State.WAITING)

    def _activate_with_peer(self, act: Activation) -> None:
        """The witness cannot be reached, but the peer is connected and agrees that this
        server holds the newest journal: serve. Receipts still wait for the lease or the
        in-sync backup's promise, so nothing is confirmed until the peer has synchronised
        from this server; a server that cannot see its peer never gets here."""
        epoch = self.cfg.next_epoch(max(self.journal.epoch, self.peer.epoch,
                                        self.witness_info.epoch))
        name = self.peer.name
        self._emit(Log(WARNING, f"Witness unreachable: {name} agrees that this server holds "
                                f"the newest journal, activating without the witness "
                                f"(receipts wait for {name} to be in sync)"))
        self._recover(replace(act, epoch=epoch, with_peer=True,
                              peer_journal=(self.peer.epoch, self.peer.last_seq)))

    def _may_activate(self, info: WitnessReply, fresh: bool, won: bool) -> bool:
        """What the witness remembers decides who may serve without a serving peer."""
        holder, standby = info.holder, info.standby
        witness_epoch = info.epoch
        if holder == self.cfg.identity:
            return True  # the last server granted: nobody confirmed anything after it
        if holder is None and witness_epoch == 0:
            return fresh or won  # a new witness: the newest journal (or the new primary)
        standby_in_sync = standby == self.cfg.identity and witness_epoch >= self.journal.epoch
        if self.connected:
            # The holder is reachable: it activates and we synchronise from it, unless this
            # server won the election against it (its journal is not newer), and the holder
            # named this server its in-sync standby. Then the holder defers to this server
            # while this server would wait for the holder (seed 81279, a failback cut short:
            # both WAITING for ever). Activating then is the standby's rule below with more
            # grounds, and the witness still grants only once the holder's lease ended.
            return won and standby_in_sync
        return standby_in_sync
