"""The reader against a real server: micro-batches (availableNow, maxOffsetsPerTrigger),
starting positions (Kafka's option names: offsets, JSON, timestamps), batch reads of a range,
the columns (headers with includeHeaders), data loss under real retention, selectors and
filters, and the errors a user meets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tests.serverproc import free_port
from tests.support.spark import BatchFiles, append, committed, server_url, url_of
from tests.support.waiting import wait_until

import pairmq.client
from pairmq.client import ServerError


def now_ms_between_appends() -> int:
    """A time strictly after what was appended so far and before what comes next."""
    time.sleep(0.02)
    stamp = int(time.time() * 1000)
    time.sleep(0.02)
    return stamp


def stream_query(spark, url: str, stream: str, checkpoint: Path, sink: BatchFiles,
                 **options):
    """An availableNow query from the stream into `sink`; waits for its end."""
    reader = spark.readStream.format("pairmq").option("servers", url).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (reader.load().writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(90)
    assert query.exception() is None, query.exception()
    return query


def test_stream_info_asks_the_active_server_and_refuses_an_unknown_stream(server):
    url = server_url(server)
    with pairmq.client.connect(url) as client:
        with pytest.raises(ServerError, match="unknown stream /stream/nothing"):
            client.stream_info("nothing")
        assert client.stream_info("fresh", must_exist=False) == (0, 0)
        append(url, "fresh", 5)
        assert client.stream_info("/stream/fresh") == (0, 5)

    async def ask() -> tuple[int, int]:
        async with await pairmq.client.connect_async(url) as aclient:
            return await aclient.stream_info("fresh")

    assert asyncio.run(ask()) == (0, 5)


def test_available_now_reads_everything_in_batches_of_max_offsets(spark, server, tmp_path):
    """As a Kafka user writes it: startingOffsets earliest, maxOffsetsPerTrigger,
    minPartitions, includeHeaders."""
    url = server_url(server)
    append(url, "orders", 250, kind="order")
    columns = ("stream", "offset", "timestamp", "message_id", "headers", "body")
    sink = BatchFiles(tmp_path / "out", columns)
    stream_query(spark, url, "orders", tmp_path / "ck", sink, startingOffsets="earliest",
                 maxOffsetsPerTrigger=100, minPartitions=2, includeHeaders="true")
    assert [len(rows) for _, rows in sorted(sink.batches().items())] == [100, 100, 50]
    rows = sorted(sink.rows(), key=lambda r: r[1])
    assert [r[1] for r in rows] == list(range(250))
    stream, _, timestamp, message_id, headers, body = rows[7]
    assert stream == "orders" and body == "m-7"
    assert headers["kind"] == "order" and headers["n"] == "7"
    assert "x-stream-offset" not in headers and message_id and timestamp

    append(url, "orders", 30, start=250)  # the same checkpoint goes on where it stopped
    stream_query(spark, url, "orders", tmp_path / "ck", sink, includeHeaders="true")
    assert sorted(sink.batches()) == [0, 1, 2, 3]
    assert [r[1] for r in sink.batches()[3]] == list(range(250, 280))


def test_starting_positions_latest_an_offset_as_json_and_timestamps(spark, server, tmp_path):
    url = server_url(server)
    append(url, "pos", 20)
    since = now_ms_between_appends()
    append(url, "pos", 10, start=20)
    until = now_ms_between_appends()
    append(url, "pos", 5, start=30)
    latest = BatchFiles(tmp_path / "latest")
    stream_query(spark, url, "pos", tmp_path / "ck1", latest)
    assert latest.rows() == []
    at = BatchFiles(tmp_path / "at")  # Kafka's partition form, the one partition "0"
    stream_query(spark, url, "pos", tmp_path / "ck2", at, startingOffsets='{"pos": {"0": 15}}')
    assert sorted(r[0] for r in at.rows()) == list(range(15, 35))
    timed = BatchFiles(tmp_path / "timed")
    stream_query(spark, url, "pos", tmp_path / "ck3", timed, startingTimestamp=since)
    assert sorted(r[0] for r in timed.rows()) == list(range(20, 35))
    rows = (spark.read.format("pairmq").option("servers", url).option("stream", "pos")
            .option("startingTimestamp", since).option("endingTimestamp", until).load()
            .collect())
    assert sorted(r.offset for r in rows) == list(range(20, 30))


def test_option_group_stores_the_group_s_offset_as_batches_commit(spark, server, tmp_path):
    url = server_url(server)
    checkpoint = tmp_path / "ck"

    def run(batches: int) -> None:
        query = (spark.readStream.format("pairmq").option("servers", url)
                 .option("stream", "grouped").option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", 100).option("group", "etl").load()
                 .writeStream.foreachBatch(BatchFiles(tmp_path / "out"))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(processingTime="100 milliseconds").start())
        try:
            wait_until(lambda: committed(checkpoint, batches - 1), f"{batches} batches", 60)
            time.sleep(1)  # Spark commits a batch's end to the source when it plans the next
        finally:
            query.stop()

    def group_offset() -> int:
        with pairmq.client.connect(url) as client:
            sub = client.subscribe("/stream/grouped", ack="auto", headers={
                "x-stream-offset": "group", "x-stream-group": "etl"})
            message = sub.receive(5)
        assert message is not None
        return int(message.headers["x-stream-offset"])

    append(url, "grouped", 300)
    run(3)
    append(url, "grouped", 1, start=300)  # so that the group's offset has a message
    assert group_offset() in (100, 200, 300)
    append(url, "grouped", 300, start=301)
    run(6)  # the restarted query's commits count too (not taken for duplicates)
    assert group_offset() in (400, 500, 600)


def test_batch_read_of_a_range_split_in_partitions(spark, server):
    url = server_url(server)
    append(url, "range", 100)
    def reader():
        return spark.read.format("pairmq").option("servers", url).option("stream", "range")

    df = (reader().option("startingOffsets", 10).option("endingOffsets", '{"range": 90}')
          .option("maxRecordsPerPartition", 30).load())
    assert "headers" not in df.columns  # without includeHeaders, as Kafka's source
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted(r.offset for r in rows) == list(range(10, 90))
    assert {r.body for r in rows} == {f"m-{i}".encode() for i in range(10, 90)}
    assert reader().load().count() == 100  # earliest to latest by default


def test_errors_name_the_option_the_stream_and_the_servers(spark, server):
    url = server_url(server)

    def read(**options):
        reader = spark.read.format("pairmq")
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return reader.load().collect()

    with pytest.raises(Exception, match="unknown option 'strem'"):
        read(servers=url, strem="x")
    with pytest.raises(Exception, match="option startingOffset was renamed startingOffsets"):
        read(servers=url, stream="x", startingOffset="earliest")
    with pytest.raises(Exception, match="option startingOffsets names stream 'y', but option "
                                        "stream is 'x'"):
        read(servers=url, stream="x", startingOffsets='{"y": 0}')
    with pytest.raises(Exception, match="option maxRecordsPerPartition must be > 0"):
        read(servers=url, stream="x", maxRecordsPerPartition=0)
    with pytest.raises(Exception, match="option stream is required"):
        read(servers=url)
    with pytest.raises(Exception, match="unknown stream /stream/missing"):
        read(servers=url, stream="missing")
    port = free_port()
    with pytest.raises(Exception, match=f"127.0.0.1:{port}"):
        read(servers=url_of(f"127.0.0.1:{port}"), stream="x", initialConnectAttempts=1)
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception, match=f"servers=.*127.0.0.1:{port}.*Connection refused"):
        (df.write.format("pairmq").option("servers", f"127.0.0.1:{port}")
         .option("initialConnectAttempts", 1).option("destination", "/queue/q")
         .mode("append").save())
    with pytest.raises(Exception, match=r"only appends messages: use mode\('append'\)"):
        (df.write.format("pairmq").option("servers", url).option("destination", "/queue/q")
         .mode("overwrite").save())
    with pytest.raises(Exception, match="writes a column 'body'"):
        (df.selectExpr("body AS value").write.format("pairmq").option("servers", url)
         .option("destination", "/queue/q").mode("append").save())


def test_fail_on_data_loss_with_real_retention(spark, server_factory, tmp_path):
    """A query that fell behind retention: by default it fails naming the offsets lost;
    with failOnDataLoss=false it goes on from the first offset kept. The same for a batch
    read from an offset retention removed."""
    url = server_url(server_factory("--max-bytes", "3000"))  # about 24 small messages
    checkpoint = tmp_path / "ck"
    sink = BatchFiles(tmp_path / "out")
    append(url, "short", 10)
    stream_query(spark, url, "short", checkpoint, sink, startingOffsets="earliest")
    append(url, "short", 60, start=10)  # retention removes 10 and more
    with pairmq.client.connect(url) as client:
        first, next_offset = client.stream_info("short")
    assert 10 < first < next_offset == 70

    reader = (spark.readStream.format("pairmq").option("servers", url)
              .option("stream", "short").load())
    query = (reader.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    lost = f"offsets 10 to {first - 1} of /stream/short were removed by retention"
    with pytest.raises(Exception, match=lost):  # StreamingQueryException
        query.awaitTermination(90)

    stream_query(spark, url, "short", checkpoint, sink, failOnDataLoss="false")
    assert sorted(r[0] for r in sink.rows()) == [*range(10), *range(first, 70)]

    def batch(**options):
        df = spark.read.format("pairmq").option("servers", url).option("stream", "short")
        for key, value in options.items():
            df = df.option(key, value)
        return sorted(r.offset for r in df.load().collect())

    with pytest.raises(Exception, match=f"offsets 0 to {first - 1} of /stream/short"):
        batch(startingOffsets="0")
    assert batch(startingOffsets="0", failOnDataLoss="false") == list(range(first, 70))


def test_selector_and_filter_read_only_what_matches(spark, server):
    """The server skips what a selector or filter does not match: delivered offsets jump,
    in batched frames too, and that is no data loss (failOnDataLoss is on)."""
    url = server_url(server)
    colours, regions = ("red", "blue", "green"), ("eu", "us", None)
    with pairmq.client.connect(url) as client:
        for i in range(90):
            headers = {"color": colours[i % 3], "n": str(i)}
            if regions[i % 5 % 3] is not None:
                headers["x-stream-filter-value"] = str(regions[i % 5 % 3])
            client.send_async("/stream/colours", f"m-{i}".encode(), headers)
        client.flush()

    def offsets(**options) -> list[int]:
        df = (spark.read.format("pairmq").option("servers", url).option("stream", "colours")
              .option("minPartitions", 2).option("batchRecords", 7))
        for key, value in options.items():
            df = df.option(key, value)
        return sorted(r.offset for r in df.load().collect())

    assert offsets(selector="color = 'red'") == list(range(0, 90, 3))
    assert offsets(filter="eu", filterMatchUnfiltered="true") == [
        i for i in range(90) if regions[i % 5 % 3] in ("eu", None)]
