"""The PySpark data source `pairmq`: rows/s read from a stream and written to a queue on
local[2], with the broker's own figures beside them (the same work through one pairmq
client), so that the bottleneck is visible.

Run from the repository root (needs the `spark` extra and Java 17+):

    .venv/bin/python benchmarks/spark.py                        # 200,000 rows, 3 rounds
    .venv/bin/python benchmarks/spark.py --rows 50000 --rounds 1

One standalone server (fsync on, as in production). The stream is filled once with --rows
messages of --size bytes (through the client, pipelined). Then, each round, alternating
which goes first:

- spark read: `spark.read.format("pairmq")` of the whole stream (batch read of the range
  [first, next), --partitions offset ranges read by the executors), written to Spark's
  `noop` sink so that every row is materialised; rows/s over the action;
- client read: one blocking client reads the same range (SUBSCRIBE with
  x-stream-offset / x-stream-end-offset, client-individual acks) until the end marker;
- client batched read: the same, with `x-stream-batch: --batch` (records packed per
  MESSAGE, decoded with pairmq.protocol.batch, one ACK per frame);
- spark write: `spark.range(rows)` made into --size-byte bodies, written with
  `df.write.format("pairmq")` to a queue of a new, empty server (each write below too;
  persistent, numbered by the frame's producer stamp, --batch rows per SEND frame); with
  --unbatched-write, again with one row per frame;
- client write: the same number of messages sent by one client (`send_async` + `flush`);
- client batched write: the same, --batch messages per SEND (`send_batch_async`).

Every read is checked for count and distinct offsets; writes are confirmed (receipts).
Targets (issue 11): the source reads at least 100,000 rows/s, the sink writes at least
30,000 rows/s. One JSON line per round, a summary line with medians.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from tests.serverproc import start_server  # noqa: E402
from tests.support.spark import spark_session  # noqa: E402

import pairmq.client  # noqa: E402
from pairmq.protocol.batch import decode_records  # noqa: E402

STREAM = "bench"


def fill(url: str, rows: int, size: int) -> None:
    body = b"x" * size
    with pairmq.client.connect(url, send_window=2000) as client:
        for _ in range(rows):
            client.send_async(f"/stream/{STREAM}", body)
        client.flush()


def client_read(url: str, rows: int, batch: int | None = None) -> float:
    """One client reads the stream's range [0, rows), a MESSAGE per record (acked each),
    or with `batch` packed records per MESSAGE (`x-stream-batch`, acked per frame)."""
    headers = {"x-stream-offset": "first", "x-stream-end-offset": str(rows),
               "prefetch-count": "2000"}
    ack = "client-individual"
    if batch:
        headers |= {"prefetch-count": str(5 * batch), "x-stream-batch": str(batch)}
        ack = "client"
    what = "client batched read" if batch else "client read"
    with pairmq.client.connect(url) as client:
        sub = client.subscribe(f"/stream/{STREAM}", ack=ack, headers=headers)
        started = time.monotonic()
        expected = 0
        while True:
            message = sub.receive(30)
            if message is None:
                raise RuntimeError(f"{what} stalled at offset {expected}")
            client.ack(message)
            if message.headers.get("x-stream-end") == "true":
                break
            offsets = [record[0] for record in decode_records(message.body)] if batch \
                else [int(message.headers["x-stream-offset"])]
            for offset in offsets:
                if offset != expected:
                    raise RuntimeError(f"{what} offset {offset}, expected {expected}")
                expected += 1
        elapsed = time.monotonic() - started
    if expected != rows:
        raise RuntimeError(f"{what} {expected} rows, expected {rows}")
    return elapsed


def spark_read(spark: Any, url: str, rows: int, partitions: int) -> float:
    df = (spark.read.format("pairmq").option("servers", url).option("stream", STREAM)
          .option("startingOffsets", "earliest").option("endingOffsets", str(rows))
          .option("minPartitions", str(partitions))
          .option("includeHeaders", "true")  # every column, as the figures in the docs
          .load())
    started = time.monotonic()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.monotonic() - started
    checked = df.selectExpr("count(*) AS n", "count(DISTINCT offset) AS d",
                            "min(offset) AS lo", "max(offset) AS hi").first()
    if (checked["n"], checked["d"], checked["lo"], checked["hi"]) != (rows, rows, 0, rows - 1):
        raise RuntimeError(f"spark read {checked}, expected {rows} distinct offsets")
    return elapsed


def client_write(url: str, destination: str, rows: int, size: int,
                 batch: int | None = None) -> float:
    """One client sends `rows` persistent messages (each stamped), one SEND each
    or `batch` to a SEND (`send_batch`), pipelined, then waits for every receipt."""
    body = b"y" * size
    with pairmq.client.connect(url, send_window=2000) as client:
        started = time.monotonic()
        if batch:
            for first in range(0, rows, batch):
                client.send_batch_async(destination, [body] * min(batch, rows - first))
        else:
            for _ in range(rows):
                client.send_async(destination, body)
        client.flush()
        return time.monotonic() - started


def spark_write(spark: Any, url: str, destination: str, rows: int, size: int,
                partitions: int, per_frame: int) -> float:
    from pyspark.sql import functions as F

    df = spark.range(0, rows, 1, partitions).select(
        F.expr(f"cast(rpad(cast(id AS string), {size}, 'z') AS binary)").alias("body"))
    started = time.monotonic()
    df.write.format("pairmq").option("servers", url).option("destination", destination) \
        .option("sendBatchRecords", str(per_frame)).mode("append").save()
    return time.monotonic() - started


def on_fresh_server(workdir: Path, flags: list[str], write: Any) -> float:
    """`write(url)` against a new, empty server, stopped (and its data deleted) after: each
    write starts from the same state, not behind the millions of messages the rounds before
    left waiting (the server would collect its garbage over all of them)."""
    server = start_server(workdir, *flags, name=f"write-{time.monotonic_ns()}")
    try:
        return write(f"failover:(stomp://{server.host}:{server.port})")
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1000,
                    help="x-stream-batch of the client's batched read, and the pairmq-batch "
                    "(rows per SEND frame) of the Spark write (its sendBatchRecords)")
    ap.add_argument("--unbatched-write", action="store_true",
                    help="also write through Spark with one row per SEND (sendBatchRecords 1)")
    ap.add_argument("--dup-cache-size", type=int, default=None,
                    help="the server's dup_cache_size (default: the server's default)")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-bench-spark-"))
    # (rows are named by producer stamps; the dup-id cache matters only to dup-ids)
    flags = ["--dup-cache-size", str(args.dup_cache_size)] if args.dup_cache_size else []
    server = start_server(workdir, *flags)
    url = f"failover:(stomp://{server.host}:{server.port})"
    spark = spark_session("local[2]")
    results: list[dict[str, Any]] = []
    try:
        t0 = time.monotonic()
        fill(url, args.rows, args.size)
        fill_s = time.monotonic() - t0
        spark_read(spark, url, min(args.rows, 1000), 1)  # warm the Python workers
        for n in range(1, args.rounds + 1):
            spark_first = n % 2 == 1
            read_s: dict[str, float] = {}
            write_s: dict[str, float] = {}
            for who in (("spark", "client") if spark_first else ("client", "spark")):
                if who == "spark":
                    read_s[who] = spark_read(spark, url, args.rows, args.partitions)
                    write_s[who] = on_fresh_server(workdir, flags, lambda u: spark_write(
                        spark, u, "/queue/bench", args.rows, args.size, args.partitions,
                        args.batch))
                    if args.unbatched_write:
                        write_s["spark-1"] = on_fresh_server(workdir, flags, lambda u: (
                            spark_write(spark, u, "/queue/bench", args.rows, args.size,
                                        args.partitions, 1)))
                else:
                    read_s[who] = client_read(url, args.rows)
                    read_s["batched"] = client_read(url, args.rows, args.batch)
                    write_s[who] = on_fresh_server(workdir, flags, lambda u: client_write(
                        u, "/queue/bench", args.rows, args.size))
                    write_s["batched"] = on_fresh_server(workdir, flags, lambda u: (
                        client_write(u, "/queue/bench", args.rows, args.size, args.batch)))
            record = {
                "benchmark": "spark", "round": n, "rows": args.rows, "size": args.size,
                "partitions": args.partitions,
                "order": "spark/client" if spark_first else "client/spark",
                "spark_read_rows_per_s": round(args.rows / read_s["spark"]),
                "client_read_msgs_per_s": round(args.rows / read_s["client"]),
                "client_read_batched_msgs_per_s": round(args.rows / read_s["batched"]),
                "spark_write_rows_per_s": round(args.rows / write_s["spark"]),
                "client_write_msgs_per_s": round(args.rows / write_s["client"]),
                "client_write_batched_msgs_per_s": round(args.rows / write_s["batched"]),
                "fill_msgs_per_s": round(args.rows / fill_s),
            }
            if "spark-1" in write_s:
                record["spark_write_one_row_per_frame_rows_per_s"] = round(
                    args.rows / write_s["spark-1"])
            results.append(record)
            print(json.dumps(record), flush=True)
    finally:
        spark.stop()
        server.stop()
    summary: dict[str, Any] = {"benchmark": "spark", "summary": True, "rounds": len(results)}
    for key in ("spark_read_rows_per_s", "client_read_msgs_per_s",
                "client_read_batched_msgs_per_s", "spark_write_rows_per_s",
                "client_write_msgs_per_s", "client_write_batched_msgs_per_s",
                "spark_write_one_row_per_frame_rows_per_s"):
        if key not in results[0]:
            continue
        summary[f"median_{key}"] = statistics.median(r[key] for r in results)
    summary["read_target_met"] = summary["median_spark_read_rows_per_s"] >= 100_000
    summary["write_target_met"] = summary["median_spark_write_rows_per_s"] >= 30_000
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
