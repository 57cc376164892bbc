"""The witness's rules for a server it does not know as active (`adopt`), time as a number."""

from __future__ import annotations

from pairmq.ha.lease import WitnessLeases


def test_a_witness_without_memory_adopts_the_running_active() -> None:
    leases = WitnessLeases()
    grant = leases.adopt("a", 3, 1000, now=10.0, standby="b")
    assert grant.granted and leases.holder == "a" and leases.epoch == 3
    assert leases.standby == "b"


def test_the_old_holder_may_be_adopted_over_only_as_the_askers_backup() -> None:
    leases = WitnessLeases(holder="b", epoch=4, expires=0.0)
    refused = leases.adopt("a", 5, 1000, now=10.0, standby=None)
    assert not refused.granted and "not a's in-sync backup" in refused.reason
    assert leases.adopt("a", 5, 1000, now=10.0, standby="b").granted


def test_adopting_needs_an_epoch_above_every_grant() -> None:
    leases = WitnessLeases(holder="b", epoch=4, expires=0.0)
    grant = leases.adopt("a", 4, 1000, now=10.0, standby="b")
    assert not grant.granted and "above 4" in grant.reason


def test_no_adoption_while_another_lease_may_run() -> None:
    leases = WitnessLeases(holder="b", epoch=4, expires=12.0)
    grant = leases.adopt("a", 9, 1000, now=10.0, standby="b")
    assert not grant.granted and grant.remaining_ms == 2000
    assert leases.holder == "b"
