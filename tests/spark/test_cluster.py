"""The data source against a cluster of members (docs/cluster.md, docs/spark.md): the sink
writes through a `cluster:` URL and a consumer on the other member gets every row once;
the source reads a stream on the member that holds it, through the same kind of URL."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster import StandaloneCluster
from tests.support.spark import BatchFiles, append, drain


def _cluster_url(cluster: StandaloneCluster, member: int) -> str:
    members = ",".join(cluster.url(i) for i in range(len(cluster.ports)))
    return f"cluster:({members})?clusterMember={member}&retryInterval=50"


def test_sink_writes_to_one_member_and_a_consumer_on_another_gets_each_row_once(
        spark, tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path / "members", 2).start()
    try:
        source = tmp_path / "in"
        source.mkdir()
        for f in range(3):
            (source / f"{f}.txt").write_text("".join(f"f{f}-{i}\n" for i in range(100)))
        query = (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
                 .load(str(source)).selectExpr("value AS body")
                 .writeStream.format("pairmq").option("servers", _cluster_url(cluster, 0))
                 .option("destination", "/queue/rows")
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(90)
        assert query.exception() is None, query.exception()
        # a consumer on member 1: its bridge takes what the query wrote to member 0
        got = drain(cluster.url(1), "/queue/rows", 300)
        assert sum(got.values()) == 300 and set(got.values()) == {1}
        assert len(got) == 300
    finally:
        cluster.stop()


def test_source_reads_a_stream_through_a_cluster_url(spark, tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path / "members", 2).start()
    try:
        append(cluster.url(1), "events", 40)
        sink = BatchFiles(tmp_path / "out")
        query = (spark.readStream.format("pairmq").option("servers", _cluster_url(cluster, 1))
                 .option("stream", "events").option("startingOffsets", "earliest").load()
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(90)
        assert query.exception() is None, query.exception()
        assert sorted(str(row[1]) for row in sink.rows()) == sorted(
            f"m-{i}" for i in range(40))
    finally:
        cluster.stop()
