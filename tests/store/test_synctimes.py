"""The fdatasync histogram (store/synctimes.py); a real server fills it
(tests/integration/test_metrics.py)."""

from __future__ import annotations

from pairmq.store.synctimes import SyncTimes


def test_counts_are_cumulative_per_bucket_with_the_sum() -> None:
    times = SyncTimes((0.001, 0.01))
    for seconds in (0.0005, 0.002, 0.003, 5.0):
        times.observe(seconds)
    buckets, total = times.snapshot()
    assert buckets == [("0.001", 1), ("0.01", 3), ("+Inf", 4)]
    assert abs(total - 5.0055) < 1e-9

