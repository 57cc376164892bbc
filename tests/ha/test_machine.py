"""The replication machine driven directly (no sockets, no clock): what a server does and
reports at the very instant its lease runs out, and the steps of an activation and a
hand-over as values."""

from __future__ import annotations

from dataclasses import dataclass, field

from pairmq.ha import channel as ch
from pairmq.ha import events as ev
from pairmq.ha.messages import FailbackStep, PeerHello, WitnessPurpose
from pairmq.ha.phases import Phase, Settings
from pairmq.ha.replication import ReplicationMachine
from pairmq.ha.states import State

ACTIVATION_MS = 600
HEARTBEAT = 0.2

wire_hello = PeerHello.from_wire  # a hello as the channel carries it


def wire_sync(message: dict[str, object]) -> ev.SyncRequested:
    """A backup's request to synchronise, as the channel carries it."""
    asked = ev.from_channel(ch.SYNC, message)
    assert isinstance(asked, ev.SyncRequested)
    return asked


def on_the_wire(effects: list[ev.Effect]) -> list[object]:
    """The effects, each `Send` as (kind, what it says on the wire)."""
    return [(e.kind, e.payload.to_wire()) if isinstance(e, ev.Send) else e for e in effects]


@dataclass
class FakeJournal:
    epoch: int = 0
    appended_seq: int = 0
    synced_seq: int = 0
    oldest_seq: int = 1
    mirror: bool = False
    epochs: list[tuple[int, int]] = field(default_factory=list)


def machine(role: str = "primary", witness: bool = True) -> tuple[ReplicationMachine,
                                                                   FakeJournal]:
    journal = FakeJournal()
    settings = Settings(name=role, identity=f"{role}#1", role=role, stomp=f"{role}:61613",
                        witness=witness, heartbeat=HEARTBEAT, activation_ms=ACTIVATION_MS,
                        sync_timeout=5.0, allow_failback=True, failover_on_shutdown=False,
                        synchronous=True, backup_ack_fsync=True)
    return ReplicationMachine(settings, journal), journal


def one(effects: list[ev.Effect], kind: type) -> ev.Effect:
    found = [e for e in effects if isinstance(e, kind)]
    assert len(found) == 1, (kind.__name__, effects)
    return found[0]


def reply(m: ReplicationMachine, effects: list[ev.Effect], now: float,
          **answer: object) -> list[ev.Effect]:
    ask = one(effects, ev.AskWitness)
    return m.handle(ev.witness_replied(ask.purpose, dict(answer), now), now)


def standalone(now: float = 0.0) -> tuple[ReplicationMachine, FakeJournal]:
    """A new pair's primary, alone with a new witness: it activates at epoch 1."""
    m, journal = machine()
    out = m.tick(now)
    assert one(out, ev.AskWitness).request["op"] == "query"
    assert m.state is State.STARTING and m.phase is Phase.ACTIVATING
    out = reply(m, out, now, holder=None, epoch=0)
    assert one(out, ev.AskWitness).request["op"] == "activate"
    out = reply(m, out, now, granted=True, holder="primary#1", epoch=1)
    assert one(out, ev.BecomeActive).epoch == 1
    assert m.state is State.STARTING  # not serving before the journal serves
    journal.epoch = 1
    out = m.handle(ev.Recovered(1), now)
    assert one(out, ev.AskWitness).request["op"] == "renew"
    out = reply(m, out, now, granted=True, holder="primary#1", epoch=1)
    assert one(out, ev.StateChanged) == ev.StateChanged("STARTING", "STANDALONE",
                                                       "alone: the witness decides; epoch 1")
    return m, journal


def test_a_lapsed_lease_ends_serving_at_that_instant_and_is_reported() -> None:
    m, journal = standalone(now=10.0)
    journal.appended_seq = journal.synced_seq = 5
    end = m.deadline(10.0)
    assert end is not None and 10.0 < end <= 10.0 + ACTIVATION_MS / 1000
    just_before = end - 0.001
    assert m.check(just_before) == []
    assert m.state is State.STANDALONE and m.confirmable(5, 3, just_before) == 5
    # The witness no longer answers; at the lease's end the server stops, in one step.
    out = m.check(end)
    assert m.state is State.WAITING and not m.serving
    assert isinstance(out[1], ev.StepDown), out  # clients closed before it reports
    assert one(out, ev.StateChanged).new == "WAITING"
    assert m.confirmable(5, 3, end) == 3  # nothing more is confirmed


def test_stepping_down_decides_nothing_until_the_journal_is_read_back() -> None:
    """A server that stepped down reads its journal back off the event loop (seconds for
    millions of messages): meanwhile it heartbeats, reports WAITING, and does not ask the
    active for a synchronisation, which would quote a journal that is not open yet."""
    m, journal = standalone(now=10.0)
    journal.appended_seq = journal.synced_seq = 5
    end = m.deadline(10.0)
    assert end is not None
    out = m.check(end)
    one(out, ev.StepDown)
    assert m.phase is Phase.STEPPING_DOWN and m.state is State.WAITING
    peer = {"name": "backup", "identity": "backup#1", "role": "backup",
            "state": "STANDALONE", "epoch": 3, "stomp": "backup:61614"}
    out = m.handle(ev.PeerConnected(wire_hello(peer)), end + 0.1)
    out += m.tick(end + 0.2)
    out += m.handle(ev.Heartbeat(wire_hello(peer)), end + 0.3)
    assert [e for e in out if isinstance(e, ev.Send) and e.kind == ch.HEARTBEAT]
    assert not [e for e in out if isinstance(e, ev.Send) and e.kind == ch.SYNC]
    assert not [e for e in out if isinstance(e, (ev.StateChanged, ev.BecomePassive,
                                                 ev.AskWitness))], out
    journal.mirror = True  # what the read-back opened
    out = m.handle(ev.SteppedDown(), end + 2.5)
    sync = one(out, ev.Send)
    assert sync.kind == ch.SYNC and sync.payload.to_wire()["last_seq"] == 5
    assert m.state is State.SYNCING


def test_a_peer_that_follows_the_active_keeps_it_serving_without_the_lease() -> None:
    """A connected backup that is still synchronising cannot take over: the active keeps
    serving (receipts wait) rather than closing everyone's connections."""
    m, _ = standalone(now=0.0)
    m.handle(ev.PeerConnected(wire_hello({"name": "backup", "identity": "backup#1",
                                          "role": "backup",
                               "state": "SYNCING", "epoch": 0})), 0.1)
    end = m.deadline(0.1)
    assert end is not None
    m.check(end + 5)
    assert m.state is State.STANDALONE
    assert m.confirmable(9, 4, end + 5) == 4


def test_a_hand_over_waits_for_the_backup_then_says_go() -> None:
    m, journal = standalone(now=0.0)
    m.handle(ev.PeerConnected(wire_hello({"name": "backup", "identity": "backup#1",
                                          "role": "backup",
                               "state": "SYNCING", "stomp": "backup:61614"})), 0.1)
    out = m.handle(wire_sync({"request": True, "last_seq": 0}), 0.1)
    one(out, ev.ServeSync)
    m.handle(ev.SyncServed(0), 0.1)
    out = m.handle(ev.BackupAcked(0), 0.1)
    assert m.state is State.ACTIVE
    reply(m, out, 0.1, granted=True, holder="primary#1", epoch=1, standby="backup#1")

    assert m.handing_over_to() is None
    out = m.handle(ev.FailbackMessage(FailbackStep.REQUEST), 0.2)
    assert m.phase is Phase.HANDING_OVER
    assert m.handing_over_to() == "backup:61614"  # CONNECTs are refused, naming it
    one(out, ev.CloseClients)
    one(out, ev.Persist)
    journal.appended_seq = 7  # what Persist wrote: the backup must hold it before "go"
    out = m.handle(ev.BackupAcked(6), 0.3)
    assert not [e for e in out if isinstance(e, ev.AskWitness)]
    out = m.handle(ev.BackupAcked(7), 0.3)
    release = one(out, ev.AskWitness)
    assert release.request["op"] == "release" and release.request["keep_standby"] is True
    out = reply(m, out, 0.35, granted=True, holder="primary#1", epoch=1)
    go = [e for e in out if isinstance(e, ev.Send) and e.kind == ch.FAILBACK]
    assert on_the_wire(go) == [(ch.FAILBACK, {"phase": "go", "seq": 7})]
    assert m.state is State.WAITING and m.phase is Phase.STEPPING_DOWN
    assert m.handing_over_to() is None
    one(out, ev.StepDown)
    m.handle(ev.SteppedDown(), 0.4)
    assert m.state is State.WAITING and m.phase is Phase.DEFERRING


def test_a_renewal_never_goes_out_after_the_hand_over_began() -> None:
    """A renewal queued behind a hand-over would give the lease back to the server that is
    handing over, and keep its backup waiting."""
    m, journal = standalone(now=0.0)
    m.handle(ev.PeerConnected(wire_hello({"name": "backup", "identity": "backup#1",
                                          "role": "backup",
                               "state": "SYNCING"})), 0.1)
    m.handle(wire_sync({"request": True, "last_seq": 0}), 0.1)
    m.handle(ev.SyncServed(0), 0.1)
    out = m.handle(ev.BackupAcked(0), 0.1)
    renewal = one(out, ev.AskWitness)  # out, unanswered
    m.handle(ev.FailbackMessage(FailbackStep.REQUEST), 0.2)
    journal.appended_seq = 0
    out = m.handle(ev.BackupAcked(0), 0.2)
    assert not [e for e in out if isinstance(e, ev.AskWitness)]  # one request at a time
    out = m.handle(ev.witness_replied(renewal.purpose, {"granted": True}, 0.1), 0.25)
    asks = [e for e in out if isinstance(e, ev.AskWitness)]
    assert [a.request["op"] for a in asks] == ["release"]
    out = m.tick(0.4)
    assert not [e for e in out if isinstance(e, ev.AskWitness)]


def test_without_a_witness_a_lone_server_with_data_waits() -> None:
    m, journal = machine(witness=False)
    journal.epoch, journal.appended_seq = 3, 10
    out = m.tick(0.0)
    assert m.state is State.WAITING
    assert "cannot know whether its journal is the newest" in one(out, ev.StateChanged).why
    assert m.force_refused() is None
    out = m.handle(ev.Force(), 1.0)
    assert one(out, ev.BecomeActive).epoch == 5  # the primary's epochs are odd
    journal.epoch = 5
    m.handle(ev.Recovered(5), 1.0)
    assert m.state is State.STANDALONE


def in_sync_backup() -> tuple[ReplicationMachine, dict[str, object]]:
    """A backup that synchronised with an active primary (epoch 1, one record)."""
    m, journal = machine("backup")
    m.tick(0.0)
    primary = {"name": "primary", "identity": "primary#1", "role": "primary",
               "state": "ACTIVE", "epoch": 1, "last_seq": 1}
    m.handle(ev.PeerConnected(wire_hello(primary)), 0.1)
    m.handle(ev.witness_replied(WitnessPurpose.ACTIVATION, {"holder": "primary#1", "epoch": 1},
                                0.1), 0.1)
    assert m.phase is Phase.SYNCING
    m.handle(ev.SyncOffered("full", 1), 0.15)
    journal.appended_seq = journal.synced_seq = 1
    m.handle(ev.SyncDone(1), 0.2)
    assert m.state is State.PASSIVE
    return m, primary


def test_a_backup_says_why_it_does_not_take_over_after_a_clean_stop() -> None:
    """The stopping active says "shutdown", then its last heartbeat (WAITING) and the
    channel's end race: either way the backup's log names failover_on_shutdown."""
    for heartbeat_first in (True, False):
        m, primary = in_sync_backup()
        out = m.handle(ev.FailbackMessage(FailbackStep.SHUTDOWN), 0.3)
        if heartbeat_first:
            out += m.handle(ev.Heartbeat(wire_hello({**primary, "state": "WAITING"})), 0.31)
        out += m.handle(ev.PeerLost("HA channel closed by the other side"), 0.32)
        out += m.check(5.0) + m.tick(5.0)
        changes = [e for e in out if isinstance(e, ev.StateChanged)]
        assert [(c.new, c.why) for c in changes] == [
            ("WAITING", "the active server stopped cleanly and failover_on_shutdown is off: "
                        "not taking over")], heartbeat_first
        assert m.state is State.WAITING


BACKUP_WAITING = {"name": "backup", "identity": "backup#1", "role": "backup",
                  "state": "WAITING", "epoch": 1, "last_seq": 3, "stomp": "backup:61614"}


def electing() -> tuple[ReplicationMachine, FakeJournal]:
    """A primary (epoch 1, seq 5) and its waiting backup (epoch 1, seq 3) elect it while
    the witness does not answer: it opens its journal for serving at epoch 3."""
    m, journal = machine()
    journal.epoch, journal.appended_seq, journal.synced_seq = 1, 5, 5
    out = m.handle(ev.PeerConnected(wire_hello(BACKUP_WAITING)), 0.1)
    ask = one(out, ev.AskWitness)
    assert ask.request["op"] == "query"
    out = m.handle(ev.witness_replied(ask.purpose, None, 0.1), 0.2)
    assert one(out, ev.BecomeActive).epoch == 3
    return m, journal


def elected() -> tuple[ReplicationMachine, FakeJournal]:
    """... and serves on that election (ELECTED, reported STANDALONE), not yet followed."""
    m, journal = electing()
    journal.epoch = 3
    journal.appended_seq = journal.synced_seq = 6
    out = m.handle(ev.Recovered(3), 0.3)
    assert one(out, ev.StateChanged).new == "STANDALONE"
    assert m.phase is Phase.ELECTED and m.serving
    assert m.confirmable(6, 5, 0.3) == 5  # confirms nothing on an election alone
    return m, journal


def test_an_elected_server_serves_the_backup_it_was_elected_over() -> None:
    m, _ = elected()
    out = m.handle(wire_sync({"request": True, "epoch": 1, "last_seq": 3,
                                     "epochs": [[1, 1]]}), 0.4)
    one(out, ev.ServeSync)
    assert m.phase is Phase.STANDALONE and m.state is State.STANDALONE
    assert not [e for e in out if isinstance(e, ev.StateChanged)]  # STANDALONE all along


def test_an_elected_server_steps_down_when_its_backup_served_meanwhile() -> None:
    """Simulator seed 10715: the witness, which did not know the epoch the election opened
    (3), granted the backup a lower one (2) after it; the backup confirmed records alone
    and stopped serving, then asked this server for a synchronisation. A full copy would
    have wiped the records it confirmed, and its promise then let this server confirm
    without them. Its journal is not the one this server was elected over: step down."""
    m, _ = elected()
    out = m.handle(wire_sync({"request": True, "epoch": 2, "last_seq": 8,
                                     "epochs": [[1, 1], [2, 4]]}), 0.4)
    assert not [e for e in out if isinstance(e, ev.ServeSync)]
    one(out, ev.StepDown)
    assert m.state is State.WAITING and not m.serving
    # A hello that says it is seen as soon: serving or not, the backup's journal moved on.
    for state in ("STANDALONE", "WAITING"):
        m, _ = elected()
        out = m.handle(ev.PeerConnected(wire_hello({**BACKUP_WAITING, "state": state,
                                                    "epoch": 2, "last_seq": 6})), 0.4)
        one(out, ev.StepDown)
        assert m.state is State.WAITING


def test_a_followed_server_without_lease_steps_down_when_the_channel_ends() -> None:
    """Simulator seed 98108: the elected primary, paused, read the backup's request to
    synchronise (with the journal elected over, so it left ELECTED) after the backup had
    lost that channel, been granted a lower epoch (2) by the witness and confirmed alone.
    Following lasts one channel: when it ends (closed, or replaced by a new one before
    any tick), a server with neither lease nor promise steps down at once, before the
    backup's new journal could be wiped by a full copy."""
    sync = {"request": True, "epoch": 1, "last_seq": 3, "epochs": [[1, 1]]}
    for end in ("closed", "replaced"):
        m, _ = elected()
        one(m.handle(wire_sync(sync), 0.4), ev.ServeSync)
        assert m.phase is Phase.STANDALONE and m.serving
        if end == "closed":
            out = m.handle(ev.PeerLost("closed by the peer"), 0.45)
        else:
            out = m.handle(ev.PeerConnected(wire_hello(BACKUP_WAITING)), 0.45)
        one(out, ev.StepDown)
        assert m.state is State.WAITING and not m.serving
    # With the witness's lease the channel's end changes nothing: nobody else is granted.
    m, _ = standalone()
    m.handle(ev.PeerConnected(wire_hello(BACKUP_WAITING)), 0.1)
    out = m.handle(ev.PeerLost("closed by the peer"), 0.2)
    assert not [e for e in out if isinstance(e, ev.StepDown)]
    assert m.serving


def test_an_elected_server_the_witness_renews_serves_alone() -> None:
    """The witness is back and still names this server the holder: it granted the backup
    nothing since, and its lease, not the election, grounds serving now."""
    m, _ = elected()
    out = m.tick(0.5)
    ask = one(out, ev.AskWitness)
    assert ask.request["op"] == "renew"
    m.handle(ev.witness_replied(ask.purpose, {"granted": True, "holder": "primary#1",
                                              "epoch": 3}, 0.5), 0.55)
    assert m.phase is Phase.STANDALONE
    assert m.confirmable(6, 5, 0.55) == 6


def test_no_election_without_the_witness_between_journals_that_forked() -> None:
    """Simulator seed 36008: the primary opened epochs 3 and 5 by elections with its backup
    the witness never heard of (and confirmed nothing in them); the witness then granted
    the backup epoch 2, in which it confirmed messages alone from seq 30. Both restarted
    with the witness unreachable: the primary's journal has the higher epoch, but the
    backup's newest epoch is not in it. Electing it would serve (and copy over the
    backup's journal) a history without those messages: both wait for the witness."""
    backup = {**BACKUP_WAITING, "epoch": 2, "last_seq": 39, "epochs": [[1, 1], [2, 29]]}
    for backup_epochs, activates in (([[1, 1], [2, 29]], False), ([[1, 1]], True)):
        m, journal = machine()
        journal.epoch, journal.appended_seq, journal.synced_seq = 5, 35, 35
        journal.epochs = [(1, 1), (3, 29), (5, 35)]
        hello = {**backup, "epochs": backup_epochs}
        if activates:  # its journal grew out of the backup's newest epoch: elected
            hello.update(epoch=1, last_seq=28)
        out = m.handle(ev.PeerConnected(wire_hello(hello)), 0.1)
        out = m.handle(ev.witness_replied(one(out, ev.AskWitness).purpose, None, 0.1), 0.2)
        if activates:
            assert one(out, ev.BecomeActive).epoch == 7
            continue
        assert not [e for e in out if isinstance(e, ev.BecomeActive)], out
        assert "only the witness can tell" in one(out, ev.Log).message
        assert m.phase is Phase.WAITING and m.state is State.WAITING
    # The backup, from its side, does not take the primary for elected either.
    m, journal = machine("backup")
    journal.epoch, journal.appended_seq, journal.synced_seq = 2, 39, 39
    journal.epochs = [(1, 1), (2, 29)]
    primary = {"name": "primary", "identity": "primary#1", "role": "primary",
               "state": "WAITING", "epoch": 5, "last_seq": 35,
               "epochs": [[1, 1], [3, 29], [5, 35]]}
    out = m.handle(ev.PeerConnected(wire_hello(primary)), 0.1)
    out = m.handle(ev.witness_replied(one(out, ev.AskWitness).purpose, None, 0.1), 0.2)
    assert "only the witness can tell" in one(out, ev.StateChanged).why


def test_the_elected_standby_takes_over_from_a_reachable_holder_that_waits() -> None:
    """Simulator seed 81279: a failback cut short left both servers WAITING with the same
    journal, the witness naming the backup its last holder (lease ended) and the primary
    its standby. The backup defers to the election's winner (the primary); the primary
    waited for the holder, which it can reach: both waited for ever. The winner, named
    the holder's in-sync standby, asks for the lease (the witness grants it only once the
    holder's lease has ended). Well after this server's start (seed 31169's rule)."""
    m, journal = machine()
    journal.epoch, journal.appended_seq, journal.synced_seq = 4, 133, 133
    journal.epochs = [(1, 1), (3, 42), (4, 132)]
    backup = {**BACKUP_WAITING, "epoch": 4, "last_seq": 133,
              "epochs": [[1, 1], [3, 42], [4, 132]]}
    out = m.handle(ev.PeerConnected(wire_hello(backup)), 10.1)
    out = reply(m, out, 10.2, granted=False, holder="backup#1", epoch=4, remaining_ms=0,
                standby="primary#1")
    ask = one(out, ev.AskWitness)
    assert ask.request["op"] == "activate" and ask.request["epoch"] > 4, ask
    # not named the standby (the holder did not declare it in sync): it waits for the holder
    m, journal = machine()
    journal.epoch, journal.appended_seq, journal.synced_seq = 4, 133, 133
    journal.epochs = [(1, 1), (3, 42), (4, 132)]
    out = m.handle(ev.PeerConnected(wire_hello(backup)), 10.1)
    out = reply(m, out, 10.2, granted=False, holder="backup#1", epoch=4, remaining_ms=0,
                standby=None)
    assert not [e for e in out if isinstance(e, ev.AskWitness)], out
    assert m.phase is Phase.WAITING
