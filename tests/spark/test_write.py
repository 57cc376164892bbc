"""The writer against a real server: batch and streaming, a headers column, every kind of
destination, rows numbered per task (a write run again with the same queryId adds
nothing)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.spark import drain, server_url

import pairmq.client


def test_batch_write_sends_each_row_once_with_its_own_headers(spark, server):
    url = server_url(server)
    rows = [(f"row-{i}".encode(), {"k": str(i), "dup-id": "mine"}) for i in range(300)]
    df = spark.createDataFrame(rows, "body binary, headers map<string,string>")
    (df.repartition(3).write.format("pairmq").option("servers", url)
     .option("destination", "/queue/batch-out").mode("append").save())
    with pairmq.client.connect(url) as client:
        sub = client.subscribe("/queue/batch-out", headers={"prefetch-count": "500"})
        got = {}
        while len(got) < 300:
            message = sub.receive(10)
            assert message is not None, f"only {len(got)} of 300 arrived"
            client.ack(message)
            got[message.body] = message.headers
        assert sub.receive(0.5) is None
    assert set(got) == {body for body, _ in rows}
    headers = got[b"row-7"]
    assert headers["k"] == "7"
    # the row's "mine" is dropped (all 300 rows would be one message by it); the writer's
    # numbers are the server's business
    assert not any("dup-id" in h or "pairmq-seq" in h for h in got.values())


def test_streaming_write_of_string_bodies_to_a_topic(spark, server, tmp_path: Path):
    url = server_url(server)
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.txt").write_text("\n".join(f"line-{i}" for i in range(50)) + "\n")
    with pairmq.client.connect(url) as client:
        sub = client.subscribe("/topic/lines", ack="auto")
        query = (spark.readStream.format("text").load(str(source))
                 .selectExpr("value AS body")
                 .writeStream.format("pairmq").option("servers", url)
                 .option("destination", "/topic/lines")
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(60)
        assert query.exception() is None, query.exception()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 50 and time.monotonic() < deadline:
            message = sub.receive(1)
            if message is not None:
                got.append(message)
    assert sorted(m.text for m in got) == sorted(f"line-{i}" for i in range(50))


def test_streaming_write_to_a_queue_counts_every_row_once(spark, server, tmp_path: Path):
    url = server_url(server)
    source = tmp_path / "in"
    source.mkdir()
    for f in range(3):
        (source / f"{f}.txt").write_text("".join(f"f{f}-{i}\n" for i in range(100)))
    query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
             .load(str(source)).selectExpr("value AS body")
             .writeStream.format("pairmq").option("servers", url)
             .option("destination", "/queue/lines")
             .option("checkpointLocation", str(tmp_path / "ck"))
             .queryName("named")  # Spark passes the name on as an option
             .trigger(availableNow=True).start())
    query.awaitTermination(90)
    assert query.exception() is None, query.exception()
    got = drain(url, "/queue/lines", 300)
    assert sum(got.values()) == 300 and set(got.values()) == {1}


def test_batch_write_to_a_stream_reads_back_in_order(spark, server):
    url = server_url(server)
    rows = [(f"s-{i}", {"i": str(i)}) for i in range(40)]
    df = spark.createDataFrame(rows, "body string, headers map<string,string>")
    (df.coalesce(1).write.format("pairmq").option("servers", url)
     .option("destination", "/stream/copy").option("queryId", "copy-1").mode("append").save())
    back = (spark.read.format("pairmq").option("servers", url).option("stream", "copy")
            .option("includeHeaders", "true").load().orderBy("offset").collect())
    assert [r.body for r in back] == [f"s-{i}".encode() for i in range(40)]
    assert [r.headers["i"] for r in back] == [str(i) for i in range(40)]
    # the same write run again with the same queryId: every row is recognised (the same
    # producer, epoch 0, the same numbers)
    (df.coalesce(1).write.format("pairmq").option("servers", url)
     .option("destination", "/stream/copy").option("queryId", "copy-1").mode("append").save())
    with pairmq.client.connect(url) as client:
        assert client.stream_info("copy") == (0, 40)


def test_rows_go_many_to_a_frame_and_big_rows_fewer(spark, server_factory):
    """Rows are packed sendBatchRecords to a SEND frame, and a frame is sent once it packs
    1 MiB: 40 rows of 300 KiB reach a server that takes no frame over 2 MiB (7 of them
    would be 2.1 MiB), and 500 small ones go 7 to a frame; all arrive once, in row
    order."""
    url = server_url(server_factory("--max-frame-bytes", str(2 * 1024 * 1024)))
    big = [(bytes([i]) * (300 * 1024),) for i in range(40)]
    small = [(f"s-{i}".encode(),) for i in range(500)]
    for name, rows in (("big", big), ("small", small)):
        df = spark.createDataFrame(rows, "body binary").coalesce(1)
        (df.write.format("pairmq").option("servers", url).option("queryId", name)
         .option("sendBatchRecords", 7).option("destination", f"/queue/{name}")
         .mode("append").save())
        arrived: list[bytes] = []
        got = drain(url, f"/queue/{name}", len(rows), arrived=arrived)
        assert got == {body: 1 for (body,) in rows}
        assert arrived == [body for (body,) in rows]
