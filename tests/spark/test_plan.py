"""The data source's decisions, without Spark or a server: options, offsets, splitting,
the per-task cursor, the producers that number written rows, and Arrow batches that match
Spark's schema exactly."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pytest

from pairmq.spark.options import CONNECT_ROUNDS, PairmqOptionError, options_table, parse
from pairmq.spark.plan import (
    Range,
    RangeCursor,
    batch_end,
    ending_offset,
    initial_offset,
    producer_of,
    split,
)
from pairmq.spark.rows import (
    ARROW_SCHEMA,
    InputSchemaError,
    check_input,
    record_batch,
    record_of,
    row_headers,
)

SERVERS = "failover:(stomp://a:1,stomp://b:2)"


# ---------------------------------------------------------------- options


def test_options_are_case_insensitive_and_client_options_pass_through():
    options = parse({"servers": SERVERS, "STREAM": "orders", "maxrecordsperbatch": "10",
                     "retryinterval": "50", "call_timeout": "7000"})
    assert options.stream == "/stream/orders" and options["maxRecordsPerBatch"] == 10
    url, keywords = options.connect_arguments()
    assert url == SERVERS
    assert keywords == {"retry_interval": "50", "call_timeout": "7000",
                        "initial_connect_attempts": CONNECT_ROUNDS}


@pytest.mark.parametrize(("options", "message"), [
    ({"servers": SERVERS, "stram": "x"}, "unknown option 'stram'"),
    ({"servers": SERVERS, "partitions": "two"}, "option partitions must be an integer"),
    ({"servers": SERVERS, "partitions": "0"}, "option partitions must be > 0"),
    ({"servers": SERVERS, "startingoffset": "first"}, "option startingOffset must be earliest"),
    ({"servers": SERVERS, "mustexist": "maybe"}, "option mustExist must be true or false"),
    ({"servers": SERVERS, "destination": "/queues/x"}, "option destination must start with"),
    ({"servers": "nowhere"}, "option servers or a client option: not a server address"),
    ({"servers": SERVERS, "retryinterval": "-5"}, "retry_interval must be >= 0"),
    ({"servers": SERVERS, "sendbatchrecords": "0"},
     "option sendBatchRecords must be from 1 to 10000, got 0"),
    ({"servers": SERVERS, "batchrecords": "10001"},
     "option batchRecords must be from 1 to 10000, got 10001"),
])
def test_a_wrong_option_is_named(options, message):
    with pytest.raises(PairmqOptionError, match=message):
        parse(options)


def test_required_options_are_named_when_needed():
    options = parse({"servers": SERVERS})
    with pytest.raises(PairmqOptionError, match="option stream is required"):
        options.stream  # noqa: B018
    with pytest.raises(PairmqOptionError, match="option destination is required"):
        options.require("destination")
    assert parse({}, batch=True)["startingOffset"] == "earliest"
    assert parse({})["startingOffset"] == "latest"


def test_the_docs_list_every_option_as_the_table_says():
    docs = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    assert options_table() in docs


# ---------------------------------------------------------------- offsets and ranges


def test_starting_and_ending_positions():
    assert initial_offset("earliest", 5, 20) == 5
    assert initial_offset("latest", 5, 20) == 20
    assert initial_offset("12", 5, 20) == 12
    assert initial_offset("2", 5, 20) == 5  # retention removed it: start at the first kept
    assert ending_offset("latest", 20) == 20 and ending_offset("9", 20) == 9
    assert ending_offset("99", 20) == 20


def test_a_batch_ends_at_the_limit_the_available_now_target_or_the_stream_end():
    assert batch_end(0, 0, 250, None) == 250
    assert batch_end(0, 0, 250, 100) == 100
    assert batch_end(200, 0, 250, 100) == 250
    assert batch_end(0, 0, 250, None, cap=120) == 120
    assert batch_end(0, 50, 250, 100) == 150  # counted from the first offset still kept
    assert batch_end(30, 0, 20, None) == 30  # never backwards


def test_split_is_contiguous_balanced_and_deterministic():
    assert split(10, 10, 4, 100) == []
    assert split(0, 3, 8, 100) == [Range(0, 1), Range(1, 2), Range(2, 3)]
    ranges = split(10, 90, 1, 30)
    assert ranges == [Range(10, 37), Range(37, 64), Range(64, 90)]
    assert split(10, 90, 1, 30) == ranges
    many = split(0, 1001, 4, 10_000)
    assert [len(r) for r in many] == [251, 250, 250, 250]
    assert all(a.end == b.start for a, b in itertools.pairwise(many))


def test_the_cursor_yields_each_offset_once_when_delivery_starts_over():
    cursor = RangeCursor(10, 15)
    assert [o for o in (10, 11, 12) if cursor.accept(o)] == [10, 11, 12]
    # a failover: the client subscribes again and delivery starts over at 10
    assert [o for o in (10, 11, 12, 13, 14) if cursor.accept(o)] == [13, 14]
    assert cursor.done and not cursor.accept(15)


def test_the_cursor_jumps_what_retention_removed_and_ends_on_the_marker():
    cursor = RangeCursor(0, 10)
    assert cursor.accept(6) and not cursor.accept(3)
    assert not cursor.done
    assert cursor.ended(10) and cursor.done
    assert RangeCursor(5, 5).done


def test_the_cursor_takes_the_new_part_of_each_batch():
    cursor = RangeCursor(10, 30)
    assert cursor.accept_run(10, 8) == (0, 8)  # 10..17
    # a failover: delivery starts over at 10, in batches cut elsewhere
    assert cursor.accept_run(10, 5) == (0, 0)
    assert cursor.accept_run(15, 5) == (3, 5)  # 18, 19
    assert cursor.accept_run(25, 10) == (0, 5)  # retention removed 20..24; 30 is past it
    assert cursor.done and cursor.accept_run(30, 1) == (0, 0)


def test_batched_records_become_the_same_rows():
    from pairmq.protocol.batch import decode_records, encode_records
    records = [(3, 1_700_000_000_000, "ID:x-3", {"persistent": "true", "k": "v"}, b"body")]
    batch = record_batch("s", decode_records(encode_records(records)))
    one = record_batch("s", [record_of({"x-stream-offset": "3", "timestamp": "1700000000000",
                                        "message-id": "ID:x-3", "persistent": "true",
                                        "k": "v", "subscription": "1"}, b"body")])
    assert batch.equals(one)


def test_each_task_is_its_own_producer_and_a_retry_the_same_one():
    producers = {producer_of(q, p) for q in ("q", "r") for p in range(3)}
    assert len(producers) == 6
    assert producer_of("q", 1) == producer_of("q", 1) == "q:1"  # every attempt, every batch


# ---------------------------------------------------------------- rows


def test_record_batches_match_spark_s_arrow_schema_exactly():
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        BinaryType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    spark_schema = StructType([
        StructField("stream", StringType()), StructField("offset", LongType()),
        StructField("timestamp", TimestampType()), StructField("message_id", StringType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("body", BinaryType())])
    assert to_arrow_schema(spark_schema, timezone="UTC") == ARROW_SCHEMA
    record = record_of({"x-stream-offset": "7", "timestamp": "1700000000123",
                        "message-id": "m1", "destination": "/stream/s", "subscription": "1",
                        "ack": "3", "k": "v"}, b"body")
    assert record == (7, 1700000000123, "m1", {"k": "v"}, b"body")
    batch = record_batch("s", [record])
    assert batch.schema == ARROW_SCHEMA
    assert batch.column("timestamp")[0].value == 1700000000123000
    assert batch.to_pylist()[0]["headers"] == [("k", "v")]
    assert record_batch("s", []).num_rows == 0
    assert isinstance(batch, pa.RecordBatch)


def test_the_written_dataframe_needs_a_body_and_headers_of_strings():
    check_input([("body", "binary"), ("headers", "map<string,string>"), ("other", "int")])
    check_input([("BODY", "string")])
    with pytest.raises(InputSchemaError, match="writes a column 'body'"):
        check_input([("value", "string")])
    with pytest.raises(InputSchemaError, match="column body must be binary or string"):
        check_input([("body", "int")])
    with pytest.raises(InputSchemaError, match="column headers must be map<string,string>"):
        check_input([("body", "binary"), ("headers", "string")])


def test_a_row_s_headers_keep_its_own_but_not_the_reserved_ones():
    assert row_headers([("k", "v"), ("dup-id", "x"), ("Receipt", "r"), ("n", None),
                        ("pairmq-seq", "3"), ("pairmq-producer", "p")]) == {"k": "v"}
    assert row_headers({"a": 1}) == {"a": "1"}
    assert row_headers(None) == {}
