"""The pipeline example, end to end, with one command:

    .venv/bin/python -m examples.pipeline.run                 # local mode (local[2])
    .venv/bin/python -m examples.pipeline.run --master spark://127.0.0.1:7077

It starts a pairmq pair (examples/pipeline/broker.py), subscribes to `/topic/alerts`,
publishes half the orders to `/stream/orders`, starts the Spark job
(examples/pipeline/job.py), publishes the other half while the job runs, waits until the
job has written every final window, stops it and checks its Parquet output and the alerts
against what the orders must give (examples/pipeline/orders.py). Exit 0 when both are
exact, 1 otherwise. `make pipeline` and `make pipeline-cluster` run it.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from examples.pipeline.broker import LocalPair
from examples.pipeline.orders import Order, expected_alerts, expected_revenue, generate

import pairmq.client

REVENUE_SCHEMA = "window_start_ms BIGINT, product STRING, revenue BIGINT"


class AlertListener:
    """Collects the alerts the job publishes (a topic: subscribed before the job starts)."""

    def __init__(self, url: str) -> None:
        self.client = pairmq.client.connect(url)
        self.sub = self.client.subscribe("/topic/alerts")
        self.order_ids: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.sub.receive(0.2)
            if message is not None:
                self.order_ids[message.headers.get("order-id", "?")] += 1
                self.client.ack(message)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.close(5)


def publish(url: str, orders: list[Order]) -> None:
    with pairmq.client.connect(url, send_window=1000) as client:
        for order in orders:
            client.send_async("/stream/orders", order.to_json().encode(),
                              headers={"dup-id": order.order_id})
        client.flush()


def revenue(spark, revenue_dir: Path):
    """The job's output as Spark's file sink committed it (its _spark_metadata log)."""
    return spark.read.schema(REVENUE_SCHEMA).parquet(str(revenue_dir))


def wait_for_output(spark, revenue_dir: Path, windows: int, alerts: AlertListener,
                    alert_count: int, queries, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for query in queries:
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name} failed: {query.exception()}")
        rows = revenue(spark, revenue_dir).count() if revenue_dir.exists() else 0
        if rows >= windows and sum(alerts.order_ids.values()) >= alert_count:
            return
        time.sleep(1)
    raise TimeoutError(f"the job did not write {windows} windows and {alert_count} alerts "
                       f"within {timeout} s")


def check(spark, revenue_dir: Path, orders: list[Order], alerts: AlertListener) -> list[str]:
    problems = []
    want = expected_revenue(orders)
    got: dict[tuple[int, str], int] = {}
    for row in revenue(spark, revenue_dir).collect():
        key = (row["window_start_ms"], row["product"])
        if key in got:
            problems.append(f"window {key} written twice")
        got[key] = row["revenue"]
    if got != want:
        missing = sorted(set(want) - set(got))[:5]
        wrong = sorted(k for k in want if k in got and got[k] != want[k])[:5]
        extra = sorted(set(got) - set(want))[:5]
        problems.append(f"revenue differs: missing {missing}, wrong {wrong}, extra {extra}")
    if alerts.order_ids != expected_alerts(orders):
        doubled = [k for k, n in alerts.order_ids.items() if n > 1][:5]
        problems.append(f"alerts differ: got {sum(alerts.order_ids.values())}, want "
                        f"{sum(expected_alerts(orders).values())}, doubled {doubled}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--master", default="local[2]", help="Spark master (local[2] or a "
                    "standalone cluster's spark://HOST:PORT)")
    ap.add_argument("--orders", type=int, default=20000)
    ap.add_argument("--minutes", type=int, default=10, help="event time the orders span")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep the pair's data, the output and the checkpoints here")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pairmq-pipeline-"))
    orders = generate(args.orders, args.minutes)
    half = len(orders) // 2
    from examples.pipeline.job import build_session, start

    started = time.monotonic()
    with LocalPair(workdir / "pair") as pair:
        alerts = AlertListener(pair.url)
        publish(pair.url, orders[:half])
        spark = build_session(args.master)
        queries = start(spark, pair.url, workdir / "output", workdir / "checkpoints")
        publish(pair.url, orders[half:])
        revenue_dir = workdir / "output" / "revenue"
        try:
            wait_for_output(spark, revenue_dir, len(expected_revenue(orders)), alerts,
                            sum(expected_alerts(orders).values()), queries, args.timeout)
        finally:
            for query in queries:
                query.stop()
        time.sleep(1)  # a late duplicate alert would arrive now
        alerts.close()
        problems = check(spark, revenue_dir, orders, alerts)
        spark.stop()
    print(f"{len(orders)} orders, {len(expected_revenue(orders))} windows, "
          f"{sum(expected_alerts(orders).values())} alerts, master {args.master}, "
          f"{time.monotonic() - started:.1f} s: "
          f"{'OK' if not problems else 'FAILED: ' + '; '.join(problems)}")
    if args.workdir is None and not problems:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
