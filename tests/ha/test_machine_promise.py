"""An in-sync backup's promise, and its echo: the active counts its lease from the echo of
its heartbeat, so the echo goes back at once, and a heartbeat read behind records still
being applied (`HeartbeatAhead`, server/pair/peer_channel.py `InOrder`) promises at once
too. Without both, a backup busy applying what the active sent, or waiting for its next
heartbeat to echo, left the active's lease to lapse under load (CI, 2026-12-02)."""

from __future__ import annotations

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha.messages import PeerHello
from pairmq.ha.phases import Phase
from tests.ha.test_machine import in_sync_backup


def _echoes(effects: list[ev.Effect]) -> list[float]:
    """The echoes of the heartbeats this server sent."""
    return [e.payload.echo for e in effects
            if isinstance(e, ev.Send) and e.kind == ch.HEARTBEAT
            and isinstance(e.payload, PeerHello)]


def _hello(primary: dict[str, object], **more: object) -> PeerHello:
    return PeerHello.from_wire({**primary, **more})


def test_an_in_sync_backup_echoes_a_heartbeat_at_once() -> None:
    m, primary = in_sync_backup()
    out = m.handle(ev.Heartbeat(_hello(primary, ts=5.0)), 5.01)
    assert _echoes(out) == [5.0]


def test_a_heartbeat_ahead_of_records_promises_and_echoes_at_once() -> None:
    m, primary = in_sync_backup()
    activation = m.cfg.activation
    out = m.handle(ev.HeartbeatAhead(_hello(primary, ts=7.0)), 7.01)
    assert _echoes(out) == [7.0]
    assert m.promise_until >= 7.01 + activation
    # Its turn comes later, after a newer one went ahead: the echo does not go back.
    m.handle(ev.HeartbeatAhead(_hello(primary, ts=7.1)), 7.11)
    out = m.handle(ev.Heartbeat(_hello(primary, ts=7.0)), 7.5)
    assert _echoes(out) == [7.1]
    # The active is lost: the backup waits for the promise made at the heartbeat's
    # arrival, as it would have had the heartbeat been handled then.
    m.handle(ev.PeerLost("no heartbeat"), 7.6)
    assert m.phase is Phase.ORPHANED
    m.check(7.11 + activation - 0.01)
    m.tick(7.11 + activation - 0.01)
    assert m.phase is Phase.ORPHANED


def test_a_heartbeat_ahead_saying_the_peer_stopped_serving_promises_nothing() -> None:
    """A change of the peer's state waits for its turn: ahead of it, nothing is promised."""
    m, primary = in_sync_backup()
    before = m.promise_until
    out = m.handle(ev.HeartbeatAhead(_hello(primary, state="WAITING", ts=9.0)), 9.01)
    assert _echoes(out) == [] and m.promise_until == before
    assert m.phase is Phase.PASSIVE  # the state change is taken in its turn


def test_a_new_channel_forgets_the_echo() -> None:
    """The peer's clock on a new channel may be another one (the peer restarted on another
    host's clock): an echo kept from the old one could promise past what was promised."""
    m, primary = in_sync_backup()
    m.handle(ev.Heartbeat(_hello(primary, ts=50.0)), 50.0)
    m.handle(ev.PeerLost("closed"), 50.1)
    m.handle(ev.PeerConnected(_hello(primary, ts=1.0)), 50.2)
    assert m.peer_echo == 0.0
