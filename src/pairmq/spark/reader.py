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
from pairmq.spark.connecting import PairmqError, offset_at_time, open_client, stream_offsets
from pairmq.spark.options import PairmqOptionError, SourceOptions
from pairmq.spark.plan import (
    DataLossError,
    Range,
    RangeCursor,
    batch_due,
    batch_end,
    data_loss_message,
    ending_offset,
    initial_offset,
    removed,
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
    """Every offset of [start, end) still stored (and matched by the options selector and
    filter), once, as Arrow record batches.

    The range is one bounded subscription (`x-stream-end-offset`) ended by the server's end
    marker, read `batchRecords` records per MESSAGE (`x-stream-batch`, decoded here; one
    cumulative ACK per frame gives the credit back); each record carries its own offset,
    consecutive unless the server filters. After a failover the client subscribes again with
    the same headers, so delivery starts over at `start`: the cursor skips what was yielded
    already. Offsets of the range that retention removed before they came are data loss
    (option failOnDataLoss: the task fails naming them, or they are logged and skipped)."""
    cursor = RangeCursor(part.start, part.end, part.stream, filtered=options.filtered,
                         fail_on_loss=options["failOnDataLoss"])
    if cursor.done:
        return
    name = options.stream_name
    include_headers = options["includeHeaders"]
    client = open_client(options, f"spark-read-{name}-{part.start}")
    try:
        if cursor.filtered:
            # delivered offsets jump over what does not match: only the stream's first kept
            # offset tells what retention removed of the range
            cursor.removed_below(stream_offsets(client, options)[0])
            _log_lost(cursor)
        headers = {"x-stream-offset": f"offset={part.start}",
                   "x-stream-end-offset": str(part.end),
                   "prefetch-count": str(options["prefetch"]),
                   "x-stream-batch": str(options["batchRecords"]),
                   **options.subscribe_headers()}
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
                lo, hi = cursor.accept_run(found)
                if lo < hi:
                    records.extend(found[lo:hi] if lo or hi < len(found) else found)
            elif headers.get("x-stream-end") == "true":
                cursor.ended(int(headers.get("x-stream-offset", part.end)))
            else:  # one record per MESSAGE (a server that does not batch)
                received += 1
                if received % ack_every == 0:
                    _give_credit(client, message)
                record = record_of(headers, message.body)
                if cursor.accept(record[0]):
                    records.append(record)
            if cursor.lost:
                _log_lost(cursor)
            if len(records) >= ROWS_PER_ARROW_BATCH:
                yield record_batch(name, records, include_headers)
                records = []
        if records:
            yield record_batch(name, records, include_headers)
    finally:
        client.close(1.0)


def _log_lost(cursor: RangeCursor) -> None:
    """failOnDataLoss=false: what the task skips, at WARNING, once."""
    for gone in cursor.lost:
        log.warning("pairmq: %s (failOnDataLoss=false: skipped)",
                    data_loss_message(cursor.stream, gone.start, gone.end))
    cursor.lost.clear()


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
        self._warned: Range | None = None  # the loss logged last (failOnDataLoss=false)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a socket and locks: never pickled
        return state

    def _connected(self) -> Client:
        if self._client is None:
            self._client = open_client(self.options, f"spark-plan-{self.options.stream_name}")
        return self._client

    def offsets(self) -> tuple[int, int]:
        return stream_offsets(self._connected(), self.options)

    def offset_at(self, ms: int) -> int:
        """The first offset appended at or after `ms` (startingTimestamp, endingTimestamp)."""
        return offset_at_time(self._connected(), self.options, ms)

    def start_of(self, first: int, next_offset: int, end: int | None = None) -> int:
        """Where a new query (or a batch read, up to `end`) starts: startingTimestamp or
        startingOffsets. An explicit offset that retention removed is data loss, as for
        Kafka."""
        stamp = self.options["startingTimestamp"]
        if stamp is not None:
            return max(first, self.offset_at(stamp))
        position = self.options["startingOffsets"]
        if position not in ("earliest", "latest"):
            self.check_removed(int(position), first, next_offset if end is None else end)
        return initial_offset(position, first, next_offset)

    def check_removed(self, start: int, first: int, end: int) -> None:
        """Planning a read from `start` to `end`: what retention removed of it is data loss
        (failOnDataLoss: the query fails naming the offsets; false: logged once, skipped)."""
        gone = removed(start, first, end)
        if gone is None:
            return
        message = data_loss_message(self.options.stream, gone.start, gone.end)
        if self.options["failOnDataLoss"]:
            raise DataLossError(f"pairmq: {message}")
        if gone != self._warned:
            log.warning("pairmq: %s (failOnDataLoss=false: skipped)", message)
            self._warned = gone

    def ranges(self, start: int, end: int) -> list[OffsetRange]:
        stream = self.options.stream
        return [OffsetRange(stream, r.start, r.end)
                for r in split(start, end, self.options["minPartitions"],
                               self.options["maxRecordsPerPartition"])]

    def stop(self) -> None:
        if self._client is not None:
            self._client.close(1.0)
            self._client = None


class PairmqStreamReader(_Planner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of stream offsets: `{"offset": N}` is the next offset to read."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._target: int | None = None  # Trigger.AvailableNow: the end fixed at its start
        self._last_batch_ms: int | None = None  # minOffsetsPerTrigger: when the last began

    def initialOffset(self) -> dict:
        first, next_offset = self.offsets()
        return {"offset": self.start_of(first, next_offset)}

    def getDefaultReadLimit(self) -> ReadLimit:
        most = self.options["maxOffsetsPerTrigger"]
        return ReadAllAvailable() if most is None else ReadMaxRows(most)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.offsets()[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The next batch's end; `start` itself when no batch is due (Spark then runs none):
        nothing new, or fewer than minOffsetsPerTrigger before maxTriggerDelay passed
        (Trigger.AvailableNow reads to its end without waiting)."""
        first, next_offset = self.offsets()
        at = int(start["offset"])
        self.check_removed(at, first, next_offset)
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = batch_end(at, first, next_offset, most, self._target)
        if end <= at:
            return start
        least = None if self._target is not None else self.options["minOffsetsPerTrigger"]
        now = int(time.time() * 1000)
        if not batch_due(next_offset - max(at, first), least, self.options["maxTriggerDelay"],
                         now, self._last_batch_ms):
            return start
        self._last_batch_ms = now
        return {"offset": end}

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
        client = self._connected()
        try:
            client.send(self.options.stream, b"", {
                "x-stream-group": group, "x-stream-commit-offset": str(int(end["offset"]))})
        except Exception as e:  # a hint only: the checkpoint is the guarantee
            log.warning("pairmq: storing group %s's offset %s failed: %s", group, end, e)

class PairmqBatchReader(_Planner, DataSourceReader):
    """`spark.read.format("pairmq")`: offsets [startingOffsets, endingOffsets) of the stream
    (or from/to the timestamps), fixed when the read is planned."""

    def partitions(self) -> list[InputPartition]:
        started = time.monotonic()
        first, next_offset = self.offsets()
        stamp = self.options["endingTimestamp"]
        if stamp is not None:
            end = self.offset_at(stamp)
        else:
            end = ending_offset(self.options["endingOffsets"], first, next_offset)
        start = self.start_of(first, next_offset, end)
        end = max(start, end)
        self.stop()
        log.info("pairmq: batch read of %s [%d, %d) planned in %.2f s", self.options.stream,
                 start, end, time.monotonic() - started)
        ranges = self.ranges(start, end)
        # Spark needs at least one partition: an empty range reads nothing
        return list(ranges) or [OffsetRange(self.options.stream, start, start)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, partition)


BATCH_ONLY = ("endingOffsets", "endingTimestamp")


def check_reader_options(options: SourceOptions, streaming: bool) -> None:
    """What a reader needs, checked when the query is defined."""
    options.require("servers")
    options.stream  # noqa: B018 - checks the name
    if streaming:
        for name in BATCH_ONLY:
            if name in options.given:
                raise PairmqOptionError(
                    f"option {name} is for batch reads (spark.read), as for Kafka's source: "
                    f"a streaming query reads on (Trigger.AvailableNow stops at the end)")
    start, end = options["startingOffsets"], options["endingOffsets"]
    if start not in ("earliest", "latest") and end not in ("earliest", "latest") and \
            int(end) < int(start):
        raise PairmqOptionError(f"option endingOffsets ({end}) must not be below "
                                f"startingOffsets ({start})")
