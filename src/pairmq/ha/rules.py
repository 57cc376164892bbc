"""The replication machine's rules: its queries, what every phase records of the peer,
serving and stepping down, the backup side, and the helpers its phases' step functions
(ha/steps.py, ha/serving_steps.py) and its decisions (ha/decisions.py, the table `_decide`
walks) apply. `ReplicationMachine` (ha/replication.py) adds the dispatch of inputs to those
step functions; the rules and their safety argument are in ha/replication.py's docstring
and docs/ha.md.
"""

from __future__ import annotations

import logging

from pairmq.ha import channel as ch
from pairmq.ha.activation import ActivationSteps
from pairmq.ha.events import (
    BecomePassive,
    ConfirmationsChanged,
    Effect,
    Log,
    PeerStateChanged,
    Send,
    ServeSync,
    StepDown,
    WipeJournal,
)
from pairmq.ha.handover import HandOverSteps
from pairmq.ha.messages import PeerHello, SeqMessage, SyncRequest
from pairmq.ha.phases import JournalDisk, Phase, SteppingDown
from pairmq.ha.states import State
from pairmq.ha.witnessing import WitnessRequests

SERVING_STATES = (State.ACTIVE, State.STANDALONE)
# Why a backup whose active said "shutdown" stays WAITING, whether that active's last
# heartbeat (WAITING) or the channel's end is heard first.
FAREWELL_HEARD = ("the active server stopped cleanly and failover_on_shutdown is off: "
                  "not taking over")
INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR


class ReplicationRules(ActivationSteps, HandOverSteps, WitnessRequests):
    """The pair under the replication policy (the module's docstring has the rules; the
    state it keeps is declared in ha/machine_state.py)."""

    @property
    def live_stream(self) -> bool:
        """Records appended now go straight to the backup: its synchronisation is done."""
        return self.serving and self.connected and self.sync_done_seq is not None

    def confirmable(self, local: int, current: int, now: float) -> int:
        """Up to which sequence receipts may go out now."""
        if self.phase not in (Phase.STANDALONE, Phase.JOINING, Phase.ACTIVE):
            return current
        if self.cfg.witness and not (self.witness_lease.valid(now) or (
                self.phase is Phase.ACTIVE and self.peer_lease.valid(now))):
            return current
        if self.phase in (Phase.ACTIVE, Phase.JOINING) and self.cfg.synchronous:
            return min(local, self.backup_acked)
        return local

    def deadline(self, now: float) -> float | None:
        """The next instant after `now` something changes without an input: the lease
        running out (serving) or the promise running out (a backup that lost the active)."""
        at = None
        if self.serving and self.cfg.witness:
            at = self._valid_until()
        elif self.phase is Phase.ORPHANED:
            at = max(self.promise_until, self.retry_at)
        elif not self.serving:
            at = self.retry_at
        return at if at is not None and at > now else None

    def hello(self, now: float) -> PeerHello:
        journal = self.journal
        return PeerHello(name=self.cfg.name, identity=self.cfg.identity, role=self.cfg.role,
                         state=self.state, epoch=journal.epoch, last_seq=journal.appended_seq,
                         epochs=tuple(journal.epochs), stomp=self.cfg.stomp,
                         stomp_tls=self.cfg.stomp_tls, oldest=journal.oldest_seq, ts=now,
                         echo=self.peer_echo, in_sync=self.in_sync_with_live,
                         lease=self.serving and self.witness_lease.valid(now))

    def active_address(self, tls: bool = False) -> str | None:
        """The serving peer's STOMP listener (with `tls`, its TLS one), if it serves."""
        if not self.peer_state.serving:
            return None
        return (self.peer.stomp_tls if tls else self.peer.stomp) or None

    def handing_over_to(self, tls: bool = False) -> str | None:
        """The peer's STOMP listener (with `tls`, its TLS one) while handing over to it."""
        if self.hand_over is None:
            return None
        return (self.peer.stomp_tls if tls else self.peer.stomp) or None

    def force_refused(self) -> str | None:
        """Why an operator's force is refused now (None: it is taken)."""
        if self.phase in (Phase.SYNCING, Phase.PASSIVE, Phase.FAILBACK_ASKED):
            active = self.active_address()
            return (f"this server is {self.state.value}, a backup of the active server"
                    f"{f' at {active}' if active else ''}: forcing is for a WAITING server")
        return None

    # ------------------------------------------------------------ inputs

    def tick(self, now: float) -> list[Effect]:
        """Every heartbeat, and at `deadline()`."""
        self._now = now
        if self.phase is Phase.STOPPED:
            return []
        if self.connected:
            self._emit(Send(ch.HEARTBEAT, self.hello(now)))
        if self.serving:
            if self.connected and self.sync_done_seq is not None:
                self._emit(Send(ch.HORIZON, SeqMessage(self.journal.oldest_seq)))
            if not self._expired(now) and self.cfg.witness and now >= self.next_renew \
                    and self.phase is not Phase.HANDING_OVER:
                self.next_renew = now + self.cfg.heartbeat
                self._renew()
            self._emit(ConfirmationsChanged())
        if self.hand_over is not None:
            self._hand_over_progress(now)
        self._promote(now)
        self._decide(now)
        return self._drain()

    def check(self, now: float) -> list[Effect]:
        """At `deadline()`, and before the server reports its state: a lease that ran out
        ends serving at that instant, a promise that ran out lets the backup take over."""
        self._now = now
        if (self.serving and self._expired(now)) or (
                not self.serving and now >= self.retry_at
                and (self.phase is not Phase.ORPHANED or now >= self.promise_until)):
            self._decide(now)
        return self._drain()

    def _expired(self, now: float) -> bool:
        """Without lease and promise nothing is confirmed (confirmable): that is the end of
        serving, reported and carried out at once, unless a peer follows this server (it
        cannot take over: it synchronises from us)."""
        if self.cfg.witness and now >= self._valid_until() and not self._follower():
            self._emit(Log(ERROR, "Lost the witness lease and the backup's promise: not "
                                  "serving any more"))
            self._step_down("lost both the witness and the backup")
            return True
        return False

    def _follower(self) -> bool:
        """The connected peer cannot take over now: it synchronises from this server, or
        (JOINING, HANDING_OVER) is in sync without this server's confirming on it.
        Not in ACTIVE: there the in-sync backup's promise is the lease it counts
        (`_valid_until`), and the channel alone proves nothing. In a partition it stays
        open for an activation interval of silence, while the backup's promise runs out
        and it takes over; the isolated active used to say ACTIVE meanwhile (issue 21)."""
        return self.connected and not self.peer_state.serving \
            and self.phase is not Phase.ACTIVE

    def _follower_gone(self, now: float) -> None:
        """The channel a following peer was on ended: closed (PeerLost), or replaced by a
        new one (PeerConnected; the listener closes the old one without a PeerLost).
        `_follower` holds only on one channel: a SYNCING peer that loses it goes WAITING
        and may be granted the lease by the witness at once (no promise holds it back),
        and a new channel does not say it did not serve meanwhile. So a server that held
        neither lease nor promise, serving only because that peer followed it, steps
        down at this instant, as `_expired` would at the next tick had no new channel
        come first. Simulator seed 98108: the elected primary, paused, read the backup's
        synchronisation request (with the journal elected over, so it left ELECTED) after
        the backup had lost that channel, been granted epoch 10 (below the elected 11)
        and confirmed alone; the closed channel and a new one came in the same burst,
        before any tick, and the primary then served the backup a full copy that wiped
        its epoch 10. The serving phases' steps call it, all but ELECTED's, which keeps
        its own check (`_keep_election`: the peer journals an activation's epoch first, so
        an unchanged journal means it did not serve)."""
        if self.cfg.witness and now >= self._valid_until():
            self._emit(Log(ERROR, "Lost the HA channel the backup followed this server on, "
                                  "without the witness lease or the backup's promise: not "
                                  "serving any more"))
            self._step_down("lost the following peer without lease or promise")

    # ------------------------------------------------------------ the peer
    # What every phase records of the peer; what a phase does about it is its step's.

    def _heard(self, hello: PeerHello) -> bool:
        """A heartbeat: the peer's hello and state. True: the peer stopped serving."""
        self.peer = hello
        return self._set_peer_state(hello.state)

    def _connected(self, hello: PeerHello) -> bool:
        """A new channel (an old one, if any, has ended). True: the peer stopped serving."""
        self.peer = hello
        self.peer_farewell = False
        self.peer_echo = 0.0  # the peer's clock may be another one's now (`_promise`)
        self._emit(Log(INFO, f"Connected to remote server {hello.name} over the HA "
                             "channel"))
        return self._set_peer_state(hello.state)

    def _channel_lost(self, reason: str) -> None:
        self._emit(Log(INFO, f"Lost the HA channel to {self.peer.name}: {reason}"))
        self._set_peer_state(State.DEAD)
        self.sync_done_seq = None

    def _say_hello(self) -> None:
        """This server's hello at once (a new channel, a new phase the peer waits for)."""
        self._emit(Send(ch.HEARTBEAT, self.hello(self._now)))

    def _set_peer_state(self, state: State) -> bool:
        """True: the peer served and now says it does not (nor is it gone): a backup that
        followed it is a backup of nobody (`_peer_stopped_serving`)."""
        if state == self.peer_state:
            return False
        self._emit(PeerStateChanged(self.peer_state.value, state.value))
        stopped = self.peer_state.serving and state not in (State.DEAD, *SERVING_STATES)
        self.peer_state = state
        return stopped

    def _peer_stopped_serving(self) -> None:
        """A backup of nobody: say so (a peer that sees PASSIVE waits for us to follow it),
        and decide again with the peer. A SYNCING request may have arrived after it stopped
        serving (it is then ignored): ask again."""
        self._enter(Phase.WAITING, FAREWELL_HEARD if self.peer_farewell
                    else f"{self.peer.name} stopped serving")

    def _follow_again(self, hello: PeerHello) -> None:
        """A backup on a new channel: synchronise again over it, or, if the peer does not
        serve, be a backup of nobody (a peer that sees PASSIVE would wait for us forever)."""
        if self.peer_state.serving:
            self._enter(Phase.ORPHANED, "a new HA channel: synchronising again over it")
        else:
            self._enter(Phase.WAITING, f"{hello.name} is back and does not serve")

    def _echo(self, hello: PeerHello) -> None:
        """A server that does not serve echoes the serving peer's heartbeat time back: the
        time its promise counts from, on the peer's clock."""
        if self.peer_state.serving:
            self.peer_echo = hello.ts

    def _promise(self, hello: PeerHello, now: float) -> None:
        """An in-sync backup, on a heartbeat of the serving peer: I will not take over for an
        activation interval from now, and I say so by echoing the heartbeat's time (the
        peer counts its lease from it). A heartbeat handled ahead of its turn
        (`HeartbeatAhead`) comes again in its turn, older than the newest echoed: the echo
        never goes back on one channel (the peer's clock is one clock there). The echo is
        sent at once."""
        self.peer_echo = max(self.peer_echo, hello.ts)
        self.promise_until = max(self.promise_until, now + self.cfg.activation)
        # The echo goes back at once rather than with the next heartbeat: the peer's lease
        # runs from the time it echoes, and a heartbeat interval of waiting is a quarter
        # of an activation interval lost (heartbeat 500 ms, activation 2000 ms).
        self._emit(Send(ch.HEARTBEAT, self.hello(now)))

    def _peer_promised(self, hello: PeerHello) -> bool:
        """Serving: the in-sync peer's promise, whatever this server's phase: ACTIVE counts
        on it to confirm, and JOINING or STANDALONE to know the peer still follows
        (`_follower`). True: it promised."""
        if hello.in_sync and hello.echo:
            self.peer_lease.granted(hello.echo, self.cfg.activation_ms)
            return True
        return False

    def _outranked(self) -> None:
        """Serving, after the peer's hello: step down if it serves too and holds more, or if
        its journal went on without this server."""
        if self.peer_state.serving:
            self._split_brain_seen()
        self._newer_peer_seen()

    def _split_brain_seen(self) -> None:
        """Both serving (a partition healed, or no witness): the server holding the witness's
        lease stays, since the witness grants one at a time and the other cannot have
        confirmed anything without this one's promise; then the higher epoch; then the
        primary. (An epoch is not unique when one activation was elected with the peer
        while the witness was away and the other granted by the witness: simulator seed
        1705.)"""
        mine = (self.witness_lease.valid(self._now), self.journal.epoch,
                self.cfg.role == "primary")
        theirs = (self.peer.lease, self.peer.epoch, self.peer.primary)
        if theirs > mine:
            self._emit(Log(ERROR, f"Both servers are serving: {self.peer.name} has "
                                  f"epoch {self.peer.epoch}, higher than mine "
                                  f"({self.journal.epoch}). Stepping down"))
            self._step_down("a server with a higher epoch is active")

    def _newer_peer_seen(self) -> None:
        """A peer whose journal has a higher epoch activated after this server did (epochs
        only grow), so this server was superseded, and the peer may hold records confirmed
        since that this journal lacks: it must not serve them its older history (a peer
        that synchronised from it would lose them). Seen after a pause or a partition that
        outlasted this server's lease while a peer still looked attached. Step down; the
        pair elects the newest journal (docs/ha.md, Epochs). (Called by serving phases'
        steps; `self.serving`: a rule of the same input may have stepped down already.)"""
        if self.serving and self.peer.epoch > self.journal.epoch \
                and not self.witness_lease.valid(self._now):  # a lease: the peer's is older
            self._emit(Log(ERROR, f"{self.peer.name} has epoch {self.peer.epoch}, "
                                  f"higher than mine ({self.journal.epoch}): it took over "
                                  "meanwhile. Stepping down"))
            self._step_down("the peer's journal has a higher epoch")

    # ------------------------------------------------------------ serving

    def _valid_until(self) -> float:
        return max(self.witness_lease.valid_until,
                   self.peer_lease.valid_until if self.backup_in_sync else 0.0)

    def _step_down(self, why: str, then: Phase = Phase.WAITING) -> None:
        """Stop serving (also from the middle of an activation whose role already serves):
        reported and carried out in this step; `then` once the journal is read back."""
        self.witness_lease.revoke()
        self.peer_lease.revoke()
        self.witness.drop_renewals()
        self._emit(StepDown(why))
        self._enter(Phase.STEPPING_DOWN, why, stepping_down=SteppingDown(why, then))

    def _stepped_down(self) -> None:
        """STEPPING_DOWN: the journal is read back."""
        done = self.stepping_down
        assert done is not None
        # The read-back waited for the write in flight: a stalled disk completes writes
        # again (the retired role's writer, closed, no longer says so).
        self.disk = JournalDisk.FLOWING
        self._emit(Log(INFO, "Journal read back after stepping down: a standby again"))
        self._enter(done.then, done.why)

    def _backup_lost(self) -> None:
        """Keep confirming alone only once the witness knows the backup is out of sync."""
        if not self.cfg.witness:
            self._enter(Phase.STANDALONE, "backup lost")
        else:
            self._enter(Phase.DROPPING_BACKUP, "backup lost: telling the witness")
            self._renew()
        self._emit(ConfirmationsChanged())

    def _join(self, seq: int) -> None:
        """The backup caught up with its synchronisation. From now on receipts wait for the
        backup; it is in sync (and may be declared the standby, eligible to take over) only
        once it also holds every record confirmed alone before this instant (simulator
        seed 417)."""
        self.join_target = self.journal.synced_seq
        self._enter(Phase.JOINING, f"backup {self.peer.name} caught up at seq "
                                   f"{seq}; in sync once it holds seq {self.join_target}")

    def _promote(self, now: float) -> None:
        """JOINING becomes ACTIVE once the backup holds everything confirmed alone before,
        and this server has grounds to say ACTIVE: the witness's lease or the backup's
        promise (a lease that ran out while the backup synchronised comes back with the
        backup's first heartbeat in sync, or the next renewal)."""
        if self.phase is not Phase.JOINING or self.backup_acked < self.join_target:
            return
        if self.cfg.witness and not (self.witness_lease.valid(now)
                                     or self.peer_lease.valid(now)):
            return
        self._emit(Log(INFO, f"Backup {self.peer.name} is synchronized with this "
                             f"server (seq {self.backup_acked})"))
        self._enter(Phase.ACTIVE, f"backup {self.peer.name} is in sync")
        self._renew()
        self._emit(ConfirmationsChanged())

    def _serve_sync(self, request: SyncRequest) -> None:
        """Serve the backup what it lacks (a full copy replaces a journal that is not a
        prefix of ours)."""
        self.sync_done_seq = None
        self._emit(ServeSync(request))

    # ------------------------------------------------------------ backup side

    def _request_sync(self) -> None:
        if not self.journal.mirror:
            self._emit(BecomePassive("the peer is active"))
        self.sync_done_seq = None
        self._enter(Phase.SYNCING, f"copying {self.peer.name}'s journal")
        journal = self.journal
        self._emit(Send(ch.SYNC, SyncRequest(journal.epoch, journal.appended_seq,
                                             tuple(journal.epochs))))

    def _on_sync_offered(self, mode: str, first: int) -> None:
        name = self.peer.name
        if mode == "full":
            self._emit(Log(INFO, f"Full synchronisation from {name}: replacing the local "
                                 f"journal (from seq {first})"))
            self._emit(WipeJournal(first))
        else:
            self._emit(Log(INFO, f"Incremental synchronisation from {name} from seq {first}"))

    def _ack_mirror(self, appended: int, synced: int) -> None:
        if self.connected:
            self._emit(Send(ch.ACK, SeqMessage(synced if self.cfg.backup_ack_fsync
                                               else appended)))

    def _check_in_sync(self, now: float) -> None:
        """SYNCING: in sync once the mirror holds what the active said it sent."""
        target = self.sync_done_seq
        if target is None:
            return
        journal = self.journal
        have = journal.synced_seq if self.cfg.backup_ack_fsync else journal.appended_seq
        if have >= target:
            self.promise_until = now + self.cfg.activation
            self._enter(Phase.PASSIVE, f"synchronized with live server "
                                           f"{self.peer.name} at seq {target}")
            self._emit(Send(ch.HEARTBEAT, self.hello(now)))
            # The active joins this backup on an acknowledgement of `target`. One that
            # copied nothing (it restarted already holding every record: an empty
            # incremental synchronisation) would otherwise acknowledge only the next
            # record: an idle active would never count it in sync, nor let it take over.
            self._ack_mirror(journal.appended_seq, journal.synced_seq)

    def _go_heard(self, seq: int | None) -> str:
        """The active handed over at `seq` ("go"): no promise holds this server back, and a
        farewell heard before is over. Returns why, for the step's transition (then
        `_after_go`)."""
        self._emit(Log(INFO, f"{self.peer.name} handed over at seq {seq}: "
                             "taking over"))
        self.promise_until = 0.0
        self.peer_farewell = False
        return f"{self.peer.name} handed over"

    def _after_go(self) -> None:
        # "go" is the peer's last word as active (heard after taking over: a backup
        # that lost its active would say WAITING for an instant)
        self._set_peer_state(State.WAITING)

    def _take_over(self, seq: int | None) -> None:
        """A standby that is not activating heard "go": TAKING_OVER, which activates until
        the witness grants the lease."""
        self._enter(Phase.TAKING_OVER, self._go_heard(seq))  # retried until the witness grants it
        self._after_go()
