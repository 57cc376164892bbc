"""The backup's lag as the active counts it (ha/lag.py): pure, time given."""

from __future__ import annotations

from pairmq.ha.lag import NO_LAG, FollowerLag, Lag, ReplicationLag


def test_nothing_sent_is_no_lag() -> None:
    lag = ReplicationLag()
    lag.reset(10)
    assert lag.view(10, now=5.0) == NO_LAG


def test_records_bytes_and_seconds_behind_until_acknowledged() -> None:
    lag = ReplicationLag()
    lag.reset(0)
    lag.sent(3, 300, now=1.0)
    lag.sent(5, 200, now=2.0)
    assert lag.view(5, now=4.0) == Lag(records=5, bytes=500, seconds=3.0)
    lag.acked(3)
    assert lag.view(5, now=4.0) == Lag(records=2, bytes=200, seconds=2.0)
    lag.acked(5)
    assert lag.view(5, now=4.0) == NO_LAG


def test_an_ack_inside_a_batch_leaves_that_batch_counted_in_bytes() -> None:
    lag = ReplicationLag()
    lag.reset(0)
    lag.sent(10, 1000, now=1.0)
    lag.acked(4)  # exact at batch boundaries only: the batch's bytes stay until it is all in
    assert lag.view(10, now=2.0) == Lag(records=6, bytes=1000, seconds=1.0)


def test_appended_and_not_yet_sent_counts_in_records() -> None:
    lag = ReplicationLag()
    lag.reset(100)
    assert lag.view(250, now=1.0) == Lag(records=150)


def test_marks_are_bounded_and_the_oldest_go_first() -> None:
    lag = ReplicationLag(max_marks=3)
    lag.reset(0)
    for seq in range(1, 6):
        lag.sent(seq, 10, now=float(seq))
    # marks 1 and 2 went: seconds count from mark 3, an underestimate said in the docs
    assert lag.view(5, now=10.0) == Lag(records=5, bytes=50, seconds=7.0)
    lag.acked(4)
    assert lag.view(5, now=10.0) == Lag(records=1, bytes=10, seconds=5.0)


def test_a_reset_forgets_the_old_backup() -> None:
    lag = ReplicationLag()
    lag.reset(0)
    lag.sent(5, 500, now=1.0)
    lag.reset(7)
    assert lag.view(7, now=9.0) == NO_LAG
    lag.acked(3)  # an old ack, below what the new backup holds: nothing changes
    assert lag.view(7, now=9.0) == NO_LAG


def test_a_backup_counts_what_it_lacks_and_since_when() -> None:
    lag = FollowerLag()
    assert lag.view(0, now=1.0) is None  # following nobody
    lag.heard(active_seq=10, own_seq=10, now=1.0)
    assert lag.view(10, now=1.5) == (0, 0.0)
    lag.heard(active_seq=50, own_seq=10, now=2.0)  # it held all the active had said
    assert lag.view(10, now=2.0) == (40, 0.0)
    lag.heard(active_seq=90, own_seq=30, now=2.5)  # still behind the last figure
    assert lag.view(30, now=4.0) == (60, 2.0)  # behind since it last held everything
    lag.heard(active_seq=95, own_seq=90, now=5.0)  # caught up with what it was told
    assert lag.view(95, now=5.5) == (0, 0.0)
    lag.forget()
    assert lag.view(95, now=6.0) is None
