"""Helpers of the Spark tests: a local SparkSession as the notes on this machine advise,
and what a test reads back from the broker to count copies."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pairmq.client

INSTALL = "pip install -e '.[dev,spark]' (make test does it)"


def spark_session(master: str = "local[2,3]") -> Any:
    """A local SparkSession for tests: UI off, 2 shuffle partitions, a quick JIT; its Python
    workers run this interpreter (the package must be installed in it, as `pip install -e`
    does: workers do not see sys.path edits). `local[N,F]` retries a failed task F-1 times.

    Fails (never skips) with how to install what is missing."""
    java = shutil.which("java", path=os.environ.get("JAVA_HOME", "") + "/bin:"
                        + os.environ.get("PATH", ""))
    if java is None:
        raise RuntimeError("the Spark tests need a Java 17+ runtime on PATH (or JAVA_HOME): "
                           "apt-get install openjdk-17-jre-headless")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise RuntimeError(f"the Spark tests need pyspark: {INSTALL}") from None
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master(master)
               .appName("pairmq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.extraJavaOptions",
                       "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.sql.streaming.stopTimeout", "30s")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    from pairmq.spark import PairmqDataSource

    session.dataSource.register(PairmqDataSource)
    return session


def drain(url: str, destination: str, expected: int, timeout: float = 30.0,
          quiet: float = 1.0, arrived: list[bytes] | None = None
          ) -> collections.Counter[bytes]:
    """Consume a queue until `expected` messages came and then nothing for `quiet` s (so
    that a duplicate would be seen too); body -> copies (the bodies in the order they came
    into `arrived`)."""
    got: collections.Counter[bytes] = collections.Counter()
    with pairmq.client.connect(url) as client:
        sub = client.subscribe(destination, headers={"prefetch-count": "500"})
        deadline = time.monotonic() + timeout
        count = 0  # sum(got.values()), kept as it grows: a drain of 200,000 stays linear
        while time.monotonic() < deadline:
            message = sub.receive(quiet if count >= expected else 0.5)
            if message is None:
                if count >= expected:
                    break
                continue
            client.ack(message)
            got[message.body] += 1
            count += 1
            if arrived is not None:
                arrived.append(message.body)
    return got


def delete_last_commit(checkpoint: Path) -> int:
    """Make the last micro-batch logged but not committed, as a crash between the two would:
    its offsets stay in offsets/, its entry in commits/ goes. Returns its batch id."""
    commits = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    crc = last.with_name(f".{last.name}.crc")
    if crc.exists():
        crc.unlink()
    return int(last.name)


def last_batch(checkpoint: Path, log: str = "commits") -> int | None:
    """The highest batch id in the checkpoint's offsets/ or commits/."""
    folder = checkpoint / log
    ids = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.exists() else []
    return max(ids) if ids else None


def committed(checkpoint: Path, batch: int) -> bool:
    """Whether the query's commit log holds `batch` (or a later one)."""
    last = last_batch(checkpoint)
    return last is not None and last >= batch


def url_of(*addresses: str) -> str:
    """A failover URL that retries fast (tests)."""
    servers = ",".join(f"stomp://{a}" for a in addresses)
    return f"failover:({servers})?retryInterval=50&maxRetryInterval=200"


def server_url(server: Any) -> str:
    return url_of(f"{server.host}:{server.port}")


def pair_url(pair: Any) -> str:
    return url_of(*(pair.stomp_address(n) for n in ("primary", "backup")))


def append(url: str, stream: str, count: int, start: int = 0, **headers: str) -> None:
    """Append bodies `m-{start}` .. `m-{start+count-1}` to `/stream/{stream}`, confirmed."""
    with pairmq.client.connect(url) as client:
        for i in range(start, start + count):
            client.send_async(f"/stream/{stream}", f"m-{i}".encode(), {**headers, "n": str(i)})
        client.flush()


class BatchFiles:
    """An idempotent sink for `foreachBatch`: batch N's rows go to `batch-N.json` (a replay
    of N overwrites it, as a transactional sink would), and every call is logged, so a test
    sees both what the query produced and which batches ran twice."""

    def __init__(self, directory: Path, columns: tuple[str, ...] = ("offset", "body")) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.columns = columns

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [[_plain(getattr(r, c)) for c in self.columns]
                for r in df.select(*self.columns).collect()]
        path = self.directory / f"batch-{batch_id}.json"
        text = json.dumps(sorted(rows, key=repr))
        path.write_text(text)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        with open(self.directory / "calls.log", "a") as log:
            log.write(f"{batch_id} {len(rows)} {digest}\n")

    def batches(self) -> dict[int, list[list[Any]]]:
        return {int(p.stem.split("-")[1]): json.loads(p.read_text())
                for p in self.directory.glob("batch-*.json")}

    def rows(self) -> list[list[Any]]:
        return [row for _, rows in sorted(self.batches().items()) for row in rows]

    def calls(self) -> list[tuple[int, int, str]]:
        """(batch id, rows, digest of the rows) of every call, in order."""
        log = self.directory / "calls.log"
        if not log.exists():
            return []
        return [(int(a), int(b), c) for a, b, c in (line.split() for line in
                                                   log.read_text().splitlines() if line)]


def _plain(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.decode()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
