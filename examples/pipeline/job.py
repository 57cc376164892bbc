"""The pipeline's Spark Structured Streaming job: orders in, revenue and alerts out.

Two queries read `/stream/orders` through the `pairmq` data source:

- revenue per product per one-minute window of event time, with a one-minute watermark,
  appended to Parquet once a window is final (Spark's file sink keeps it exactly once
  through restarts, with its checkpoint);
- every order of at least ALERT_AMOUNT, published to `/topic/alerts` through the `pairmq`
  sink (each row's dup-id comes from the query, batch, partition and row, so a retried
  task or a replayed batch publishes nothing twice).

The same code runs in local mode and on a standalone cluster: only the master differs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from examples.pipeline.orders import ALERT_AMOUNT
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

ORDER_SCHEMA = "order_id STRING, product STRING, amount BIGINT, event_ms BIGINT"


def build_session(master: str) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pairmq.spark import PairmqDataSource

    spark = (SparkSession.builder.master(master).appName("pairmq-orders-pipeline")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(PairmqDataSource)
    return spark


def orders(spark: SparkSession, url: str) -> DataFrame:
    raw = (spark.readStream.format("pairmq").option("servers", url)
           .option("stream", "orders").option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", "20000").load())
    parsed = raw.select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o"))
    return parsed.select("o.*").withColumn("event_time", F.timestamp_millis("event_ms"))


def start(spark: SparkSession, url: str, output: Path, checkpoints: Path
          ) -> list[StreamingQuery]:
    events = orders(spark, url)
    revenue = (events.withWatermark("event_time", "1 minute")
               .groupBy(F.window("event_time", "1 minute"), "product")
               .agg(F.sum("amount").alias("revenue"))
               .select(F.unix_millis(F.col("window.start")).alias("window_start_ms"),
                       "product", "revenue"))
    revenue_query = (revenue.writeStream.outputMode("append").format("parquet")
                     .option("path", str(output / "revenue"))
                     .option("checkpointLocation", str(checkpoints / "revenue"))
                     .trigger(processingTime="1 second").queryName("revenue").start())
    alerts = (events.where(F.col("amount") >= ALERT_AMOUNT)
              .select(F.to_json(F.struct("order_id", "product", "amount"))
                      .cast("binary").alias("body"),
                      F.create_map(F.lit("order-id"), F.col("order_id")).alias("headers")))
    alerts_query = (alerts.writeStream.format("pairmq").option("servers", url)
                    .option("destination", "/topic/alerts")
                    .option("checkpointLocation", str(checkpoints / "alerts"))
                    .trigger(processingTime="1 second").queryName("alerts").start())
    return [revenue_query, alerts_query]
