"""Reading a stream: the streaming reader (micro-batches of offset ranges) and the batch
reader (one range), both reading on executors through the failover client.

Where each part runs (docs/spark.md): `initialOffset`, `latestOffset`, `partitions` and
`commit` in one long-lived driver-side Python process per query, which keeps a client open
for its questions; `read()` on executors, on another copy of the reader unpickled from a
planning process, which opens its own client. So nothing holding a socket or a lock is
ever pickled (`__getstate__` drops the driver's client).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pairmq.client import Client, ClientError, Message, ServerError
from pairmq.client.streams import batch_records
from pairmq.spark.connecting import PairmqError, open_client, stream_offsets
from pairmq.spark.options import PairmqOptionError, SourceOptions
from pairmq.spark.plan import (
    RangeCursor,
    batch_end,
    ending_offset,
    initial_offset,
    split,
)
from pairmq.spark.rows import Record, record_batch, record_of

log = logging.getLogger("pairmq.spark")

ROWS_PER_ARROW_BATCH = 4096


class OffsetRange(InputPartition):
    """One task's share: offsets [start, end) of one stream (plain values: pickled)."""

    def __init__(self, stream: str, start: int, end: int) -> None:
        super().__init__((stream, start, end))
        self.stream = stream
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"OffsetRange({self.stream}, {self.start}, {self.end})"


def read_range(options: SourceOptions, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Every offset of [start, end) still stored, once, as Arrow record batches.

    The range is one bounded subscription (`x-stream-end-offset`) ended by the server's end
    marker, read `batchRecords` records per MESSAGE (`x-stream-batch`, decoded here; one
    cumulative ACK per frame gives the credit back). After a failover the client subscribes
    again with the same headers, so delivery starts over at `start`: the cursor skips what
    was yielded already."""
    cursor = RangeCursor(part.start, part.end)
    if cursor.done:
        return
    name = options.stream_name
    client = open_client(options, f"spark-read-{name}-{part.start}")
    try:
        headers = {"x-stream-offset": f"offset={part.start}",
                   "x-stream-end-offset": str(part.end),
                   "prefetch-count": str(options["prefetch"]),
                   "x-stream-batch": str(options["batchRecords"])}
        if options["mustExist"]:
            headers["x-stream-must-exist"] = "true"
        try:
            sub = client.subscribe(part.stream, ack="client", headers=headers)
        except ServerError as e:
            raise PairmqError(f"pairmq: reading {part}: {e}") from None
        timeout = options["readTimeout"] / 1000
        ack_every = max(1, options["prefetch"] // 2)
        records: list[Record] = []
        received = 0
        while not cursor.done:
            message = sub.receive(timeout)
            if message is None:
                raise PairmqError(f"pairmq: reading {part}: nothing came for {timeout:.0f} s "
                                  f"(next offset {cursor.next}; option readTimeout)")
            headers = message.headers
            if "x-stream-batch" in headers:
                _give_credit(client, message)
                found = batch_records(message.body)
                if found:
                    lo, hi = cursor.accept_run(found[0][0], len(found))
                    records.extend(found[lo:hi])
            elif headers.get("x-stream-end") == "true":
                cursor.ended(int(headers.get("x-stream-offset", part.end)))
                continue
            else:  # one record per MESSAGE (a server that does not batch)
                received += 1
                if received % ack_every == 0:
                    _give_credit(client, message)
                record = record_of(headers, message.body)
                if cursor.accept(record[0]):
                    records.append(record)
            if len(records) >= ROWS_PER_ARROW_BATCH:
                yield record_batch(name, records)
                records = []
        if records:
            yield record_batch(name, records)
    finally:
        client.close(1.0)


def _give_credit(client: Client, message: Message) -> None:
    """A cumulative ACK: on a stream it only gives the server credit for more messages."""
    try:
        client.ack(message)
    except ClientError:
        pass  # received before a failover (AckFailed): the new subscription starts over


class _Planner:
    """The driver's side, shared by both readers: one client, opened when first needed."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: Client | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a socket and locks: never pickled
        return state

    def offsets(self) -> tuple[int, int]:
        if self._client is None:
            self._client = open_client(self.options, f"spark-plan-{self.options.stream_name}")
        return stream_offsets(self._client, self.options)

    def ranges(self, start: int, end: int) -> list[OffsetRange]:
        stream = self.options.stream
        return [OffsetRange(stream, r.start, r.end)
                for r in split(start, end, self.options["partitions"],
                               self.options["maxRecordsPerPartition"])]


class PairmqStreamReader(_Planner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of stream offsets: `{"offset": N}` is the next offset to read."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._target: int | None = None  # Trigger.AvailableNow: the end fixed at its start

    def initialOffset(self) -> dict:
        first, next_offset = self.offsets()
        return {"offset": initial_offset(self.options["startingOffset"], first, next_offset)}

    def getDefaultReadLimit(self) -> ReadLimit:
        most = self.options["maxRecordsPerBatch"]
        return ReadAllAvailable() if most is None else ReadMaxRows(most)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.offsets()[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first, next_offset = self.offsets()
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return {"offset": batch_end(int(start["offset"]), first, next_offset, most,
                                    self._target)}

    def reportLatestOffset(self) -> dict | None:
        return {"offset": self.offsets()[1]}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return list(self.ranges(int(start["offset"]), int(end["offset"])))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, partition)

    def commit(self, end: dict) -> None:
        """Spark processed everything before `end` (called one batch late, and never for
        an availableNow run's last batch): store the group's offset, a retention hint."""
        group = self.options["group"]
        if group is None:
            return
        if self._client is None:
            self.offsets()
        assert self._client is not None
        try:
            self._client.send(self.options.stream, b"", {
                "x-stream-group": group, "x-stream-commit-offset": str(int(end["offset"]))})
        except Exception as e:  # a hint only: the checkpoint is the guarantee
            log.warning("pairmq: storing group %s's offset %s failed: %s", group, end, e)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close(1.0)
            self._client = None


class PairmqBatchReader(_Planner, DataSourceReader):
    """`spark.read.format("pairmq")`: offsets [startingOffset, endingOffset) of the stream,
    fixed when the read is planned."""

    def partitions(self) -> list[InputPartition]:
        started = time.monotonic()
        first, next_offset = self.offsets()
        start = initial_offset(self.options["startingOffset"], first, next_offset)
        end = max(start, ending_offset(self.options["endingOffset"], next_offset))
        self.stop()
        log.info("pairmq: batch read of %s [%d, %d) planned in %.2f s", self.options.stream,
                 start, end, time.monotonic() - started)
        ranges = self.ranges(start, end)
        # Spark needs at least one partition: an empty range reads nothing
        return list(ranges) or [OffsetRange(self.options.stream, start, start)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, partition)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close(1.0)
            self._client = None


def check_reader_options(options: SourceOptions) -> None:
    """What a reader needs, checked when the query is defined."""
    options.require("servers")
    options.stream  # noqa: B018 - checks the name
    if options["startingOffset"] not in ("earliest", "latest") and \
            options["endingOffset"] != "latest" and \
            int(options["endingOffset"]) < int(options["startingOffset"]):
        raise PairmqOptionError("option endingOffset must not be below startingOffset")
