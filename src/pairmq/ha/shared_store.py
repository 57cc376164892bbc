"""The shared-store policy's decisions, sans-IO: inputs in, effects out, time a parameter.

Both servers use one journal in a shared directory. The lock on the directory's lock file
(store/sharedlock.py) decides who writes it; the HA channel only tells the backup quickly
that the active is gone (heartbeats stop or the connection closes), carries failback
and shutdown notices, and lets each side report its state. No records cross it.

The driver (server/pair/shared_store.py) feeds `SharedStoreNode.step` with `Tick(now)`,
`PeerConnected(hello)`, `Heartbeat(hello)`, `PeerLost(reason)`, `LockResult(...)`,
`Recovered(epoch, now)`, `FailbackMessage(phase)`, `Force()` and `Shutdown()` (all but
`Tick` and the lock's from ha/events.py, as the replication machine), and carries out the
effects in order: `Send`, `SayHello`, `TryLock`, `VerifyLock`, `ReleaseLock`,
`BecomeActive`, `BecomePassive`, `CloseClients`, `StateChanged`. Its phase changes only by
`_enter`, along TRANSITIONS.

Why two servers never write or confirm at once (V = activation interval, D = drift):

1. The file system's lock manager grants the lock to one holder at a time (store level).
2. A holder writes a journal group or confirms a record at time t only if its last
   successful verification *started* at s with t < s + V(1 - D) (`may_write`,
   `may_confirm`). A verification succeeds only if the lock file at the path is the file
   it locked and still carries its own holder record (store/sharedlock.py, `verify`).
3. A new holder first writes its own record into the lock file, notes the time a, and
   neither replays nor writes the journal before a + V(1 + D) (`WAITING_OUT`).

Suppose the old holder H and the new holder N overlap. Any verification of H that
succeeded read H's record, so it started before N overwrote it, i.e. before a; H's proof
from it ends before a + V(1 - D) on H's clock, hence before a + V(1 + D) on N's. H's
later verifications fail (the file is another one, or the record is N's), so H stops,
and after a time it reports WAITING. A paused H (SIGSTOP) resumes with an expired proof:
its writer and receipts are held until a verification, which fails. The one remaining
window is a process frozen between checking its proof and the write system call itself;
only fencing in the storage (SCSI-3 reservations) closes that (docs/ha.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pairmq.ha import channel as ch
from pairmq.ha.events import (
    BecomeActive,
    BecomePassive,
    CloseClients,
    FailbackMessage,
    Force,
    Heartbeat,
    PeerConnected,
    PeerLost,
    Recovered,
    Send,
    Shutdown,
    StateChanged,
)
from pairmq.ha.messages import Failback, FailbackStep, PeerHello
from pairmq.ha.phases import IllegalTransition
from pairmq.ha.states import State
from pairmq.store.sharedlock import NO_PROOF, Proof, wait_out

TIMER_SLACK_S = 0.005  # a timer may fire this much before its time (uvloop's ms clock)


class Phase(StrEnum):
    """Where the server is; each maps to one reported State (REPORTED)."""

    STARTING = "starting"  # nothing tried yet
    FIRST_LOCK = "first-lock"  # the first lock attempt is in flight
    LOCKING = "locking"  # a later lock attempt in flight
    TAKING_OVER = "taking-over"  # the holder handed the lock over: no waiting out its proof
    SEEKING = "seeking"  # no serving peer, lock busy: alternate lock attempts and reconnects
    BACKUP = "backup"  # the serving peer is connected: wait for it to go
    FAILBACK_ASKED = "failback-asked"  # a primary backup that asked for its place back
    HELD_BACK = "held-back"  # the active stopped cleanly without failover: wait for it
    DEFERRING = "deferring"  # handed the lock over to the peer: let it take it
    WAITING_OUT = "waiting-out"  # holding the lock; the previous holder's proof may still run
    RECOVERING = "recovering"  # holding the lock, replaying the journal
    PROVING = "proving"  # replayed, but the proof ran out meanwhile: verify before serving
    STANDALONE = "standalone"  # serving, no backup connected
    ACTIVE = "active"  # serving, backup connected
    STOPPED = "stopped"


REPORTED: dict[Phase, State] = {
    Phase.STARTING: State.STARTING, Phase.FIRST_LOCK: State.STARTING, Phase.LOCKING: State.WAITING,
    Phase.TAKING_OVER: State.WAITING,
    Phase.SEEKING: State.WAITING, Phase.BACKUP: State.PASSIVE,
    Phase.FAILBACK_ASKED: State.PASSIVE,
    Phase.HELD_BACK: State.WAITING, Phase.DEFERRING: State.PASSIVE,
    Phase.WAITING_OUT: State.STARTING, Phase.RECOVERING: State.STARTING,
    Phase.PROVING: State.STARTING,
    Phase.STANDALONE: State.STANDALONE, Phase.ACTIVE: State.ACTIVE,
    Phase.STOPPED: State.WAITING,
}
HOLDING = (Phase.WAITING_OUT, Phase.RECOVERING, Phase.PROVING, Phase.STANDALONE, Phase.ACTIVE)
SERVING = (Phase.STANDALONE, Phase.ACTIVE)
BACKING = (Phase.BACKUP, Phase.FAILBACK_ASKED)  # the serving peer is connected
TRYING = (Phase.FIRST_LOCK, Phase.LOCKING, Phase.TAKING_OVER)


def _to(*phases: Phase) -> frozenset[Phase]:
    return frozenset(phases)


_P = Phase
# Every phase change the shared-store machine makes, and nothing else (`_enter` raises on
# any other). Read a row as "from here, on these grounds, to there". Every phase may stop.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # the first tick tries the lock
    _P.STARTING: _to(_P.FIRST_LOCK, _P.STOPPED),
    # acquired (wait out the previous holder's proof); busy: back up the serving peer, or
    # seek the lock
    _P.FIRST_LOCK: _to(_P.WAITING_OUT, _P.BACKUP, _P.SEEKING, _P.STOPPED),
    _P.LOCKING: _to(_P.WAITING_OUT, _P.BACKUP, _P.SEEKING, _P.STOPPED),
    _P.TAKING_OVER: _to(_P.WAITING_OUT, _P.BACKUP, _P.SEEKING, _P.STOPPED),
    # try the lock (a tick, an operator); the peer serves; the holder's "go"
    _P.SEEKING: _to(_P.LOCKING, _P.BACKUP, _P.TAKING_OVER, _P.STOPPED),
    # failback asked; the peer stopped serving; lost it (try the lock); its "go"; its
    # clean stop without failover
    _P.BACKUP: _to(_P.FAILBACK_ASKED, _P.SEEKING, _P.LOCKING, _P.TAKING_OVER, _P.HELD_BACK,
                   _P.STOPPED),
    _P.FAILBACK_ASKED: _to(_P.SEEKING, _P.LOCKING, _P.TAKING_OVER, _P.HELD_BACK, _P.STOPPED),
    # the peer serves again; an operator's force; its "go"
    _P.HELD_BACK: _to(_P.BACKUP, _P.LOCKING, _P.TAKING_OVER, _P.STOPPED),
    # the peer did not take the lock; it serves; lost it; its "go" back
    _P.DEFERRING: _to(_P.SEEKING, _P.BACKUP, _P.LOCKING, _P.TAKING_OVER, _P.STOPPED),
    # waited out: replay; the lock not proven
    _P.WAITING_OUT: _to(_P.RECOVERING, _P.SEEKING, _P.STOPPED),
    # replayed: serve, or prove the lock first; the lock not proven
    _P.RECOVERING: _to(_P.STANDALONE, _P.ACTIVE, _P.PROVING, _P.SEEKING, _P.STOPPED),
    _P.PROVING: _to(_P.STANDALONE, _P.ACTIVE, _P.SEEKING, _P.STOPPED),
    # a backup connected; the lock not proven
    _P.STANDALONE: _to(_P.ACTIVE, _P.SEEKING, _P.STOPPED),
    # the backup lost; the lock not proven; handed over (failback, failover on shutdown)
    _P.ACTIVE: _to(_P.STANDALONE, _P.SEEKING, _P.DEFERRING, _P.STOPPED),
    # a second shutdown changes nothing
    _P.STOPPED: _to(_P.STOPPED),
}


class LockOutcome(StrEnum):
    ACQUIRED = "acquired"
    BUSY = "busy"
    CHECKED = "checked"  # a verification of a held lock: see `proof`


# ------------------------------------------------------------ inputs (and ha/events.py's)


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class LockResult:
    outcome: LockOutcome
    now: float  # when the attempt finished (ACQUIRED: the record was on disk by then)
    proof: Proof = NO_PROOF  # ACQUIRED, CHECKED: store.sharedlock.verify's verdict
    detail: str = ""  # BUSY: who holds it, or the error
    # ACQUIRED: when every proof of the previous holder has surely ended, if the lock
    # knows (a database lease is granted only once expired: at once); None: wait it out
    ready_at: float | None = None
    # BUSY: when the holder's hold ends unless renewed, if the lock knows (a database
    # lease's expiry): the next attempt then, if sooner than a heartbeat on
    retry_at: float | None = None


Input = Tick | PeerConnected | Heartbeat | PeerLost | LockResult | Recovered | FailbackMessage \
    | Force | Shutdown

# ------------------------------------------------------------ effects (and ha/events.py's)


@dataclass(frozen=True)
class TryLock:
    pass


@dataclass(frozen=True)
class VerifyLock:
    pass


@dataclass(frozen=True)
class ReleaseLock:
    pass


@dataclass(frozen=True)
class SayHello:
    """Send this server's hello to the peer (the driver's `StoreHello`, ha/messages.py),
    with the state and epoch of the instant it goes out."""


Effect = Send | SayHello | TryLock | VerifyLock | ReleaseLock | BecomeActive | BecomePassive \
    | CloseClients | StateChanged


@dataclass(frozen=True)
class Settings:
    role: str  # "primary" | "backup"
    heartbeat: float  # seconds
    activation: float  # V: how long a proof holds; silence after which the peer is gone
    allow_failback: bool = True
    failover_on_shutdown: bool = False


def _serving(hello: PeerHello | None) -> bool:
    return hello is not None and hello.state.serving


@dataclass
class SharedStoreNode:
    settings: Settings
    phase: Phase = Phase.STARTING
    now: float = 0.0
    peer: PeerHello | None = None  # the connected peer's latest hello
    proof: Proof = NO_PROOF
    epoch: int = 0
    next_try: float = 0.0  # SEEKING: next lock attempt
    tried_at: float = 0.0  # when the last lock attempt went out
    ready_at: float = 0.0  # WAITING_OUT: when the previous holder's proof has surely ended
    verify_due: float = 0.0
    verifying: bool = False  # a VerifyLock is out (one at a time)
    deferred_until: float = 0.0
    _out: list[Effect] = field(default_factory=list)

    # ------------------------------------------------------------ queries

    @property
    def state(self) -> State:
        return REPORTED[self.phase]

    def may_write(self, now: float) -> bool:
        """The journal writer's guard. Also true while a server that stops serving drains
        its journal before releasing the lock (its proof still runs, verified or not)."""
        return self.phase is not Phase.WAITING_OUT and self.proof.valid(now)

    def may_confirm(self, now: float) -> bool:
        return self.phase in SERVING and self.proof.valid(now)

    def may_read_ahead(self) -> bool:
        """The journal may be read ahead of a takeover (store/reading.py) whenever this
        server neither replays nor serves it: a takeover's replay goes on from that reading,
        and waiting out the previous holder's proof is time to read in."""
        return self.phase not in (Phase.RECOVERING, Phase.PROVING, *SERVING, Phase.STOPPED)

    def force_refusal(self) -> str | None:
        """`pairmq activate` only makes a WAITING server try the lock now (even after the
        active stopped cleanly); it cannot take a lock another server holds."""
        if self.phase in (*BACKING, Phase.DEFERRING):
            return "this server is a PASSIVE backup of the active server: forcing is for a " \
                   "WAITING server"
        return None

    # ------------------------------------------------------------ the step

    def step(self, event: Input) -> list[Effect]:
        self._out = []
        match event:
            case Tick(now):
                self.now = max(self.now, now)
                self._tick()
            case PeerConnected(hello):
                self.peer = hello
                self._peer_changed(f"{hello.name} connected")
                self._heartbeat()
            case Heartbeat(hello):
                if self.peer is not None:
                    self.peer = hello
                    self._peer_changed(f"{hello.name} is {hello.state.value}")
            case PeerLost(reason):
                self.peer = None
                self._peer_lost(reason)
            case LockResult():
                self.now = max(self.now, event.now)
                self._lock_result(event)
            case Recovered(epoch, now):  # ha/events.py
                self.now = max(self.now, now)
                self.epoch = epoch
                if self.phase is Phase.RECOVERING:
                    if self._proof_lasts(self.now):
                        self._serve(f"journal replayed; epoch {epoch}")
                    else:
                        # A long replay outlasted the proof (a million messages, a busy
                        # machine): the lock is still ours unless a verification says not.
                        self._enter(Phase.PROVING, "the journal replay outlasted the "
                                                   "proof: verifying the lock before serving")
                        self._verify_now()
            case FailbackMessage(step):
                self._failback(step)
            case Force():
                if self.phase in (Phase.SEEKING, Phase.HELD_BACK):
                    self._try_lock("an operator forced it")
            case Shutdown():
                self._shutdown()
        if self.phase is Phase.BACKUP and self._wants_failback():
            self._enter(Phase.FAILBACK_ASKED, "asking to fail back")  # PASSIVE all the same
            self._out.append(Send(ch.FAILBACK, Failback(FailbackStep.REQUEST)))
        return self._out

    # ------------------------------------------------------------ steps

    def _enter(self, phase: Phase, why: str) -> None:
        """The one way the phase changes: a transition TRANSITIONS allows (any other
        raises); a change of the reported state is announced, and said to the peer."""
        if phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(self.phase, phase, why)
        old = self.state
        self.phase = phase
        if self.state != old:
            self._out.append(StateChanged(old.value, self.state.value, why))
            self._heartbeat()

    def _heartbeat(self) -> None:
        if self.peer is not None and self.phase is not Phase.STOPPED:
            self._out.append(SayHello())

    def _tick(self) -> None:
        now = self.now
        if self.phase is Phase.STARTING:
            self._enter(Phase.FIRST_LOCK, "trying the lock")
            self._lock_attempt()
            return
        if self.phase in SERVING and not self.proof.valid(now):
            reason = self.proof.reason or "no verification succeeded in time"
            self._lose(f"cannot prove it holds the lock any more ({reason})")
            return
        # Holding the lock but neither serving nor confirming yet (waiting out, replaying,
        # proving): an expired proof only means verifying again before serving.
        if self.phase is Phase.WAITING_OUT and self._due(self.ready_at):
            self._enter(Phase.RECOVERING, "holding the lock: replaying the journal")
            self._out.append(BecomeActive(None))
        if self.phase in HOLDING and self._due(self.verify_due):
            self._verify_now()
        elif self.phase is Phase.SEEKING and self._due(self.next_try) and \
                not _serving(self.peer):
            self._try_lock("the lock may be free")
        elif self.phase is Phase.DEFERRING and now >= self.deferred_until:
            self._enter(Phase.SEEKING, "the peer did not take the lock over")
        self._heartbeat()

    def _due(self, at: float) -> bool:
        """`at` has come, give or take a timer firing a moment early (it would otherwise
        wait for the next tick, a heartbeat later)."""
        return self.now >= at - TIMER_SLACK_S

    def _proof_lasts(self, now: float) -> bool:
        """Enough proof left to start serving on: until the next verification is due and
        has had a heartbeat to complete (serving on a proof about to lapse would only
        give the lock up again at the next tick)."""
        return self.proof.valid(now + self.settings.heartbeat)

    def _verify_now(self) -> None:
        if not self.verifying:
            self.verifying = True
            # the next one a heartbeat after this one *starts*: counted from its result,
            # a tick a moment early would skip it, verifying every other heartbeat only
            self.verify_due = self.now + self.settings.heartbeat
            self._out.append(VerifyLock())

    def _try_lock(self, why: str, phase: Phase = Phase.LOCKING) -> None:
        self._enter(phase, why)
        self._lock_attempt()

    def _lock_attempt(self) -> None:
        self.tried_at = self.now  # the next one a heartbeat after this starts (as above)
        self._out.append(TryLock())

    def _lock_result(self, result: LockResult) -> None:
        s = self.settings
        if result.outcome is LockOutcome.CHECKED:
            self.verifying = False
            if self.phase not in HOLDING:
                return
            if not result.proof.until:
                self._lose(f"cannot prove it holds the lock: {result.proof.reason}")
                return
            self.proof = Proof(max(self.proof.until, result.proof.until))
            if self.phase is Phase.PROVING:
                if self._proof_lasts(result.now):
                    self._serve(f"journal replayed and the lock verified; epoch {self.epoch}")
                else:
                    self._verify_now()  # it was slow (the process was busy): once more
            return
        if self.phase not in TRYING:
            if result.outcome is LockOutcome.ACQUIRED:
                self._out.append(ReleaseLock())  # stopped or changed course meanwhile
            return
        if result.outcome is LockOutcome.ACQUIRED:
            self.proof = result.proof
            self.verify_due = self.tried_at + s.heartbeat
            self.verifying = False
            handed_over = self.phase is Phase.TAKING_OVER  # the holder released it itself
            self.ready_at = result.now if handed_over else \
                result.ready_at if result.ready_at is not None else \
                wait_out(result.now, s.activation)
            self._enter(Phase.WAITING_OUT, "acquired the lock of the shared store")
            if result.now >= self.ready_at:  # nothing to wait out: replay now, not a tick on
                self._enter(Phase.RECOVERING, "holding the lock: replaying the journal")
                self._out.append(BecomeActive(None))
            return
        self.next_try = self.tried_at + s.heartbeat
        if result.retry_at is not None:  # the driver ticks then (server/pair/shared_store.py)
            self.next_try = min(self.next_try, max(result.retry_at, result.now))
        if _serving(self.peer):
            self._enter(Phase.BACKUP, f"{self._peer_name()} holds the lock and serves")
        else:
            self._enter(Phase.SEEKING, f"the lock is held by {result.detail or 'another server'}")

    def _serve(self, why: str) -> None:
        if self.peer is not None:
            self._enter(Phase.ACTIVE, f"{why}; backup {self._peer_name()} connected")
        else:
            self._enter(Phase.STANDALONE, why)

    def _lose(self, why: str) -> None:
        """Stop at once: not serving, clients closed, the journal left alone, lock let go."""
        self.proof = NO_PROOF
        self.verifying = False
        self.next_try = self.now + self.settings.heartbeat
        self._enter(Phase.SEEKING, why)
        self._out += [CloseClients(f"this server stopped serving: {why}", None),
                      BecomePassive(why), ReleaseLock()]

    def _peer_changed(self, why: str) -> None:
        serving = _serving(self.peer)
        if self.phase is Phase.STANDALONE:
            self._enter(Phase.ACTIVE, f"backup {self._peer_name()} connected")
        elif self.phase in (Phase.SEEKING, Phase.HELD_BACK, Phase.DEFERRING) and serving:
            self._enter(Phase.BACKUP, f"{self._peer_name()} serves: backing it up")
        elif self.phase in BACKING and not serving:
            self.next_try = self.now
            self._enter(Phase.SEEKING, f"{why}: the lock may be free")

    def _wants_failback(self) -> bool:
        return (self.settings.role == "primary" and self.settings.allow_failback
                and self.peer is not None and self.peer.role == "backup")

    def _peer_lost(self, reason: str) -> None:
        if self.phase is Phase.ACTIVE:
            self._enter(Phase.STANDALONE, f"backup lost: {reason}")
        elif self.phase in (*BACKING, Phase.DEFERRING):
            self._try_lock(f"lost the active server: {reason}")

    def _failback(self, step: FailbackStep) -> None:
        if step is FailbackStep.REQUEST and self.phase is Phase.ACTIVE:
            self._hand_over(f"failing back to {self._peer_name()} (allow_failback)")
        elif step is FailbackStep.GO and self.phase in (*BACKING, Phase.SEEKING, Phase.HELD_BACK,
                                              Phase.DEFERRING):
            self._try_lock(f"{self._peer_name()} handed the shared store over",
                           Phase.TAKING_OVER)
        elif step is FailbackStep.SHUTDOWN and self.phase in BACKING:
            self._enter(Phase.HELD_BACK, "the active server stopped cleanly and "
                                         "failover_on_shutdown is off: not taking over")

    def _hand_over(self, why: str) -> None:
        """Stop serving, let the journal reach the disk, release the lock, tell the peer."""
        stomp = self.peer.stomp if self.peer is not None else ""
        self._out.append(CloseClients(f"this server is handing over to {stomp or 'its peer'} "
                                      f"({why})", stomp or None))
        self.deferred_until = self.now + 4 * self.settings.activation
        self._enter(Phase.DEFERRING, why)
        self._out += [BecomePassive(why, drain=True), ReleaseLock(),
                      Send(ch.FAILBACK, Failback(FailbackStep.GO))]

    def _shutdown(self) -> None:
        was = self.phase
        if was in SERVING and self.settings.failover_on_shutdown and self.peer is not None:
            self._hand_over("shutting down (failover_on_shutdown = true)")
            self._enter(Phase.STOPPED, "shutting down")
            return
        if was in SERVING and self.peer is not None:
            # Tell the peer first: it must not take the lock released below.
            self._out.append(Send(ch.FAILBACK, Failback(FailbackStep.SHUTDOWN)))
        self._enter(Phase.STOPPED, "shutting down")
        if was in SERVING:
            self._out.append(BecomePassive("shutting down", drain=True))
        if was in HOLDING:
            self._out.append(ReleaseLock())

    def _peer_name(self) -> str:
        return self.peer.name if self.peer is not None and self.peer.name else "the peer"
