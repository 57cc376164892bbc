"""The partition, failback, restart and shutdown cases of the real-process HA tests
(test_partitions.py, test_failback.py, test_restart.py, test_witness_down.py,
test_shutdown.py), scripted on the deterministic simulator (pairmq.ha.sim): the same
replication machine, a simulated network and clock. Every step of every run is checked
against the invariants (one confirmer at a time, nothing confirmed missing from the
server that may confirm, epochs name one history); each test asserts the outcome its
real counterpart asserts."""

from __future__ import annotations

import itertools

from pairmq.ha.sim.world import BACKUP, PRIMARY, WITNESS, SimConfig, World
from tests.support.simpair import confirmations_after, sim_pair, wait_formed, wait_state

ACT = 1.5  # SimConfig's activation interval, seconds


def test_ha_link_cut_the_witness_keeps_the_primary_active() -> None:
    w = sim_pair()
    w.cut(PRIMARY, BACKUP)
    wait_state(w, PRIMARY, "STANDALONE")
    cut_at = w.sched.now
    w.run_for(3 * ACT)
    assert w.state(PRIMARY) == "STANDALONE"
    assert w.state(BACKUP) not in ("ACTIVE", "STANDALONE")
    assert confirmations_after(w, PRIMARY, cut_at) > 0
    w.heal(PRIMARY, BACKUP)
    wait_formed(w, PRIMARY, epoch=1)
    assert w.confirmed_by(BACKUP) == 0


def test_primary_isolated_the_backup_takes_over() -> None:
    w = sim_pair()
    w.isolate(PRIMARY)
    wait_state(w, BACKUP, "STANDALONE")
    assert w.state(PRIMARY) == "WAITING"
    assert w.epoch(BACKUP) == 2
    since = w.sched.now
    w.run_for(2)
    assert confirmations_after(w, BACKUP, since) > 0
    assert w.lost() == []


def _failed_over(**config) -> World:
    w = sim_pair(**config)
    w.isolate(PRIMARY)
    wait_state(w, BACKUP, "STANDALONE")
    w.run_for(2)
    return w


def test_heal_after_failover_the_old_primary_resyncs_as_passive() -> None:
    w = _failed_over(allow_failback=False)
    w.rejoin(PRIMARY)
    wait_formed(w, BACKUP, epoch=2)
    w.run_for(5)
    assert w.state(BACKUP) == "ACTIVE" and w.state(PRIMARY) == "PASSIVE"


def test_heal_after_failover_with_failback() -> None:
    w = _failed_over(allow_failback=True)
    w.rejoin(PRIMARY)
    wait_formed(w, PRIMARY, epoch=3)
    since = w.sched.now
    w.run_for(2)
    assert confirmations_after(w, PRIMARY, since) > 0
    episodes = [c.server for c in w.confirmations]
    changes = [a for a, b in itertools.pairwise(episodes) if a != b]
    assert len(changes) == 2  # primary, backup, primary: three confirming episodes


def test_witness_lost_then_backup_lost_the_primary_steps_down() -> None:
    w = sim_pair()
    w.cut(PRIMARY, WITNESS)
    since = w.sched.now
    w.run_for(3 * ACT)
    assert w.state(PRIMARY) == "ACTIVE" and w.state(BACKUP) == "PASSIVE"
    assert confirmations_after(w, PRIMARY, since + 2 * ACT) > 0  # on the backup's promise
    w.cut(PRIMARY, BACKUP)
    wait_state(w, BACKUP, "STANDALONE")
    assert w.state(PRIMARY) == "WAITING"
    assert w.epoch(BACKUP) == 2 and w.lost() == []


def test_backup_isolated_the_primary_goes_on_alone() -> None:
    w = sim_pair()
    w.isolate(BACKUP)
    wait_state(w, PRIMARY, "STANDALONE")
    since = w.sched.now
    w.run_for(4 * ACT)
    assert confirmations_after(w, PRIMARY, since) > 0
    assert w.state(BACKUP) not in ("ACTIVE", "STANDALONE") and w.confirmed_by(BACKUP) == 0
    assert w.witness.leases.standby is None  # the witness knows it is out of sync


def test_one_way_ha_cut_the_witness_keeps_the_primary_active() -> None:
    w = sim_pair()
    w.cut(BACKUP, PRIMARY, both=False)
    wait_state(w, PRIMARY, "STANDALONE")
    w.run_for(4 * ACT)
    assert w.state(PRIMARY) == "STANDALONE"
    assert w.confirmed_by(BACKUP) == 0
    w.heal(BACKUP, PRIMARY, both=False)
    wait_formed(w, PRIMARY, epoch=1)


def test_lost_takeover_grant_does_not_wedge_the_pair() -> None:
    w = sim_pair()
    w.crash(PRIMARY)
    # The moment the witness grants the takeover, its answer is lost on the way back.
    assert w.run_for(10, lambda: w.witness.leases.epoch == 2)
    w.cut(WITNESS, BACKUP, both=False)
    w.run_for(3 * ACT)
    assert w.state(BACKUP) not in ("ACTIVE", "STANDALONE")
    w.heal(WITNESS, BACKUP, both=False)
    wait_state(w, BACKUP, "STANDALONE")
    assert w.epoch(BACKUP) >= 3 and w.lost() == []


def test_flapping_partition_never_two_confirmers() -> None:
    w = sim_pair(allow_failback=False)
    for span in (0.3, 1.0, 1.2, 3.0, 0.5, 2.0, 1.5, 4.0):
        serving = [n for n in (PRIMARY, BACKUP) if w.state(n) in ("ACTIVE", "STANDALONE")]
        victim = serving[0] if serving else PRIMARY
        w.isolate(victim)
        w.run_for(span * ACT)
        w.rejoin(victim)
        w.run_for(1.0)
    assert w.run_for(30, lambda: sorted(
        [w.state(PRIMARY), w.state(BACKUP)]) == ["ACTIVE", "PASSIVE"])
    assert w.lost() == [] and len(w.confirmations) > 0


def test_without_a_witness_an_ha_link_cut_is_split_brain_as_warned() -> None:
    w = sim_pair(witness=False)
    w.cut(PRIMARY, BACKUP)
    cut_at = w.sched.now
    wait_state(w, BACKUP, "STANDALONE")
    w.run_for(3)
    assert confirmations_after(w, PRIMARY, cut_at) > 0
    assert confirmations_after(w, BACKUP, cut_at) > 0  # both confirm: split brain


# ---------------------------------------------------------------- failback


def _crash_failover(**config) -> World:
    w = sim_pair(**config)
    w.crash(PRIMARY)
    wait_state(w, BACKUP, "STANDALONE")
    w.run_for(2)
    return w


def test_failback_the_primary_takes_over_again() -> None:
    w = _crash_failover(allow_failback=True)
    w.start(PRIMARY)
    wait_formed(w, PRIMARY, epoch=3)


def test_without_failback_the_roles_simply_reverse() -> None:
    w = _crash_failover(allow_failback=False)
    w.start(PRIMARY)
    wait_formed(w, BACKUP, epoch=2)
    w.run_for(5)
    assert w.state(BACKUP) == "ACTIVE"


# ---------------------------------------------------------------- restarts


def _both_down_after_failover() -> World:
    w = _crash_failover(allow_failback=False)
    w.crash(BACKUP)
    w.run_for(2 * ACT)
    return w


def test_the_newest_journal_wins_whatever_the_start_order() -> None:
    for first, second in ((PRIMARY, BACKUP), (BACKUP, PRIMARY)):
        w = _both_down_after_failover()
        w.start(first)
        w.run_for(1)
        w.start(second)
        wait_formed(w, BACKUP)
        assert w.epoch(BACKUP) >= 3


def test_alone_with_an_older_journal_waits_until_forced() -> None:
    w = _both_down_after_failover()
    w.start(PRIMARY)
    w.run_for(5 * ACT)
    assert w.state(PRIMARY) == "WAITING"
    assert w.force(PRIMARY) is None
    wait_state(w, PRIMARY, "STANDALONE")
    assert w.epoch(PRIMARY) == 3


def test_a_forced_activation_outlives_an_unreachable_witness() -> None:
    w = _both_down_after_failover()
    w.cut(PRIMARY, WITNESS)
    w.start(PRIMARY)
    w.run_for(2 * ACT)
    assert w.force(PRIMARY) is None
    w.run_for(5 * ACT)
    assert w.state(PRIMARY) == "WAITING"  # the witness still guards against split brain
    w.heal(PRIMARY, WITNESS)
    wait_state(w, PRIMARY, "STANDALONE")


# ---------------------------------------------------------------- without the witness


def test_a_fresh_pair_without_its_witness_elects_the_primary() -> None:
    w = World(SimConfig(), seed=3)
    w.start(PRIMARY)
    w.start(BACKUP)
    wait_formed(w, PRIMARY)
    since = w.sched.now
    w.run_for(2)
    assert confirmations_after(w, PRIMARY, since) > 0  # on the backup's promise


def test_a_server_alone_without_the_witness_does_not_activate() -> None:
    w = sim_pair()
    w.crash(BACKUP)
    w.crash(PRIMARY)
    w.crash(WITNESS)
    w.start(PRIMARY)
    w.run_for(10 * ACT)
    assert w.state(PRIMARY) == "WAITING"


def test_the_active_keeps_serving_without_the_witness_and_adopts_it_again() -> None:
    w = sim_pair()
    w.crash(WITNESS, keep_state=False)
    since = w.sched.now
    w.run_for(5 * ACT)
    assert w.state(PRIMARY) == "ACTIVE" and w.state(BACKUP) == "PASSIVE"
    assert confirmations_after(w, PRIMARY, since + 2 * ACT) > 0
    w.start(WITNESS)
    assert w.run_for(5 * ACT, lambda: w.witness.leases.holder == "primary#p0")
    assert w.state(PRIMARY) == "ACTIVE"


def test_both_restarted_without_the_witness_elect_the_newest_journal() -> None:
    w = _both_down_after_failover()
    w.crash(WITNESS)
    w.start(PRIMARY)
    w.start(BACKUP)
    wait_formed(w, BACKUP)


def test_equal_journals_after_a_clean_stop_elect_the_primary() -> None:
    w = sim_pair()
    w.producing = False
    w.run_for(1)
    w.shutdown(BACKUP)
    w.run_for(1)
    w.shutdown(PRIMARY)
    w.run_for(5 * ACT)
    w.crash(WITNESS)
    w.start(BACKUP)
    w.start(PRIMARY)
    wait_formed(w, PRIMARY)


def test_a_witness_that_granted_a_higher_epoch_adopts_the_active_at_a_new_epoch() -> None:
    w = sim_pair()
    w.crash(WITNESS)
    # It comes back remembering an epoch above the active's, last granted to the server
    # that is now the active's in-sync backup (a grant never used; the backup's epochs
    # are even, the primary's odd).
    w.witness.saved = ("backup#b0", 4, None, 0)
    w.start(WITNESS)
    assert w.run_for(5 * ACT, lambda: w.witness.leases.holder == "primary#p0")
    assert w.epoch(PRIMARY) == 5 and w.state(PRIMARY) == "ACTIVE"
    since = w.sched.now
    w.run_for(2)
    assert confirmations_after(w, PRIMARY, since) > 0 and w.lost() == []
    w.crash(PRIMARY)  # a later failover works
    wait_state(w, BACKUP, "STANDALONE")
    assert w.epoch(BACKUP) == 6 and w.lost() == []


# ---------------------------------------------------------------- shutdown


def test_sigterm_of_the_active_leaves_the_backup_not_serving() -> None:
    w = sim_pair()
    w.shutdown(PRIMARY)
    w.run_for(5 * ACT)
    assert w.state(PRIMARY) == "DOWN"
    assert w.state(BACKUP) == "WAITING"


def test_sigterm_with_failover_on_shutdown_hands_over_to_the_backup() -> None:
    w = sim_pair(failover_on_shutdown=True)
    w.shutdown(PRIMARY)
    wait_state(w, BACKUP, "STANDALONE")
    since = w.sched.now
    w.run_for(1)
    assert w.state(PRIMARY) == "DOWN" and w.lost() == []
    w.run_for(2)
    assert confirmations_after(w, BACKUP, since) > 0
