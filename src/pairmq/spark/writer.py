"""Writing rows as messages: streaming and batch, both Arrow writers (record batches in).

Every row is sent persistent with the dup-id `{query}:{batch}:{partition}:{row}`
(plan.dup_id), the same on every attempt of a task and every replay of a micro-batch, so
the server keeps one copy (within its dup-id cache, docs/spark.md). The query id comes from
the task's local property `sql.streaming.queryId` (the id a restart from the checkpoint
keeps; the run id changes); a batch write's id is made once on the driver.

`write()` runs on executors; `commit()` on the driver on another instance: what a task
did travels in its `PairmqCommitMessage`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from pairmq.client import Client, ClientError, Outcome, SendResult
from pairmq.spark.connecting import PairmqError, open_client
from pairmq.spark.options import SourceOptions
from pairmq.spark.plan import dup_id
from pairmq.spark.rows import body_bytes, row_headers

log = logging.getLogger("pairmq.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
CHECK_EVERY = 5000  # rows between two waits for confirmations (bounds what is held)


class InjectedFailure(RuntimeError):
    """Raised by option testing.failAfterRows (tests only)."""


@dataclass
class PairmqCommitMessage(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int


def _wait_confirmed(client: Client, pending: list[SendResult]) -> None:
    """Until every row sent so far is confirmed; raises (failing the task, which Spark
    retries with the same dup-ids) if one was refused or its outcome is unknown."""
    client.flush()
    for result in pending:
        result.wait()
        if result.outcome is not Outcome.CONFIRMED:
            raise PairmqError(f"pairmq: message {result.dup_id} to {result.destination} "
                              f"ended {result.outcome}: {result.error}")
    pending.clear()


def write_rows(options: SourceOptions, query_id: str, batch_id: str,
               batches: Iterator[pa.RecordBatch]) -> PairmqCommitMessage:
    """Send every row of this task's record batches, and return once all are confirmed."""
    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    destination = options.require("destination")
    fail_after = options["testing.failAfterRows"]
    if not (fail_after is not None and partition == 0 and attempt == 0):
        fail_after = None
    client = open_client(options, f"spark-write-{batch_id}-{partition}-{attempt}")
    row = 0
    try:
        pending: list[SendResult] = []
        for batch in batches:
            bodies = batch.column("body").to_pylist()
            names = batch.schema.names
            headers = batch.column("headers").to_pylist() if "headers" in names else None
            for i, body in enumerate(bodies):
                hdrs = row_headers(headers[i] if headers else None,
                                   dup_id(query_id, batch_id, partition, row))
                pending.append(client.send_async(destination, body_bytes(body), hdrs))
                row += 1
                if fail_after is not None and row >= fail_after:
                    _wait_confirmed(client, pending)
                    raise InjectedFailure(f"testing.failAfterRows: partition {partition} "
                                          f"attempt {attempt} fails after {row} rows")
                if len(pending) >= CHECK_EVERY:
                    _wait_confirmed(client, pending)
        _wait_confirmed(client, pending)
    except ClientError as e:
        raise PairmqError(f"pairmq: writing to {destination} (servers "
                          f"{options['servers']!r}): {e}") from None
    finally:
        client.close(5.0)
    return PairmqCommitMessage(partition, attempt, row)


def _total(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.rows for m in messages if isinstance(m, PairmqCommitMessage))


class PairmqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        query_id = self.options["queryId"] or \
            (context.getLocalProperty(QUERY_ID_PROPERTY) if context else None)
        if batch_id is None or query_id is None:
            raise PairmqError("pairmq: the streaming query's id or batch id is not known to "
                              "the task (local properties sql.streaming.queryId, "
                              "streaming.sql.batchId); set option queryId")
        return write_rows(self.options, query_id, batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("pairmq: batch %d: %d rows sent to %s", batchId, _total(messages),
                 self.options["destination"])

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pairmq: batch %d failed after %d rows were confirmed; a retry sends "
                    "them with the same dup-ids", batchId, _total(messages))


class PairmqBatchWriter(DataSourceArrowWriter):
    """`df.write.format("pairmq")`: one id for the whole write, made on the driver, so a
    retried task repeats its dup-ids (option queryId: the same id for a write run again)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.write_id = options["queryId"] or f"write-{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_rows(self.options, self.write_id, "0", iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("pairmq: write %s: %d rows sent to %s", self.write_id, _total(messages),
                 self.options["destination"])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("pairmq: write %s failed after %d rows were confirmed", self.write_id,
                    _total(messages))
