"""Exactly once end to end, through what goes wrong in production: the active server killed
with SIGKILL in the middle of a query, the query stopped and restarted from its checkpoint,
a micro-batch logged in the offset log but not in the commit log (a crash between the two:
its commit file deleted before the restart), and failed tasks retried (`local[2,3]`)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tests.ha.pair import Pair
from tests.support.admin import admin_request
from tests.support.spark import (
    BatchFiles,
    append,
    committed,
    delete_last_commit,
    drain,
    last_batch,
    pair_url,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_reader_reads_each_offset_once_through_a_kill_a_restart_and_a_replay(
        spark, pair: Pair, tmp_path: Path) -> None:
    url = pair_url(pair)
    append(url, "events", 2000)
    sink = BatchFiles(tmp_path / "out")
    checkpoint = tmp_path / "ck"

    def start(**trigger):
        return (spark.readStream.format("pairmq").option("servers", url)
                .option("stream", "events").option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", 200).option("minPartitions", 2)
                .option("prefetch", 50)  # small windows: a kill finds reads under way
                .load().writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    query = start(processingTime="100 milliseconds")
    try:
        wait_until(lambda: committed(checkpoint, 1), "two batches committed", 60)
        pair.kill("primary")  # the query's tasks and its driver fail over to the backup
        pair.wait_active(15, "backup")
        append(url, "events", 500, start=2000)
        wait_until(lambda: committed(checkpoint, 6), "batches after the failover", 90)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()  # perhaps in the middle of a batch: the restart runs it again

    def run_to_the_end() -> None:
        again = start(availableNow=True)
        again.awaitTermination(120)
        assert again.exception() is None, again.exception()

    run_to_the_end()
    replayed = delete_last_commit(checkpoint)  # as if the driver died before committing it
    run_to_the_end()

    offsets = sorted(row[0] for row in sink.rows())
    assert offsets == list(range(2500)), "every offset exactly once, across all batches"
    assert {row[1] for row in sink.rows()} == {f"m-{i}" for i in range(2500)}
    runs = [(rows, digest) for batch, rows, digest in sink.calls() if batch == replayed]
    assert len(runs) == 2 and runs[0] == runs[1], f"batch {replayed} ran again, the same: {runs}"


def test_writer_leaves_one_copy_through_retries_a_kill_and_a_replayed_batch(
        spark, pair: Pair, tmp_path: Path) -> None:
    url = pair_url(pair)
    source = tmp_path / "in"
    source.mkdir()
    files, per_file = 5, 300
    for f in range(files):
        (source / f"{f}.txt").write_text("".join(f"r{f}-{i}\n" for i in range(per_file)))
    checkpoint = tmp_path / "ck"

    def start():
        return (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
                .load(str(source)).selectExpr("value AS body")
                .writeStream.format("pairmq").option("servers", url)
                .option("destination", "/queue/results")
                # 64 rows per SEND frame: several frames of each task are in flight at
                # the kill; the first attempt of each batch's task fails after 100
                # confirmed rows, in the middle of its second frame
                .option("sendBatchRecords", 64)
                .option("testing.failAfterRows", 100)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True).start())

    query = start()
    killed_while_running: list[bool] = []

    def kill() -> None:
        wait_until(lambda: committed(checkpoint, 0), "the first batch committed", 60)
        pair.kill("primary")
        killed_while_running.append(query.isActive)

    killer = threading.Thread(target=kill)
    killer.start()
    query.awaitTermination(120)
    killer.join(60)
    assert query.exception() is None, query.exception()
    assert killed_while_running == [True], "the kill came in the middle of the query"
    assert last_batch(checkpoint) == files - 1
    replayed = delete_last_commit(checkpoint)
    again = start()
    again.awaitTermination(60)
    assert again.exception() is None, again.exception()
    assert last_batch(checkpoint) == replayed  # it ran again: nothing else was left

    got = drain(url, "/queue/results", files * per_file)
    expected = {f"r{f}-{i}".encode() for f in range(files) for i in range(per_file)}
    assert set(got) == expected
    doubled = {body: n for body, n in got.items() if n > 1}
    assert not doubled, f"{len(doubled)} rows arrived more than once: {list(doubled)[:5]}"
    assert str(query.id) == str(again.id), "a restart from the checkpoint keeps the query id"
    # what the backup dropped: at least the replayed batch, and every retried task's first
    # 100 rows (a batch after the kill: 1 to 4, fewer if one was under way at the kill)
    dropped = duplicates_dropped(pair.admin_address("backup"))
    assert dropped >= per_file + 100 * 2, dropped


def duplicates_dropped(admin: str) -> int:
    code, _, body = admin_request(admin, "/metrics")
    assert code == 200
    for line in str(body).splitlines():
        if line.startswith("pairmq_messages_duplicates_total"):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no duplicates counter in {str(body)[:300]!r}")
