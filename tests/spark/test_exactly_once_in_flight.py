"""Exactly once whatever is in flight (issue 17): a Spark write with more rows unconfirmed
than the server's dup-id cache holds, through a kill -9 of the active server.

Each task keeps up to 16 frames of 1,000 rows unconfirmed and two run at once: up to
32,000 rows in flight to one queue, more than the 20,000 dup-ids a destination remembers.
Before producer sequences, the resent frames whose dup-ids the cache had already evicted
were stored twice (3 runs in 5)."""

from __future__ import annotations

import threading

import pytest
from tests.ha.pair import Pair
from tests.serverproc import free_port
from tests.support.admin import admin_status, admin_user_flags, metric
from tests.support.spark import drain, pair_url, server_url
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ROWS = 200_000


@pytest.mark.timeout(600)
# the same kill three times over (each finds its own moment in the write): once in `make
# test`, the other two with `make test-long` (CI stays under 25 minutes)
@pytest.mark.parametrize("run", [0, pytest.param(1, marks=pytest.mark.long),
                                 pytest.param(2, marks=pytest.mark.long)])
def test_a_write_with_more_rows_in_flight_than_the_dup_cache_leaves_one_copy_through_a_kill(
        spark, pair_factory, run: int) -> None:
    pair: Pair = pair_factory(heartbeat_ms=200, activation_ms=600)
    pair.start(parallel=True)
    pair.wait_formed()
    url = pair_url(pair)
    written = threading.Event()
    killed_mid_write: list[bool] = []

    def kill() -> None:
        # mid-write: once the active holds a good part of the rows, not all of them
        wait_until(lambda: metric(pair.admin_address("primary"),
                                  "pairmq_messages_received_total") >= 40_000,
                   "40,000 rows at the active", 120, interval=0.02)
        pair.kill("primary")
        killed_mid_write.append(not written.is_set())

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    df = spark.range(ROWS, numPartitions=4).selectExpr("CAST(id AS STRING) AS body")
    (df.write.format("pairmq").option("servers", url).option("destination", "/queue/sink")
     .mode("append").save())
    written.set()
    killer.join(30)
    assert killed_mid_write == [True], "the kill came in the middle of the write"
    got = drain(url, "/queue/sink", ROWS, timeout=180, quiet=2.0)
    status = admin_status(pair.admin_address("backup")) or {}
    left = status.get("destinations", {}).get("/queue/sink", {}).get("messages")
    missing = sorted(i for i in range(ROWS) if str(i).encode() not in got)
    doubled = sorted(int(body) for body, n in got.items() if n > 1)
    assert (missing, doubled, left) == ([], [], 0), (
        f"{sum(got.values())} messages drained, {left} left: {len(missing)} rows missing "
        f"(e.g. {missing[:3]}), {len(doubled)} rows twice (e.g. {doubled[:3]} .. "
        f"{doubled[-3:]})")


@pytest.mark.timeout(300)
def test_a_task_retried_after_60000_rows_of_100000_leaves_one_copy(spark,
                                                                   server_factory) -> None:
    """The first attempt stores rows 0 to 59,999 and fails; the retry starts again at row
    0. Those 60,000 are three times what a dup-id cache holds: every one must be known."""
    admin = f"127.0.0.1:{free_port()}"
    url = server_url(server_factory("--admin", admin, *admin_user_flags()))
    rows = 100_000
    df = spark.range(rows, numPartitions=1).selectExpr("CAST(id AS STRING) AS body")
    (df.write.format("pairmq").option("servers", url).option("destination", "/queue/retried")
     .option("testing.failAfterRows", 60_000).mode("append").save())
    got = drain(url, "/queue/retried", rows, timeout=120, quiet=2.0)
    assert sum(got.values()) == rows and set(got) == {str(i).encode() for i in range(rows)}
    assert metric(admin, "pairmq_messages_duplicates_total") >= 60_000, \
        "the retry sent the first attempt's rows again, and the server dropped them"
