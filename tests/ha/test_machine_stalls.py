"""A stalled journal disk in the replication machine (issue 35): the active hands over to
its in-sync backup at once; a server without one says clients wait; the disk is known to
complete writes again once the journal was read back. And the driver's test of a backup
whose acknowledgements stopped (ha/lag.py)."""

from __future__ import annotations

import logging

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha.lag import Lag, ReplicationLag, backup_stalled
from pairmq.ha.phases import JournalDisk, Phase
from pairmq.ha.states import State
from tests.ha.test_machine import (
    FakeJournal,
    on_the_wire,
    one,
    reply,
    standalone,
    wire_hello,
    wire_sync,
)
from tests.ha.test_machine import (
    ReplicationMachine as Machine,
)

BACKUP = {"name": "backup", "identity": "backup#1", "role": "backup", "state": "SYNCING",
          "stomp": "backup:61614"}


def join_backup(m: Machine, now: float) -> None:
    """The backup connects, synchronises, acknowledges; the witness records it as standby."""
    m.handle(ev.PeerConnected(wire_hello(BACKUP)), now)
    m.handle(wire_sync({"request": True, "last_seq": 0}), now)
    m.handle(ev.SyncServed(0), now)
    out = m.handle(ev.BackupAcked(0), now)
    reply(m, out, now, granted=True, holder="primary#1", epoch=1, standby="backup#1")


def active_with_backup() -> tuple[Machine, FakeJournal]:
    m, journal = standalone(now=0.0)
    join_backup(m, 0.1)
    assert m.state is State.ACTIVE
    return m, journal


def test_an_active_server_whose_disk_stalls_hands_over_to_its_backup_at_once() -> None:
    m, journal = active_with_backup()
    journal.appended_seq = 9  # appended, streamed to the backup, not on this disk
    out = m.handle(ev.JournalStalled(5.2), 6.0)
    assert m.phase is Phase.HANDING_OVER and m.disk is JournalDisk.STALLED
    assert one(out, ev.CloseClients).active == "backup:61614"  # clients told where to go
    one(out, ev.Persist)
    assert m.confirmable(9, 4, 6.0) == 4  # nothing more is confirmed here
    # The backup acknowledges after its own fsync: it holds all of it; the lease goes back
    # keeping it as standby, and "go" follows, without waiting for heartbeats to lapse.
    out = m.handle(ev.BackupAcked(9), 6.05)
    release = one(out, ev.AskWitness)
    assert release.request["op"] == "release" and release.request["keep_standby"] is True
    out = reply(m, out, 6.1, granted=True, holder="primary#1", epoch=1)
    go = [e for e in out if isinstance(e, ev.Send) and e.kind == ch.FAILBACK]
    assert on_the_wire(go) == [(ch.FAILBACK, {"phase": "go", "seq": 9})]
    one(out, ev.StepDown)
    assert m.phase is Phase.STEPPING_DOWN and m.state is State.WAITING
    # The read-back waits for the write in flight: done, the disk completes writes again,
    # and this server defers to the peer it handed over to (it rejoins as its backup).
    m.handle(ev.SteppedDown(), 40.0)
    assert m.phase is Phase.DEFERRING and m.disk is JournalDisk.FLOWING


def test_a_stall_without_an_in_sync_backup_keeps_serving_and_says_clients_wait() -> None:
    m, _ = standalone(now=0.0)
    out = m.handle(ev.JournalStalled(5.0), 1.0)
    assert m.phase is Phase.STANDALONE and m.disk is JournalDisk.STALLED
    assert ev.Log(logging.WARNING, "The journal has not completed a write for 5.0 s and no "
                                   "backup is in sync to hand over to: clients wait for the "
                                   "disk") in out
    assert not [e for e in out if isinstance(e, (ev.CloseClients, ev.StepDown))]
    m.handle(ev.JournalFlowing(), 2.0)
    assert m.disk is JournalDisk.FLOWING and m.phase is Phase.STANDALONE


def test_a_stalled_server_hands_over_once_its_backup_is_in_sync() -> None:
    """The stall came first, the in-sync backup after: the table's rule still applies."""
    m, _ = standalone(now=0.0)
    m.handle(ev.JournalStalled(5.0), 0.05)
    join_backup(m, 0.1)
    assert m.phase is Phase.HANDING_OVER


def test_a_stall_that_ends_before_the_backup_is_in_sync_changes_nothing() -> None:
    m, _ = standalone(now=0.0)
    m.handle(ev.JournalStalled(5.0), 0.05)
    m.handle(ev.JournalFlowing(), 0.06)
    join_backup(m, 0.1)
    assert m.phase is Phase.ACTIVE


def test_receipts_wait_for_the_backup_only_while_it_counts() -> None:
    m, _ = standalone(now=0.0)
    assert not m.receipts_wait_for_backup  # STANDALONE: a syncing backup is not waited for
    m, _ = active_with_backup()
    assert m.receipts_wait_for_backup


def test_a_backup_is_stalled_when_its_oldest_unacknowledged_record_is_too_old() -> None:
    lag = ReplicationLag()
    lag.reset(0)
    lag.sent(10, 1000, now=1.0)
    assert not backup_stalled(lag.view(10, 5.9), 5.0)
    assert backup_stalled(lag.view(10, 6.0), 5.0)
    lag.acked(10)  # it acknowledged everything: nothing is waited for
    assert not backup_stalled(lag.view(10, 60.0), 5.0)
    lag.sent(12, 100, now=59.0)
    assert not backup_stalled(lag.view(12, 60.0), 5.0)
    assert not backup_stalled(Lag(5, 0, 100.0), 0.0)  # 0: the check is off


def test_a_server_that_handed_over_asks_the_witness_once_its_peer_gave_up() -> None:
    """DEFERRING lets the peer activate; a peer that is undecided (it gave up taking over:
    the witness was down when the lease was to be given back, the link cut after "go")
    will wait for the witness's holder, which may be this server: the witness decides
    (simulator seed 3011: before, each waited for the other for ever)."""
    m, journal = active_with_backup()
    journal.appended_seq = 9
    m.handle(ev.JournalStalled(5.2), 6.0)
    out = m.handle(ev.BackupAcked(9), 6.05)
    out = m.handle(ev.witness_replied(one(out, ev.AskWitness).purpose, None, 6.05), 6.6)
    one(out, ev.StepDown)
    m.handle(ev.SteppedDown(), 20.0)
    assert m.phase is Phase.DEFERRING
    hello = dict(BACKUP, state="PASSIVE")  # taking over: it reports PASSIVE meanwhile
    out = m.handle(ev.Heartbeat(wire_hello(hello)), 20.1)
    assert m.phase is Phase.DEFERRING and not [e for e in out if isinstance(e, ev.AskWitness)]
    out = m.handle(ev.Heartbeat(wire_hello(dict(BACKUP, state="WAITING"))), 20.2)
    assert m.phase is Phase.ACTIVATING
    assert one(out, ev.AskWitness).request["op"] == "query"
