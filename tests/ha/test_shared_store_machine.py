"""The shared-store machine in scripted scenarios: inputs in, effects out, no I/O, no clock."""

from __future__ import annotations

from pairmq.ha import channel as ch
from pairmq.ha import shared_store as m
from pairmq.ha.messages import FailbackStep, PeerHello
from pairmq.ha.states import State
from pairmq.store.sharedlock import Proof, fresh_proof, wait_out

HB, V = 0.1, 0.4
PEER_ACTIVE = {"name": "primary", "role": "primary", "state": "ACTIVE", "stomp": "h:1"}
PEER_BACKUP = {"name": "backup", "role": "backup", "state": "WAITING", "stomp": "h:2"}

wire_hello = PeerHello.from_wire  # a hello as the channel carries it


def node(role: str = "primary", **kw) -> m.SharedStoreNode:
    return m.SharedStoreNode(m.Settings(role=role, heartbeat=HB, activation=V, **kw))


def kinds(effects: list[m.Effect]) -> list[type]:
    return [type(e) for e in effects]


def on_the_wire(effects: list[m.Effect]) -> list[object]:
    """The effects, each `Send` as (kind, what it says on the wire)."""
    return [(e.kind, e.payload.to_wire()) if isinstance(e, m.Send) else e for e in effects]


def acquired(n: m.SharedStoreNode, now: float) -> list[m.Effect]:
    return n.step(m.LockResult(m.LockOutcome.ACQUIRED, now, fresh_proof(now, V)))


def serving(n: m.SharedStoreNode, now: float = 0.0) -> float:
    """Drive a fresh node to serving; returns the time it serves at."""
    assert kinds(n.step(m.Tick(now))) == [m.TryLock]
    acquired(n, now)
    assert n.state is State.STARTING and not n.may_write(now)
    n.step(m.LockResult(m.LockOutcome.CHECKED, now + V / 2, fresh_proof(now + V / 2, V)))
    t = wait_out(now, V)
    n.step(m.LockResult(m.LockOutcome.CHECKED, t, fresh_proof(t, V)))
    assert m.BecomeActive(None) in n.step(m.Tick(t))
    n.step(m.Recovered(1))
    return t


def test_the_first_holder_waits_out_any_earlier_proof_then_replays_and_serves() -> None:
    n = node()
    assert n.state is State.STARTING
    assert kinds(n.step(m.Tick(0.0))) == [m.TryLock]
    acquired(n, 0.0)
    n.step(m.LockResult(m.LockOutcome.CHECKED, V / 2, fresh_proof(V / 2, V)))
    assert m.BecomeActive(None) not in n.step(m.Tick(V))  # a previous holder may still write
    assert not n.may_confirm(V) and not n.may_write(V)
    t = wait_out(0.0, V)
    n.step(m.LockResult(m.LockOutcome.CHECKED, t, fresh_proof(t, V)))
    effects = n.step(m.Tick(t))
    assert m.BecomeActive(None) in effects and n.state is State.STARTING
    assert n.may_write(t) and not n.may_confirm(t)  # the epoch record, not receipts
    effects = n.step(m.Recovered(7))
    assert m.StateChanged(State.STARTING, State.STANDALONE, "journal replayed; epoch 7") \
        in effects
    assert n.may_confirm(t) and n.epoch == 7


def test_a_lock_that_says_no_earlier_proof_runs_is_replayed_at_once() -> None:
    """A database lease is granted only once expired, after the old holder's renewals:
    its `ready_at` is the acquisition itself, and the node does not wait out V(1 + D)."""
    n = node()
    n.step(m.Tick(0.0))
    effects = n.step(m.LockResult(m.LockOutcome.ACQUIRED, 0.01, fresh_proof(0.0, V),
                                  ready_at=0.01))
    assert m.BecomeActive(None) in effects  # at once, not at the next tick
    assert n.may_write(0.02)


def test_a_lock_that_says_when_its_holder_expires_is_tried_again_then() -> None:
    backup = node("backup")
    backup.step(m.Tick(0.0))
    backup.step(m.LockResult(m.LockOutcome.BUSY, 0.01, detail="primary", retry_at=0.03))
    assert backup.next_try == 0.03
    tried = 0.03 - 0.001
    assert m.TryLock() in backup.step(m.Tick(tried))  # a timer a moment early
    backup.step(m.LockResult(m.LockOutcome.BUSY, 0.04, detail="primary", retry_at=9.0))
    assert backup.next_try == tried + HB  # never later than a heartbeat on


def test_verifications_and_lock_attempts_come_every_heartbeat_from_when_they_start() -> None:
    """A result that comes back a little after the tick that asked for it does not push
    the next one past the next tick (which would verify, or try, every other heartbeat)."""
    n = node()
    t = serving(n)  # a verification went out at t
    for k in range(1, 4):
        n.step(m.LockResult(m.LockOutcome.CHECKED, t + (k - 1) * HB + 0.01,
                            fresh_proof(t + (k - 1) * HB, V)))
        assert kinds(n.step(m.Tick(t + k * HB))) == [m.VerifyLock]
    backup = node("backup")
    backup.step(m.Tick(0.0))
    backup.step(m.LockResult(m.LockOutcome.BUSY, 0.01, detail="primary"))
    assert m.TryLock() in backup.step(m.Tick(HB))


def test_a_busy_lock_with_a_serving_peer_makes_a_passive_backup_that_takes_over_on_loss() -> None:
    n = node("backup")
    n.step(m.Tick(0.0))
    n.step(m.PeerConnected(wire_hello(PEER_ACTIVE)))
    n.step(m.LockResult(m.LockOutcome.BUSY, 0.01, detail="primary"))
    assert n.state is State.PASSIVE
    assert m.TryLock() not in n.step(m.Tick(1.0))  # never competes with a serving peer
    effects = n.step(m.PeerLost("closed"))
    assert m.TryLock() in effects and n.state is State.WAITING


def test_without_the_peer_the_backup_alternates_lock_attempts_and_reconnects() -> None:
    n = node("backup")
    n.step(m.Tick(0.0))
    n.step(m.LockResult(m.LockOutcome.BUSY, 0.0, detail="primary"))
    assert n.state is State.WAITING
    assert m.TryLock() not in n.step(m.Tick(HB / 2))
    assert m.TryLock() in n.step(m.Tick(HB))
    n.step(m.LockResult(m.LockOutcome.BUSY, HB, detail="primary"))
    n.step(m.PeerConnected(wire_hello(PEER_ACTIVE)))  # the reconnection won this time
    assert n.state is State.PASSIVE


def test_a_failed_verification_stops_serving_at_once() -> None:
    n = node()
    t = serving(n)
    effects = n.step(m.LockResult(m.LockOutcome.CHECKED, t + HB,
                                  Proof(0.0, "the lock file was removed")))
    assert n.state is State.WAITING and not n.may_confirm(t + HB) and not n.may_write(t + HB)
    assert kinds(effects)[0] is m.StateChanged
    assert {m.CloseClients, m.BecomePassive, m.ReleaseLock} <= set(kinds(effects))
    assert "the lock file was removed" in effects[0].why


def test_an_expired_proof_stops_confirming_before_any_tick_and_reports_waiting_next() -> None:
    """A server paused past its proof (SIGSTOP) confirms and writes nothing when it resumes,
    whatever runs first; the first tick reports it."""
    n = node()
    t = serving(n)
    until = n.proof.until
    assert n.may_confirm(until - 0.001)
    assert not n.may_confirm(until) and not n.may_write(until)
    effects = n.step(m.Tick(until + 5.0))
    assert n.state is State.WAITING and m.ReleaseLock() in effects
    assert t < until


def test_a_late_good_verification_does_not_extend_past_its_own_start() -> None:
    n = node()
    t = serving(n)
    n.step(m.LockResult(m.LockOutcome.CHECKED, t + 3 * V, fresh_proof(t, V)))
    assert not n.may_confirm(t + 3 * V)


def test_the_backup_connecting_makes_active_and_leaving_makes_standalone() -> None:
    n = node()
    serving(n)
    n.step(m.PeerConnected(wire_hello(PEER_BACKUP)))
    assert n.state is State.ACTIVE
    n.step(m.PeerLost("no heartbeat"))
    assert n.state is State.STANDALONE


def test_failback_hands_the_lock_over_after_the_drain_and_the_primary_skips_the_wait() -> None:
    backup = node("backup")
    serving(backup)
    backup.step(m.PeerConnected(wire_hello({**PEER_BACKUP, "name": "primary", "role": "primary"})))
    primary = node("primary")
    primary.step(m.Tick(0.0))
    primary.step(m.PeerConnected(wire_hello({**PEER_ACTIVE, "name": "backup", "role": "backup"})))
    effects = primary.step(m.LockResult(m.LockOutcome.BUSY, 0.0))
    assert (ch.FAILBACK, {"phase": "request"}) in on_the_wire(effects)
    effects = backup.step(m.FailbackMessage(FailbackStep.REQUEST))
    order = kinds(effects)
    assert order.index(m.BecomePassive) < order.index(m.ReleaseLock) < \
        on_the_wire(effects).index((ch.FAILBACK, {"phase": "go"}))
    assert backup.state is State.PASSIVE and not backup.may_confirm(backup.now)
    assert m.TryLock() in primary.step(m.FailbackMessage(FailbackStep.GO))
    assert m.BecomeActive(None) in acquired(primary, 5.0)  # at once, not a tick later


def test_a_clean_stop_without_failover_holds_the_backup_back_until_forced() -> None:
    active = node()
    serving(active)
    active.step(m.PeerConnected(wire_hello(PEER_BACKUP)))
    effects = active.step(m.Shutdown())
    assert on_the_wire(effects).index((ch.FAILBACK, {"phase": "shutdown"})) < \
        effects.index(m.ReleaseLock())
    backup = node("backup")
    backup.step(m.Tick(0.0))
    backup.step(m.PeerConnected(wire_hello(PEER_ACTIVE)))
    backup.step(m.LockResult(m.LockOutcome.BUSY, 0.0))
    backup.step(m.FailbackMessage(FailbackStep.SHUTDOWN))
    backup.step(m.PeerLost("closed"))
    assert backup.state is State.WAITING
    assert m.TryLock() not in backup.step(m.Tick(10.0))
    assert backup.force_refusal() is None
    assert m.TryLock() in backup.step(m.Force())


def test_failover_on_shutdown_hands_over() -> None:
    active = node(failover_on_shutdown=True)
    serving(active)
    active.step(m.PeerConnected(wire_hello(PEER_BACKUP)))
    effects = active.step(m.Shutdown())
    assert (ch.FAILBACK, {"phase": "go"}) in on_the_wire(effects)
    assert not active.may_confirm(active.now)


def test_a_passive_backup_refuses_force() -> None:
    n = node("backup")
    n.step(m.Tick(0.0))
    n.step(m.PeerConnected(wire_hello(PEER_ACTIVE)))
    n.step(m.LockResult(m.LockOutcome.BUSY, 0.0))
    assert "PASSIVE" in (n.force_refusal() or "")


def test_a_lock_acquired_after_stopping_is_given_back() -> None:
    n = node()
    n.step(m.Tick(0.0))
    n.step(m.Shutdown())
    assert m.ReleaseLock() in acquired(n, 0.1)


def test_the_journal_is_read_ahead_only_while_neither_replayed_nor_served() -> None:
    """Reading ahead goes on while the server waits for the lock and while it waits out the
    previous holder's proof; never while it replays the journal or serves it."""
    allowed = {phase for phase in m.Phase
               if m.SharedStoreNode(m.Settings(role="backup", heartbeat=0.1, activation=0.4),
                                    phase=phase).may_read_ahead()}
    assert m.Phase.BACKUP in allowed and m.Phase.WAITING_OUT in allowed
    assert not allowed & {m.Phase.RECOVERING, m.Phase.STANDALONE, m.Phase.ACTIVE,
                          m.Phase.STOPPED}


def replaying() -> tuple[m.SharedStoreNode, float]:
    """A node that took a free lock, waited out any earlier proof and is replaying the
    journal; returns it and the time the replay began."""
    n = node()
    n.step(m.Tick(0.0))
    acquired(n, 0.0)
    t = wait_out(0.0, V)
    n.step(m.LockResult(m.LockOutcome.CHECKED, t, fresh_proof(t, V)))
    assert m.BecomeActive(None) in n.step(m.Tick(t))
    return n, t


def test_a_replay_that_outlasts_the_proof_verifies_the_lock_again_before_serving() -> None:
    """A million messages on a busy machine take longer to replay than a proof lasts. The
    lock is still this server's: it is verified again, and only then does the server serve
    (before, it served and at its next tick gave the lock up, in a loop of replays)."""
    n, t = replaying()
    late = t + 10 * V  # the replay took this long; no verification result came meanwhile
    assert m.StateChanged not in kinds(n.step(m.Tick(late)))  # not given up
    effects = n.step(m.Recovered(3, late + V))
    assert n.state is State.STARTING and not n.may_confirm(late + V)
    assert m.VerifyLock in kinds(effects) or n.verifying
    now = late + 1.5 * V
    effects = n.step(m.LockResult(m.LockOutcome.CHECKED, now, fresh_proof(now, V)))
    assert m.StateChanged(State.STARTING, State.STANDALONE,
                          "journal replayed and the lock verified; epoch 3") in effects
    assert n.may_confirm(now)


def test_a_failed_verification_after_a_long_replay_gives_the_lock_up() -> None:
    n, t = replaying()
    n.step(m.Recovered(3, t + 10 * V))
    effects = n.step(m.LockResult(m.LockOutcome.CHECKED, t + 11 * V,
                                  Proof(0.0, "the holder record is another server's")))
    assert m.CloseClients in kinds(effects) and not n.may_write(t + 11 * V)
    assert n.state is State.WAITING


def test_a_server_does_not_start_serving_on_a_proof_about_to_lapse() -> None:
    """A verification slowed by a busy process returns a proof with less than a heartbeat
    left: serving on it would give the lock up at the next tick. Verify once more."""
    n, t = replaying()
    late = t + 10 * V
    n.step(m.Recovered(3, late))
    slow_start = late
    done = slow_start + V * 0.95 - HB / 2  # the proof has half a heartbeat left
    effects = n.step(m.LockResult(m.LockOutcome.CHECKED, done, fresh_proof(slow_start, V)))
    assert n.state is State.STARTING and m.VerifyLock in kinds(effects)
    effects = n.step(m.LockResult(m.LockOutcome.CHECKED, done + 0.01,
                                  fresh_proof(done, V)))
    assert n.state is State.STANDALONE and n.may_confirm(done + 0.01)
