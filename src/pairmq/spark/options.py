"""The data source's options: one table drives parsing, checking, the error messages and
docs/spark.md's tables, as `pairmq.client.options.OPTIONS` does for the client.

Options are named as Spark's Kafka source names them wherever the two mean the same
(`startingOffsets`, `maxOffsetsPerTrigger`, `failOnDataLoss`...; KAFKA_OPTIONS maps every
Kafka option to pairmq's), so a Structured Streaming user writes what they write for every
Kafka source. An old pairmq name is refused with its new name (RENAMED), not kept as a second
spelling.

Spark lower-cases option keys before the data source sees them, so every lookup here is
case-insensitive; a key that is neither ours nor a client option is refused by name (a typo
must not silently fall back to a default).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pairmq.client.errors import ClientError
from pairmq.client.options import OPTIONS as CLIENT_OPTIONS
from pairmq.client.options import parse_options
from pairmq.client.streams import stream_destination

DESTINATION_PREFIXES = ("/queue/", "/topic/", "/stream/")
CONNECT_ROUNDS = 40  # rounds over the servers at connect: about 20 s with the client defaults
# Options Spark itself passes along with the user's (a named query passes its name).
SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})
# Kafka's JSON offsets: -2 is the earliest offset, -1 the latest
KAFKA_EARLIEST, KAFKA_LATEST = -2, -1


class PairmqOptionError(ValueError):
    """A wrong or unknown option of the `pairmq` data source; the message names it."""


def _positive(value: int) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def _not_negative(value: int) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def _per_frame(value: int) -> str | None:
    """Messages in one batched frame (x-stream-batch, pairmq-batch)."""
    return None if 1 <= value <= 10000 else f"must be from 1 to 10000, got {value}"


def _not_empty(value: str) -> str | None:
    return None if value else "must not be empty"


def _destination(value: str) -> str | None:
    if value.startswith(DESTINATION_PREFIXES) and value.rstrip("/") not in (
            p.rstrip("/") for p in DESTINATION_PREFIXES):
        return None
    return f"must start with {', '.join(DESTINATION_PREFIXES)} and name one, got {value!r}"


# ---------------------------------------------------------------- values of their own syntax

_DURATION = re.compile(r"(\d+)\s*(ms|s|m|min|h|d)?")
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
            "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """A duration as Spark writes one (`maxTriggerDelay`: 15m, 30s, 1h, 500ms, 2d, or a
    number of ms) -> ms. ValueError names what is accepted."""
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        raise ValueError(f"must be a duration such as 30s, 5m, 15m, 1h, 500ms or a number of "
                         f"ms, got {text!r}")
    return int(found.group(1)) * _UNIT_MS[found.group(2)]


def _offset_word(value: Any, option: str) -> str:
    """One offset of a position: an integer >= 0, or Kafka's -2 (earliest) / -1 (latest)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value == KAFKA_EARLIEST:
            return "earliest"
        if value == KAFKA_LATEST:
            return "latest"
        if value >= 0:
            return str(value)
    raise ValueError(f"option {option}: an offset is an integer >= 0, or -2 (earliest) or -1 "
                     f"(latest) as in Kafka's JSON, got {value!r}")


def parse_position(option: str, text: str) -> tuple[str | None, str]:
    """`startingOffsets` / `endingOffsets` -> (the stream its JSON names or None, the position:
    "earliest", "latest" or an offset as digits).

    Accepted: earliest, latest, an offset, `{"orders": 42}` (stream -> offset) and Kafka's
    partition form `{"orders": {"0": 42}}` (a stream has one partition, "0"); in JSON -2 is
    earliest and -1 latest, as in Kafka's. ValueError names the option and the forms."""
    word = text.strip()
    if word.lower() in ("earliest", "latest"):
        return None, word.lower()
    if word.isascii() and word.isdigit():
        return None, str(int(word))
    forms = (f"option {option} must be earliest, latest, an offset (an integer >= 0) or JSON "
             f"such as {{\"orders\": 42}} or {{\"orders\": {{\"0\": 42}}}}, got {text!r}")
    if not word.startswith("{"):
        raise ValueError(forms)
    try:
        parsed = json.loads(word)
    except ValueError:
        raise ValueError(forms) from None
    if not isinstance(parsed, dict) or len(parsed) != 1:
        raise ValueError(f"option {option}: the JSON names one stream (a reader reads one), "
                         f"got {text!r}")
    ((stream, value),) = parsed.items()
    if isinstance(value, dict):
        if set(value) != {"0"}:
            raise ValueError(f"option {option}: a stream has one partition, \"0\"; got "
                             f"partitions {', '.join(map(repr, value)) or 'none'} in {text!r}")
        value = value["0"]
    return str(stream), _offset_word(value, option)


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Option:
    name: str  # as documented (camelCase); matched case-insensitively
    type: type
    default: Any
    used_by: str  # "all", "read", "stream", "batch", "write" (docs only)
    help: str
    check: Callable[[Any], str | None] | None = None
    # the text to value, for a value of its own syntax (ValueError: its message names it)
    convert: Callable[[str], Any] | None = None
    shown_default: str | None = None  # the docs' default, when not `default` as is


OPTIONS: tuple[Option, ...] = (
    Option("servers", str, None, "all",
           "required: the pair, as a client URL: failover:(stomp://h1:61613,stomp://h2:61614)"
           " or h1:61613,h2:61614"),
    Option("login", str, None, "all", "user name on CONNECT"),
    Option("passcode", str, None, "all", "password on CONNECT"),
    Option("stream", str, None, "read", "required to read: the stream, NAME or /stream/NAME"),
    Option("startingOffsets", str, None, "read",
           "where a new query starts: earliest, latest, an offset, or JSON "
           "{\"NAME\": offset} or {\"NAME\": {\"0\": offset}} (-2 earliest, -1 latest); a "
           "query restarted from its checkpoint ignores it",
           shown_default="latest (a batch read: earliest)"),
    Option("startingTimestamp", int, None, "read",
           "where a new query (or a batch read) starts: the first record appended at or "
           "after this time (ms since the epoch); not with startingOffsets", _not_negative),
    Option("endingOffsets", str, "latest", "batch",
           "batch reads: where to stop (exclusive): latest, an offset, or JSON as "
           "startingOffsets"),
    Option("endingTimestamp", int, None, "batch",
           "batch reads: stop before the first record appended at or after this time (ms "
           "since the epoch); not with endingOffsets", _not_negative),
    Option("failOnDataLoss", bool, True, "read",
           "fail when offsets the query still had to read were removed by retention (false: "
           "skip them, with a WARNING naming them)"),
    Option("maxOffsetsPerTrigger", int, None, "stream",
           "at most this many offsets per micro-batch (default: all available)", _positive),
    Option("minOffsetsPerTrigger", int, None, "stream",
           "do not start a micro-batch before this many offsets are available, or "
           "maxTriggerDelay passed since the last batch", _positive),
    Option("maxTriggerDelay", int, 15 * 60_000, "stream",
           "with minOffsetsPerTrigger: the longest a batch waits for them (30s, 5m, 1h, "
           "500ms or a number of ms)", convert=parse_duration_ms, shown_default="15m"),
    Option("minPartitions", int, 1, "read",
           "a micro-batch is split into at least this many offset ranges (tasks)", _positive),
    Option("maxRecordsPerPartition", int, 50000, "read",
           "ranges hold at most this many offsets (more partitions past it)", _positive),
    Option("includeHeaders", bool, False, "read",
           "add the column headers (map<string,string>): the sender's headers"),
    Option("selector", str, None, "read",
           "a JMS message selector (SUBSCRIBE header selector): the server skips the "
           "records it does not match", _not_empty),
    Option("filter", str, None, "read",
           "comma-separated filter values (x-stream-filter): the server skips the records "
           "whose x-stream-filter-value is none of them"),
    Option("filterMatchUnfiltered", bool, False, "read",
           "with filter: also read the records that have no filter value "
           "(x-stream-match-unfiltered)"),
    Option("mustExist", bool, True, "read",
           "an unknown stream is an error (false: reading creates it, empty)"),
    Option("group", str, None, "read",
           "a consumer group whose offset is stored on each committed batch (a hint for "
           "retention; the checkpoint decides what is read)"),
    Option("prefetch", int, 5000, "read",
           "messages the server sends ahead of the reader (prefetch-count)", _positive),
    Option("batchRecords", int, 1000, "read",
           "stream records per MESSAGE frame (x-stream-batch, 1 to 10000); a frame carries "
           "at most `prefetch` of them", _per_frame),
    Option("readTimeout", int, 120000, "read",
           "ms a task waits for the next message of its range before it fails", _positive),
    Option("destination", str, None, "write",
           "required to write: /queue/NAME, /topic/NAME or /stream/NAME", _destination),
    Option("sendBatchRecords", int, 1000, "write",
           "rows per SEND frame (pairmq-batch, 1 to 10000; a frame is also sent once it packs 1 "
           "MiB); the server confirms a frame's rows together",
           _per_frame),
    Option("queryId", str, None, "write",
           "the first part of the producer id that numbers the rows (default: the streaming "
           "query's id, which a restart from the checkpoint keeps; for a batch write, a new "
           "id per write)"),
    Option("testing.failAfterRows", int, None, "write",
           "tests only: the first attempt of partition 0's task fails after sending (and "
           "confirming) this many rows, so that Spark retries it", _not_negative),
)

# pairmq's old names: refused with the new one (issue 23), never a second spelling
RENAMED = {"startingOffset": "startingOffsets", "endingOffset": "endingOffsets",
           "maxRecordsPerBatch": "maxOffsetsPerTrigger", "partitions": "minPartitions"}

# Spark's Kafka source and sink options (Spark 4.x docs) -> pairmq's option ("" = none), and
# what differs. docs/spark.md shows it (kafka_table); an unknown option that is Kafka's is
# refused naming pairmq's counterpart.
KAFKA_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("kafka.bootstrap.servers", "servers",
     "the pair as a failover URL; `kafka.*` settings have no counterpart, the client's "
     "options (docs/clients.md) pass through by name"),
    ("subscribe", "stream", "one stream per reader: union DataFrames to read several"),
    ("assign", "stream", "a stream has one partition"),
    ("subscribePattern", "", "no patterns: name the stream"),
    ("startingOffsets", "startingOffsets",
     "the same forms; a stream has the one partition \"0\"; a batch read may also start at "
     "latest (it reads nothing)"),
    ("startingTimestamp", "startingTimestamp",
     "the same (ms); refused together with startingOffsets, where Kafka lets the timestamp "
     "win; no record at or after it: the query starts at the next offset appended"),
    ("startingOffsetsByTimestamp", "startingTimestamp", "one partition: one timestamp"),
    ("startingOffsetsByTimestampStrategy", "",
     "no record at or after the timestamp starts at the stream's end (Kafka's `latest`)"),
    ("endingOffsets", "endingOffsets", "the same (batch reads); earliest (-2) reads nothing"),
    ("endingTimestamp", "endingTimestamp", "the same (batch reads)"),
    ("endingOffsetsByTimestamp", "endingTimestamp", "one partition: one timestamp"),
    ("failOnDataLoss", "failOnDataLoss",
     "the same: offsets removed by retention before the query read them"),
    ("kafkaConsumer.pollTimeoutMs", "readTimeout", "ms a task waits for its next message"),
    ("fetchOffset.numRetries", "initialConnectAttempts",
     "client options: the failover client retries (docs/clients.md)"),
    ("fetchOffset.retryIntervalMs", "retryInterval", "a client option"),
    ("maxOffsetsPerTrigger", "maxOffsetsPerTrigger", "the same"),
    ("minOffsetsPerTrigger", "minOffsetsPerTrigger",
     "the same (not applied by Trigger.AvailableNow, which reads to its end)"),
    ("maxTriggerDelay", "maxTriggerDelay", "the same (default 15m)"),
    ("minPartitions", "minPartitions", "the same: ranges of one stream (default 1)"),
    ("maxRecordsPerPartition", "maxRecordsPerPartition",
     "the same; default 50000 (Kafka: none)"),
    ("groupIdPrefix", "", "no Kafka consumer group: the checkpoint decides what is read"),
    ("kafka.group.id", "group",
     "not the same: `group` stores the query's committed offset on the stream, which a "
     "protecting group keeps from retention"),
    ("includeHeaders", "includeHeaders",
     "the same option; the column is map<string,string>, not array<struct<key,value>>"),
    ("topic", "destination", "writing: any /queue/, /topic/ or /stream/"),
)

_OURS = {o.name.lower(): o for o in OPTIONS}
_RENAMED = {old.lower(): (old, new) for old, new in RENAMED.items()}
_KAFKA = {kafka.lower(): (kafka, ours, note) for kafka, ours, note in KAFKA_OPTIONS}
# a client option by its URL name or keyword name, either case (Spark lower-cases keys)
_CLIENT = {**{o.url_name.lower(): o.name for o in CLIENT_OPTIONS},
           **{o.name.lower(): o.name for o in CLIENT_OPTIONS}}


def _convert(option: Option, raw: str) -> Any:
    text = raw.strip()
    if option.convert is not None:
        try:
            value: Any = option.convert(text)
        except ValueError as e:
            raise PairmqOptionError(f"option {option.name} {e}") from None
    elif option.type is int:
        try:
            value = int(text)
        except ValueError:
            raise PairmqOptionError(f"option {option.name} must be an integer, got {raw!r}"
                                    ) from None
    elif option.type is bool:
        if text.lower() not in ("true", "false"):
            raise PairmqOptionError(f"option {option.name} must be true or false, got {raw!r}")
        value = text.lower() == "true"
    else:
        value = text
    if option.check is not None:
        problem = option.check(value)
        if problem:
            raise PairmqOptionError(f"option {option.name} {problem}")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """Every option, resolved and checked; picklable (plain values only)."""

    values: Mapping[str, Any]  # by our option name
    client: Mapping[str, str]  # client options (keyword name -> raw text), passed through
    given: frozenset[str] = field(default_factory=frozenset)  # names the user set

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def stream(self) -> str:
        """`/stream/NAME` of option stream (required)."""
        name = self.require("stream")
        try:
            return stream_destination(name)
        except ClientError as e:
            raise PairmqOptionError(f"option stream: {e}") from None

    @property
    def stream_name(self) -> str:
        return self.stream[len("/stream/"):]

    @property
    def filtered(self) -> bool:
        """Whether the server skips records (selector, filter): delivered offsets have gaps."""
        return self.values["selector"] is not None or self.values["filter"] is not None

    def subscribe_headers(self) -> dict[str, str]:
        """The SUBSCRIBE headers of options selector and filter (none without them)."""
        headers = {}
        if self.values["selector"] is not None:
            headers["selector"] = self.values["selector"]
        if self.values["filter"] is not None:
            headers["x-stream-filter"] = self.values["filter"]
            headers["x-stream-match-unfiltered"] = \
                "true" if self.values["filterMatchUnfiltered"] else "false"
        return headers

    def require(self, name: str) -> Any:
        value = self.values[name]
        if value is None:
            raise PairmqOptionError(f"option {name} is required (.option({name!r}, ...))")
        return value

    def connect_arguments(self) -> tuple[str, dict[str, Any]]:
        """(url, keyword arguments) for `pairmq.client.connect`. A task that starts while
        the pair fails over must wait for the backup rather than fail, so connecting tries
        CONNECT_ROUNDS rounds unless the URL or an option says otherwise."""
        keywords: dict[str, Any] = dict(self.client)
        url = self.require("servers")
        if "initial_connect_attempts" not in keywords and \
                "initialconnectattempts" not in url.lower():
            keywords["initial_connect_attempts"] = CONNECT_ROUNDS
        if url.strip().lower().startswith("cluster:") and "cluster_member" not in keywords \
                and "clustermember" not in url.lower():
            # every task of a query on one member: a member's dup-ids and producer
            # sequences, which make retries exact, are that member's (docs/spark.md)
            keywords["cluster_member"] = 0
        for name in ("login", "passcode"):
            if self.values[name] is not None:
                keywords[name] = self.values[name]
        return url, keywords


def _unknown(key: str) -> PairmqOptionError:
    lowered = key.lower()
    if lowered in _RENAMED:
        old, new = _RENAMED[lowered]
        return PairmqOptionError(f"option {old} was renamed {new}, as Spark's Kafka source "
                                 f"names it: .option({new!r}, ...)")
    if lowered in _KAFKA:
        kafka, ours, note = _KAFKA[lowered]
        counterpart = f"its counterpart is option {ours}" if ours else "it has no counterpart"
        return PairmqOptionError(f"option {kafka} is Spark's Kafka source's; in format pairmq "
                                 f"{counterpart} ({note}; docs/spark.md)")
    return PairmqOptionError(
        f"unknown option {key!r} for format pairmq; known: "
        + ", ".join(o.name for o in OPTIONS)
        + ", and the client's options (" + ", ".join(o.url_name for o in CLIENT_OPTIONS)
        + ")")


def _resolve_position(values: dict[str, Any], name: str) -> None:
    """A position option's text -> "earliest", "latest" or digits, its JSON's stream checked
    against option stream (when there is one: without it, the read is refused anyway)."""
    try:
        named, position = parse_position(name, values[name])
    except ValueError as e:
        raise PairmqOptionError(str(e)) from None
    if named is not None and values["stream"] is not None:
        try:
            same = stream_destination(named) == stream_destination(values["stream"])
        except ClientError:
            same = False
        if not same:
            raise PairmqOptionError(
                f"option {name} names stream {named!r}, but option stream is "
                f"{values['stream']!r}: a reader reads the one stream of option stream")
    values[name] = position


def parse(options: Mapping[str, str], *, batch: bool = False) -> SourceOptions:
    """Check every option (any case). `batch`: a batch read, whose default start is earliest.

    The servers URL and client options are checked here too, on the driver, so a bad one
    fails the query at once with its name instead of failing every task."""
    values: dict[str, Any] = {o.name: o.default for o in OPTIONS}
    given: set[str] = set()
    client: dict[str, str] = {}
    for key, raw in options.items():
        lowered = key.lower()
        if lowered in SPARK_KEYS:  # set by Spark itself, not by the user for us
            continue
        option = _OURS.get(lowered)
        if option is not None:
            values[option.name] = _convert(option, str(raw))
            given.add(option.name)
        elif lowered in _CLIENT:
            client[_CLIENT[lowered]] = str(raw)
        else:
            raise _unknown(key)
    for first, second in (("startingOffsets", "startingTimestamp"),
                          ("endingOffsets", "endingTimestamp")):
        if first in given and second in given:
            raise PairmqOptionError(
                f"options {first} and {second} both say where to read: give one (Kafka "
                f"lets {second} win; format pairmq refuses the pair)")
    if values["startingOffsets"] is None:
        values["startingOffsets"] = "earliest" if batch else "latest"
    _resolve_position(values, "startingOffsets")
    _resolve_position(values, "endingOffsets")
    low, high = values["minOffsetsPerTrigger"], values["maxOffsetsPerTrigger"]
    if low is not None and high is not None and low > high:
        raise PairmqOptionError(f"option minOffsetsPerTrigger ({low}) must not be above "
                                f"maxOffsetsPerTrigger ({high})")
    if values["filter"] is not None:
        wanted = [v.strip() for v in values["filter"].split(",") if v.strip()]
        if not wanted:
            raise PairmqOptionError("option filter names no value (comma-separated values, "
                                    f"got {values['filter']!r})")
        values["filter"] = ",".join(wanted)
    elif "filterMatchUnfiltered" in given:
        raise PairmqOptionError("option filterMatchUnfiltered goes with option filter")
    parsed = SourceOptions(values, client, frozenset(given))
    if values["servers"] is not None:
        url, keywords = parsed.connect_arguments()
        try:
            parse_options(url, keywords)
        except ClientError as e:
            raise PairmqOptionError(f"option servers or a client option: {e}") from None
    return parsed


def include_headers(options: Mapping[str, str]) -> bool:
    """Option includeHeaders of raw options (any case): the schema depends on it."""
    for key, raw in options.items():
        if key.lower() == "includeheaders":
            return bool(_convert(_OURS["includeheaders"], str(raw)))
    return False


def options_table() -> str:
    """docs/spark.md's table of options, from OPTIONS (tests check the two agree)."""
    rows = ["| option | used by | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        if o.shown_default is not None:
            default = o.shown_default
        elif o.default is None:
            default = ""
        elif isinstance(o.default, bool):
            default = str(o.default).lower()
        else:
            default = str(o.default)
        rows.append(f"| `{o.name}` | {o.used_by} | {default} | {o.help} |")
    return "\n".join(rows)


def kafka_table() -> str:
    """docs/spark.md's table of Spark's Kafka options and their pairmq counterparts."""
    rows = ["| Kafka source option | pairmq option | |", "|---|---|---|"]
    for kafka, ours, note in KAFKA_OPTIONS:
        rows.append(f"| `{kafka}` | {f'`{ours}`' if ours else '—'} | {note} |")
    return "\n".join(rows)
