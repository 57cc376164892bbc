"""The election rule of two connected servers, as a pure function."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pairmq.ha.election import Standing, elected
from pairmq.ha.messages import PeerHello
from pairmq.ha.phases import epoch_above

standings = st.builds(Standing, st.integers(0, 5), st.integers(0, 50), st.booleans())


def test_the_newest_journal_wins_whatever_the_role() -> None:
    assert elected(Standing(3, 10, False), Standing(2, 99, True))
    assert elected(Standing(2, 11, False), Standing(2, 10, True))
    assert not elected(Standing(2, 10, True), Standing(2, 11, False))


def test_equal_journals_elect_the_primary() -> None:
    assert elected(Standing(1, 10, True), Standing(1, 10, False))
    assert not elected(Standing(1, 10, False), Standing(1, 10, True))
    assert not elected(Standing(0, 0, True), Standing(0, 0, True))  # two primaries: nobody


def test_of_peer_reads_the_hello() -> None:
    hello = PeerHello.from_wire({"epoch": 4, "last_seq": 7, "role": "primary"})
    assert Standing.of_peer(hello) == Standing(4, 7, True)
    assert Standing.of_peer(PeerHello.from_wire({})) == Standing(0, 0, False)


@given(standings, standings)
def test_never_both_elected(a: Standing, b: Standing) -> None:
    assert not (elected(a, b) and elected(b, a))
    if a != b:
        assert elected(a, b) or elected(b, a)


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_the_two_roles_never_open_the_same_epoch(a: int, b: int) -> None:
    """Whatever each server knows, the epochs the primary and the backup open differ (the
    cause of simulator seed 429: two histories that shared an epoch number)."""
    primary, backup = epoch_above(a, "primary"), epoch_above(b, "backup")
    assert primary > a and backup > b and primary != backup
    assert primary <= a + 2 and backup <= b + 2  # no epoch numbers wasted beyond one
