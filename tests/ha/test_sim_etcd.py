"""etcd as the pair's arbiter, scripted on the deterministic simulator (pairmq.ha.sim with
`arbiter="etcd"`: ha/sim/etcd.py models the cluster, ha/sim/etcd_client.py the server's
driver of ha/etcd_lease.py). Every step is checked against the world's invariants; each
test asserts what the pair must do when etcd loses a leader or a majority. The seeded
runs are in test_sim_seeds.py."""

from __future__ import annotations

import json
from typing import Any

from pairmq.ha.sim.etcd import MEMBERS, Answer, Committed, Failed, Read, Txn, Value
from pairmq.ha.sim.runner import formed
from pairmq.ha.sim.world import BACKUP, PRIMARY, SimConfig, World
from tests.support.simpair import confirmations_after, wait_formed, wait_state

ACT = 1.5  # SimConfig's activation interval, seconds


def etcd_pair(seed: int = 7, **config: Any) -> World:
    """Three etcd members, primary and backup started; the pair formed (primary ACTIVE,
    backup PASSIVE, the record naming the backup as the standby) with a producer."""
    world = World(SimConfig(arbiter="etcd", **config), seed)
    for member in MEMBERS:
        world.start(member)
    world.start(PRIMARY)
    world.start(BACKUP)
    assert world.run_for(10, lambda: formed(world) and record(world).get("standby")
                         == "backup#b0"), world.format_trace()
    world.run_for(1.0)
    assert world.state(PRIMARY) == "ACTIVE"
    assert world.confirmations or not world.producing
    return world


def record(world: World) -> dict[str, Any]:
    """The pair's lease record as etcd holds it ({} before the first write)."""
    assert world.etcd is not None
    value = world.etcd.value
    return {} if value is None else dict(json.loads(value))


def leader(world: World) -> str:
    assert world.etcd is not None and world.etcd.leader is not None
    return world.etcd.leader


def test_the_pair_forms_on_etcd_and_renews_one_transaction_a_heartbeat() -> None:
    w = etcd_pair()
    assert w.etcd is not None
    assert record(w)["holder"] == "primary#p0" and record(w)["epoch"] == 1
    before = w.etcd.commits
    w.run_for(10 * 0.5)  # ten heartbeats
    assert 8 <= w.etcd.commits - before <= 11
    assert w.witness.leases.holder is None  # no witness process in this world


def test_the_etcd_leader_crashed_during_a_failover() -> None:
    w = etcd_pair()
    old = leader(w)
    w.crash(PRIMARY)
    w.crash(old)
    crashed_at = w.sched.now
    wait_state(w, BACKUP, "STANDALONE")
    assert leader(w) != old  # elected without it
    assert w.sched.now - crashed_at < ACT + 2.0 + 2.0  # silence, an election, the takeover
    assert record(w)["holder"] == "backup#b0" and record(w)["epoch"] == 2
    since = w.sched.now
    w.run_for(2)
    assert confirmations_after(w, BACKUP, since) > 0 and w.lost() == []
    w.start(old)
    w.start(PRIMARY)
    wait_formed(w, PRIMARY)  # failback, with the member back


def test_a_lost_majority_then_a_lost_backup_stops_the_active_until_etcd_is_back() -> None:
    w = etcd_pair()
    follower = next(m for m in MEMBERS if m != leader(w))
    w.crash(leader(w))
    w.crash(follower)  # the majority lost
    lost_at = w.sched.now
    w.run_for(3 * ACT)
    assert w.state(PRIMARY) == "ACTIVE" and w.state(BACKUP) == "PASSIVE"
    assert confirmations_after(w, PRIMARY, lost_at + 2 * ACT) > 0  # on the backup's promise
    w.crash(BACKUP)
    crashed_at = w.sched.now
    w.run_for(3 * ACT)
    last = max(c.at for c in w.confirmations if c.server == PRIMARY)
    assert last <= crashed_at + ACT  # within the backup's promise: its etcd lease ran out
    assert w.state(PRIMARY) == "WAITING" and w.lost() == []
    for member in MEMBERS:
        if not w.process(member).up:
            w.start(member)
    wait_state(w, PRIMARY, "STANDALONE")  # by itself: the record still names it
    since = w.sched.now
    w.run_for(2)
    assert confirmations_after(w, PRIMARY, since) > 0
    w.start(BACKUP)
    wait_formed(w, PRIMARY)


def test_an_isolated_active_stops_before_its_backup_takes_over_through_a_new_leader() -> None:
    w = etcd_pair()
    w.isolate(PRIMARY)  # from the backup and every member
    w.pause(leader(w), 3.0)  # and etcd changes leader meanwhile
    wait_state(w, BACKUP, "STANDALONE")
    assert w.state(PRIMARY) == "WAITING" and w.epoch(BACKUP) == 2 and w.lost() == []
    w.rejoin(PRIMARY)
    wait_formed(w, PRIMARY, epoch=3)


def test_a_lone_active_waits_out_a_leader_change_longer_than_its_lease() -> None:
    """With the backup cut off, the active confirms on its lease alone; an election of
    1 to 2 s outlasts the lease (1.5 s, renewals time out meanwhile): it stops, and
    serves again by itself once etcd has a leader. The backup never serves."""
    w = etcd_pair()
    w.cut(PRIMARY, BACKUP)
    wait_state(w, PRIMARY, "STANDALONE")
    w.run_for(2 * ACT)
    assert record(w)["holder"] == "primary#p0" and record(w)["standby"] is None
    w.crash(leader(w))
    wait_state(w, PRIMARY, "WAITING", within=3.0)
    stopped_at = w.sched.now
    wait_state(w, PRIMARY, "STANDALONE")
    assert w.etcd is not None and w.etcd.term == 2
    assert not [c for c in w.confirmations if stopped_at <= c.at < w.sched.now]
    assert w.confirmed_by(BACKUP) == 0
    assert w.state(BACKUP) not in ("ACTIVE", "STANDALONE")
    since = w.sched.now
    w.run_for(2)
    assert confirmations_after(w, PRIMARY, since) > 0
    w.heal(PRIMARY, BACKUP)
    wait_formed(w, PRIMARY)


# ---------------------------------------------------------------- the cluster's model


def _ask(w: World, member: str, op: Read | Txn) -> list[Answer]:
    """A request of the primary's process to one member; what came back within 2 s."""
    assert w.etcd is not None
    answers: list[Answer] = []
    w.etcd.request(w.servers[PRIMARY], member, op, answers.append)
    w.run_for(2.0)
    return answers


def test_a_member_cut_from_the_others_serves_no_read() -> None:
    w = etcd_pair()
    alone = next(m for m in MEMBERS if m != leader(w))
    for other in MEMBERS:
        if other != alone:
            w.cut(alone, other)
    w.run_for(3.0)
    assert all(isinstance(a, Failed) for a in _ask(w, alone, Read()))
    assert w.etcd is not None
    revision = w.etcd.mod_revision
    [value] = _ask(w, leader(w), Read())
    assert isinstance(value, Value) and value.revision >= revision


def test_no_read_is_served_without_a_majority() -> None:
    w = etcd_pair()
    standing = leader(w)
    for member in MEMBERS:
        if member != standing:
            w.crash(member)
    w.run_for(3.0)
    assert all(isinstance(a, Failed) for a in _ask(w, standing, Read()))


def test_a_proposal_of_a_leader_cut_from_the_others_commits_when_it_is_back() -> None:
    w = etcd_pair(produce_every=None)
    assert w.etcd is not None
    w.crash(PRIMARY)
    w.crash(BACKUP)  # nobody else writes
    lead = leader(w)
    for member in MEMBERS:
        if member != lead:
            w.cut(lead, member)
    revision = w.etcd.mod_revision
    value = json.dumps({**record(w), "epoch": 9}).encode()
    answers: list[Answer] = []
    w.etcd.request(w.servers[PRIMARY], lead, Txn(revision, value), answers.append)
    w.run_for(0.5)  # in its log, not committed: no majority
    assert w.etcd.mod_revision == revision and answers == []
    for member in MEMBERS:
        if member != lead:
            w.heal(lead, member)
    w.run_for(0.5)  # back before an election: the same leader commits it, late
    assert leader(w) == lead and w.etcd.mod_revision == revision + 1
    assert record(w)["epoch"] == 9 and answers == [Committed(True, None, revision + 1)]


def test_a_member_cut_from_the_leader_serves_its_stale_copy_to_serializable_reads() -> None:
    w = etcd_pair()
    assert w.etcd is not None
    lagging = next(m for m in MEMBERS if m != leader(w))
    for other in MEMBERS:
        if other != lagging:
            w.cut(lagging, other)
    stale = w.etcd.applied[lagging]
    w.run_for(2.0)  # renewals commit without it
    [answer] = _ask(w, lagging, Read(serializable=True))
    assert answer == stale and stale.revision < w.etcd.mod_revision
    backup = w.servers[BACKUP].etcd_client
    assert backup is not None and backup.session.seen is not None
    seen = backup.session.seen
    backup.session.observe(stale.raw, stale.revision, w.servers[BACKUP].clock())
    assert backup.session.seen is seen  # an older revision changes nothing


def test_the_backup_follows_the_record_between_requests() -> None:
    """Its polling and its watch: when the active dies, the backup has counted the lease
    since about the last renewal, not since it noticed."""
    w = etcd_pair()
    for _ in range(5):
        _seen_by_the_backup_at_once(w)


def _seen_by_the_backup_at_once(w: World) -> None:
    etcd, client = w.etcd, w.servers[BACKUP].etcd_client
    assert etcd is not None and client is not None
    revision = etcd.mod_revision
    assert w.run_for(1.0, lambda: etcd.mod_revision > revision)
    committed_at = w.sched.now
    assert w.run_for(0.1, lambda: client.session.seen is not None
                     and client.session.seen.revision == revision + 1)
    assert w.sched.now - committed_at < 0.02  # the watch's event: a link's latency
