"""The data source's decisions, without Spark or a server: options, offsets, splitting,
the per-task cursor, the producers that number written rows, and Arrow batches that match
Spark's schema exactly."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pytest

from pairmq.spark.options import (
    CONNECT_ROUNDS,
    RENAMED,
    PairmqOptionError,
    include_headers,
    kafka_table,
    options_table,
    parse,
    parse_duration_ms,
    parse_position,
)
from pairmq.spark.plan import (
    DataLossError,
    Range,
    RangeCursor,
    batch_due,
    batch_end,
    data_loss_message,
    ending_offset,
    initial_offset,
    producer_of,
    removed,
    split,
)
from pairmq.spark.rows import (
    ARROW_SCHEMA,
    ARROW_SCHEMA_NO_HEADERS,
    InputSchemaError,
    check_input,
    record_batch,
    record_of,
    row_headers,
    schema_ddl,
)

SERVERS = "failover:(stomp://a:1,stomp://b:2)"


# ---------------------------------------------------------------- options


def test_options_are_case_insensitive_and_client_options_pass_through():
    options = parse({"servers": SERVERS, "STREAM": "orders", "maxoffsetspertrigger": "10",
                     "retryinterval": "50", "call_timeout": "7000"})
    assert options.stream == "/stream/orders" and options["maxOffsetsPerTrigger"] == 10
    url, keywords = options.connect_arguments()
    assert url == SERVERS
    assert keywords == {"retry_interval": "50", "call_timeout": "7000",
                        "initial_connect_attempts": CONNECT_ROUNDS}


@pytest.mark.parametrize(("options", "message"), [
    ({"servers": SERVERS, "stram": "x"}, "unknown option 'stram'"),
    ({"servers": SERVERS, "minpartitions": "two"}, "option minPartitions must be an integer"),
    ({"servers": SERVERS, "minpartitions": "0"}, "option minPartitions must be > 0"),
    ({"servers": SERVERS, "startingoffsets": "first"},
     "option startingOffsets must be earliest, latest, an offset"),
    ({"servers": SERVERS, "endingoffsets": "{\"s\": -3}"},
     "option endingOffsets: an offset is an integer >= 0, or -2"),
    ({"servers": SERVERS, "maxtriggerdelay": "soon"},
     "option maxTriggerDelay must be a duration such as 30s"),
    ({"servers": SERVERS, "minoffsetspertrigger": "50", "maxoffsetspertrigger": "10"},
     r"option minOffsetsPerTrigger \(50\) must not be above maxOffsetsPerTrigger \(10\)"),
    ({"servers": SERVERS, "filter": " , "}, "option filter names no value"),
    ({"servers": SERVERS, "filtermatchunfiltered": "true"},
     "option filterMatchUnfiltered goes with option filter"),
    ({"servers": SERVERS, "selector": ""}, "option selector must not be empty"),
    ({"servers": SERVERS, "failondataloss": "yes"}, "option failOnDataLoss must be true or"),
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
    assert parse({}, batch=True)["startingOffsets"] == "earliest"
    assert parse({})["startingOffsets"] == "latest"


def test_the_docs_list_every_option_and_kafka_s_as_the_tables_say():
    docs = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    assert options_table() in docs
    assert kafka_table() in docs


# ---------------------------------------------------------------- Kafka's names (issue 23)


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_an_old_name_is_refused_naming_the_new_one(old, new):
    with pytest.raises(PairmqOptionError, match=f"option {old} was renamed {new}, as Spark's "
                                                "Kafka source names it"):
        parse({"servers": SERVERS, old.lower(): "1"})


def test_a_kafka_option_of_another_name_names_pairmq_s():
    with pytest.raises(PairmqOptionError, match="option subscribe is Spark's Kafka source's; "
                                                "in format pairmq its counterpart is option "
                                                "stream"):
        parse({"servers": SERVERS, "subscribe": "orders"})
    with pytest.raises(PairmqOptionError, match=r"subscribePattern .* it has no counterpart"):
        parse({"servers": SERVERS, "subscribepattern": "o.*"})


def test_kafka_s_options_as_a_kafka_user_writes_them():
    options = parse({"servers": SERVERS, "stream": "orders", "startingoffsets": "earliest",
                     "maxoffsetspertrigger": "500", "minoffsetspertrigger": "100",
                     "maxtriggerdelay": "30s", "minpartitions": "4",
                     "failondataloss": "false", "includeheaders": "true"})
    assert options["startingOffsets"] == "earliest"
    assert (options["maxOffsetsPerTrigger"], options["minOffsetsPerTrigger"]) == (500, 100)
    assert options["maxTriggerDelay"] == 30_000 and options["minPartitions"] == 4
    assert options["failOnDataLoss"] is False and options["includeHeaders"] is True
    defaults = parse({"servers": SERVERS})
    assert defaults["failOnDataLoss"] is True and defaults["includeHeaders"] is False
    assert defaults["maxTriggerDelay"] == 15 * 60_000


@pytest.mark.parametrize(("text", "expected"), [
    ("earliest", (None, "earliest")), ("LATEST", (None, "latest")), ("42", (None, "42")),
    ('{"orders": 42}', ("orders", "42")), ('{"orders": {"0": 42}}', ("orders", "42")),
    ('{"orders": -2}', ("orders", "earliest")), ('{"/stream/orders": {"0": -1}}',
                                                 ("/stream/orders", "latest")),
])
def test_positions_take_kafka_s_words_and_json(text, expected):
    assert parse_position("startingOffsets", text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ('{"orders": {"1": 42}}', 'a stream has one partition, "0"; got partitions \'1\''),
    ('{"orders": {"0": 1, "1": 2}}', 'a stream has one partition'),
    ('{"orders": 1, "other": 2}', "the JSON names one stream"),
    ('{"orders": true}', "an offset is an integer >= 0"),
    ('{"orders": "42"}', "an offset is an integer >= 0"),
    ('{"orders": 4', "must be earliest, latest, an offset"),
    ("-5", "must be earliest, latest, an offset"),
])
def test_a_wrong_position_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_position("startingOffsets", text)


def test_json_positions_must_name_the_option_stream():
    base = {"servers": SERVERS, "stream": "orders"}
    assert parse({**base, "startingoffsets": '{"orders": {"0": 7}}'})["startingOffsets"] == "7"
    assert parse({**base, "endingoffsets": '{"/stream/orders": -1}'})["endingOffsets"] \
        == "latest"
    with pytest.raises(PairmqOptionError, match="option startingOffsets names stream "
                                                "'payments', but option stream is 'orders'"):
        parse({**base, "startingoffsets": '{"payments": 7}'})


def test_a_start_and_a_timestamp_together_are_refused_naming_both():
    with pytest.raises(PairmqOptionError, match="options startingOffsets and startingTimestamp "
                                                "both say where to read"):
        parse({"servers": SERVERS, "startingOffsets": "earliest",
               "startingTimestamp": "1700000000000"})
    with pytest.raises(PairmqOptionError, match="options endingOffsets and endingTimestamp"):
        parse({"servers": SERVERS, "endingoffsets": "5", "endingtimestamp": "1"})
    assert parse({"servers": SERVERS, "startingtimestamp": "1700000000000"}
                 )["startingTimestamp"] == 1_700_000_000_000


def test_a_streaming_query_refuses_batch_only_options():
    from pairmq.spark.reader import check_reader_options

    options = parse({"servers": SERVERS, "stream": "s", "endingOffsets": "10"})
    check_reader_options(options, streaming=False)
    with pytest.raises(PairmqOptionError, match="option endingOffsets is for batch reads"):
        check_reader_options(options, streaming=True)
    with pytest.raises(PairmqOptionError, match=r"option endingOffsets \(3\) must not be below"):
        check_reader_options(parse({"servers": SERVERS, "stream": "s", "startingOffsets": "5",
                                    "endingOffsets": "3"}, batch=True), streaming=False)


@pytest.mark.parametrize(("text", "ms"), [
    ("15m", 900_000), ("30s", 30_000), ("1h", 3_600_000), ("500ms", 500), ("2000", 2000),
    ("5 min", 300_000), ("1d", 86_400_000), ("10S", 10_000),
])
def test_durations_as_spark_writes_them(text, ms):
    assert parse_duration_ms(text) == ms


def test_selector_and_filter_become_subscribe_headers():
    options = parse({"servers": SERVERS, "selector": "color = 'red'",
                     "filter": " eu, us ,", "filterMatchUnfiltered": "true"})
    assert options.filtered
    assert options.subscribe_headers() == {"selector": "color = 'red'",
                                           "x-stream-filter": "eu,us",
                                           "x-stream-match-unfiltered": "true"}
    assert parse({"servers": SERVERS, "filter": "eu"}).subscribe_headers()[
        "x-stream-match-unfiltered"] == "false"
    plain = parse({"servers": SERVERS})
    assert not plain.filtered and plain.subscribe_headers() == {}


def test_the_schema_has_headers_only_with_include_headers():
    assert not include_headers({}) and include_headers({"INCLUDEHEADERS": "True"})
    assert "headers" not in schema_ddl(False) and "headers map<string,string>" in schema_ddl(True)
    with pytest.raises(PairmqOptionError, match="option includeHeaders must be true or false"):
        include_headers({"includeheaders": "1"})


# ---------------------------------------------------------------- offsets and ranges


def test_starting_and_ending_positions():
    assert initial_offset("earliest", 5, 20) == 5
    assert initial_offset("latest", 5, 20) == 20
    assert initial_offset("12", 5, 20) == 12
    assert initial_offset("2", 5, 20) == 5  # retention removed it: start at the first kept
    assert ending_offset("latest", 5, 20) == 20 and ending_offset("9", 5, 20) == 9
    assert ending_offset("99", 5, 20) == 20 and ending_offset("earliest", 5, 20) == 5


def test_what_retention_removed_of_a_planned_range():
    assert removed(2, 5) == Range(2, 5)  # a query at 2, the stream's first kept 5
    assert removed(5, 5) is None and removed(9, 5) is None
    assert removed(0, 100, end=40) == Range(0, 40)  # a range wholly removed
    assert removed(50, 100, end=40) is None
    assert data_loss_message("/stream/orders", 0, 100) == (
        "offsets 0 to 99 of /stream/orders were removed by retention before they were read; "
        "set failOnDataLoss=false to skip them")
    assert data_loss_message("/stream/o", 7, 8).startswith("offset 7 of /stream/o was removed")


def test_min_offsets_per_trigger_waits_for_them_or_the_delay():
    delay = 60_000
    # no minimum: any new offset makes a batch; nothing new never does
    assert batch_due(1, None, delay, now_ms=0, last_batch_ms=0)
    assert not batch_due(0, None, delay, now_ms=0, last_batch_ms=None)
    assert not batch_due(0, 10, delay, now_ms=10**9, last_batch_ms=0)
    # the first batch of a run is not delayed (Kafka's first trigger)
    assert batch_due(3, 10, delay, now_ms=1000, last_batch_ms=None)
    # fewer than the minimum: wait, until the delay since the last batch passed
    assert not batch_due(9, 10, delay, now_ms=1000 + delay - 1, last_batch_ms=1000)
    assert batch_due(9, 10, delay, now_ms=1000 + delay, last_batch_ms=1000)
    assert batch_due(10, 10, delay, now_ms=1001, last_batch_ms=1000)


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
    assert cursor.lost == [Range(0, 6)]  # failOnDataLoss=false: kept for the log
    assert not cursor.done
    assert cursor.ended(10) and cursor.done
    assert cursor.lost == [Range(0, 6), Range(7, 10)]  # the marker came before 7..9
    assert RangeCursor(5, 5).done


def run(*offsets: int) -> list[tuple[int, ...]]:
    return [(o,) for o in offsets]


def test_the_cursor_takes_the_new_part_of_each_batch():
    cursor = RangeCursor(10, 30)
    assert cursor.accept_run(run(*range(10, 18))) == (0, 8)  # 10..17
    # a failover: delivery starts over at 10, in batches cut elsewhere
    assert cursor.accept_run(run(*range(10, 15))) == (0, 0)
    assert cursor.accept_run(run(*range(15, 20))) == (3, 5)  # 18, 19
    assert cursor.accept_run(run(*range(25, 35))) == (0, 5)  # 20..24 removed; 30 is past it
    assert cursor.lost == [Range(20, 25)]
    assert cursor.done and cursor.accept_run(run(30)) == (0, 0)


def test_the_cursor_takes_filtered_batches_by_each_record_s_offset():
    cursor = RangeCursor(10, 40, filtered=True, fail_on_loss=True)
    assert cursor.accept_run(run(12, 15, 16, 21)) == (0, 4)  # jumps: filtered, not lost
    assert cursor.next == 22
    # a failover: delivery starts over, the same records; then more past the range's end
    assert cursor.accept_run(run(12, 15, 16)) == (0, 0)
    assert cursor.accept_run(run(16, 21, 30, 39, 41)) == (2, 4)  # 30, 39
    assert cursor.done and cursor.lost == []
    ends_early = RangeCursor(0, 50, filtered=True, fail_on_loss=True)
    assert ends_early.accept_run(run(3)) == (0, 1)
    assert ends_early.ended(50)  # the rest did not match: no loss


def test_failing_on_data_loss_names_the_offsets_and_the_stream():
    cursor = RangeCursor(100, 200, "/stream/orders", fail_on_loss=True)
    with pytest.raises(DataLossError, match="offsets 100 to 149 of /stream/orders were "
                                            "removed by retention"):
        cursor.accept_run(run(*range(150, 160)))
    whole = RangeCursor(0, 40, "/stream/o", fail_on_loss=True)  # all of it removed
    with pytest.raises(DataLossError, match="offsets 0 to 39 of /stream/o"):
        whole.ended(40)
    single = RangeCursor(0, 40, "/stream/o", fail_on_loss=True)
    with pytest.raises(DataLossError, match="offsets 0 to 4 of /stream/o"):
        single.accept(5)
    # a filtered read learns it from the stream's first kept offset, not from the jumps
    filtered = RangeCursor(10, 40, "/stream/o", filtered=True, fail_on_loss=True)
    filtered.removed_below(5)  # nothing of the range removed
    with pytest.raises(DataLossError, match="offsets 10 to 24 of /stream/o"):
        filtered.removed_below(25)
    lenient = RangeCursor(10, 40, "/stream/o", filtered=True)
    lenient.removed_below(99)
    assert lenient.lost == [Range(10, 40)]


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
    without = StructType([f for f in spark_schema.fields if f.name != "headers"])
    assert to_arrow_schema(without, timezone="UTC") == ARROW_SCHEMA_NO_HEADERS
    bare = record_batch("s", [record], include_headers=False)
    assert bare.schema == ARROW_SCHEMA_NO_HEADERS
    assert bare.to_pylist() == [{k: v for k, v in batch.to_pylist()[0].items()
                                 if k != "headers"}]


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
