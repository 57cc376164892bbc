"""Writing rows as messages: streaming and batch, both Arrow writers (record batches in).

Every row is sent persistent and numbered for the server as a producer's message
(docs/spark.md, "Exactly once"): the producer is `{query}:{partition}`, its epoch the
micro-batch id (0 for a batch write), and a row's number its position in the task's input,
from 0 (plan.producer_of). Every attempt of a task and every replay of a micro-batch
numbers its rows the same way, so the server drops the rows it has and takes the rest,
however many were in flight when a failover or a task failure came. The query id comes
from the task's local property `sql.streaming.queryId` (the id a restart from the
checkpoint keeps; the run id changes); a batch write's id is made once on the driver.

Rows go `sendBatchRecords` to a SEND frame (`pairmq-batch`, docs/stomp.md): the server takes a
frame's rows together and confirms them with one receipt; the frame's stamp numbers its
first row, the others follow.

`write()` runs on executors; `commit()` on the driver on another instance: what a task
did travels in its `PairmqCommitMessage`.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
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
from pairmq.client.batching import BatchBuilder
from pairmq.spark.connecting import PairmqError, open_client
from pairmq.spark.options import SourceOptions
from pairmq.spark.plan import producer_of
from pairmq.spark.rows import body_bytes, row_headers

log = logging.getLogger("pairmq.spark")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
FRAME_BYTES = 1 << 20  # a frame is sent once it packs this much (max_frame_bytes)
FRAMES_AHEAD = 16  # frames sent before the oldest one's confirmation is waited for


class InjectedFailure(RuntimeError):
    """Raised by option testing.failAfterRows (tests only)."""


@dataclass
class PairmqCommitMessage(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int


@dataclass
class _Frame:
    """One SEND of rows [first, first + count), while its confirmation is awaited."""

    result: SendResult
    first: int
    count: int


class _FrameSender:
    """Packs one task's rows into batched SENDs and keeps at most FRAMES_AHEAD of them
    unconfirmed; raises (failing the task, which Spark retries with the same numbers) once
    one is refused or its outcome is unknown."""

    def __init__(self, client: Client, destination: str, packing: BatchBuilder,
                 per_frame: int) -> None:
        self.client = client
        self.destination = destination
        self.packing = packing  # numbers the rows: the producer, the batch, the row
        self.per_frame = per_frame
        self.rows = 0  # rows packed so far, in all frames
        self.sent: deque[_Frame] = deque()

    def add(self, body: bytes, headers: dict[str, str] | None) -> None:
        packing = self.packing
        packing.add(body, headers)
        self.rows += 1
        if packing.count >= self.per_frame or packing.size >= FRAME_BYTES:
            self.send()

    def send(self) -> None:
        """The rows packed so far go in one frame."""
        count = self.packing.count
        if not count:
            return
        body, headers = self.packing.take()
        result = self.client.send_async(self.destination, body, headers)
        self.sent.append(_Frame(result, self.rows - count, count))
        sent = self.sent
        while sent and (sent[0].result.done or len(sent) > FRAMES_AHEAD):
            self._settled(sent.popleft())

    def finish(self) -> None:
        """Send what is packed and wait until every row is confirmed."""
        self.send()
        self.client.flush()
        while self.sent:
            self._settled(self.sent.popleft())

    def _settled(self, frame: _Frame) -> None:
        result = frame.result
        result.wait()
        if result.outcome is not Outcome.CONFIRMED:
            packing = self.packing
            last = frame.first + frame.count - 1
            raise PairmqError(f"pairmq: rows {frame.first} to {last} of producer "
                              f"{packing.producer} (epoch {packing.epoch}) to "
                              f"{self.destination} ended {result.outcome}: {result.error}")


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
    packing = BatchBuilder(producer_of(query_id, partition), _epoch(batch_id))
    sender = _FrameSender(client, destination, packing, options["sendBatchRecords"])
    try:
        for batch in batches:
            bodies = batch.column("body").to_pylist()
            names = batch.schema.names
            cells = batch.column("headers").to_pylist() if "headers" in names else None
            for i, body in enumerate(bodies):
                own = row_headers(cells[i]) if cells is not None else None
                sender.add(body_bytes(body), own)
                if fail_after is not None and sender.rows >= fail_after:
                    sender.finish()
                    raise InjectedFailure(f"testing.failAfterRows: partition {partition} "
                                          f"attempt {attempt} fails after {sender.rows} rows")
        sender.finish()
    except ClientError as e:
        raise PairmqError(f"pairmq: writing to {destination} (servers "
                          f"{options['servers']!r}): {e}") from None
    finally:
        client.close(5.0)
    return PairmqCommitMessage(partition, attempt, sender.rows)


def _epoch(batch_id: str) -> int:
    """A micro-batch's id as its rows' epoch (Spark's ids are whole numbers)."""
    if not batch_id.isdigit():
        raise PairmqError(f"pairmq: the micro-batch id {batch_id!r} is not a whole number")
    return int(batch_id)


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
                    "them with the same numbers (the server drops them)", batchId,
                    _total(messages))


class PairmqBatchWriter(DataSourceArrowWriter):
    """`df.write.format("pairmq")`: one id for the whole write, made on the driver, so a
    retried task repeats its rows' numbers (option queryId: the same id for a write run
    again)."""

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
