"""The data source's options: one table drives parsing, checking, the error messages and
docs/spark.md's table, as `pairmq.client.options.OPTIONS` does for the client.

Spark lower-cases option keys before the data source sees them, so every lookup here is
case-insensitive; a key that is neither ours nor a client option is refused by name (a typo
must not silently fall back to a default).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pairmq.client.errors import ClientError
from pairmq.client.options import OPTIONS as CLIENT_OPTIONS
from pairmq.client.options import parse_options
from pairmq.client.streams import stream_destination

DESTINATION_PREFIXES = ("/queue/", "/topic/", "/stream/")
CONNECT_ROUNDS = 40  # rounds over the servers at connect: about 20 s with the client defaults
# Options Spark itself passes along with the user's (a named query passes its name).
SPARK_KEYS = frozenset({"path", "checkpointlocation", "queryname"})


class PairmqOptionError(ValueError):
    """A wrong or unknown option of the `pairmq` data source; the message names it."""


def _positive(value: int) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def _per_frame(value: int) -> str | None:
    """Messages in one batched frame (x-stream-batch, pairmq-batch)."""
    return None if 1 <= value <= 10000 else f"must be from 1 to 10000, got {value}"


def _position(value: str) -> str | None:
    if value in ("earliest", "latest") or value.isdigit():
        return None
    return f"must be earliest, latest or an offset (an integer >= 0), got {value!r}"


def _ending(value: str) -> str | None:
    if value == "latest" or value.isdigit():
        return None
    return f"must be latest or an offset (an integer >= 0), got {value!r}"


def _destination(value: str) -> str | None:
    if value.startswith(DESTINATION_PREFIXES) and value.rstrip("/") not in (
            p.rstrip("/") for p in DESTINATION_PREFIXES):
        return None
    return f"must start with {', '.join(DESTINATION_PREFIXES)} and name one, got {value!r}"


@dataclass(frozen=True)
class Option:
    name: str  # as documented (camelCase); matched case-insensitively
    type: type
    default: Any
    used_by: str  # "all", "read", "write" (docs only: an option of the other side is harmless)
    help: str
    check: Callable[[Any], str | None] | None = None


OPTIONS: tuple[Option, ...] = (
    Option("servers", str, None, "all",
           "required: the pair, as a client URL: failover:(stomp://h1:61613,stomp://h2:61614)"
           " or h1:61613,h2:61614"),
    Option("login", str, None, "all", "user name on CONNECT"),
    Option("passcode", str, None, "all", "password on CONNECT"),
    Option("stream", str, None, "read", "required to read: the stream, NAME or /stream/NAME"),
    Option("startingOffset", str, "latest", "read",
           "where a new query starts: earliest, latest or an offset (a batch read's default "
           "is earliest); a query restarted from its checkpoint ignores it", _position),
    Option("endingOffset", str, "latest", "read",
           "batch reads: the offset to stop before (exclusive), or latest", _ending),
    Option("maxRecordsPerBatch", int, None, "read",
           "at most this many records per micro-batch (default: all available)", _positive),
    Option("partitions", int, 1, "read",
           "a micro-batch is split into at least this many offset ranges (tasks)", _positive),
    Option("maxRecordsPerPartition", int, 50000, "read",
           "ranges hold at most this many offsets (more partitions past it)", _positive),
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
           "confirming) this many rows, so that Spark retries it", lambda v: None
           if v >= 0 else f"must be >= 0, got {v}"),
)

_OURS = {o.name.lower(): o for o in OPTIONS}
# a client option by its URL name or keyword name, either case (Spark lower-cases keys)
_CLIENT = {**{o.url_name.lower(): o.name for o in CLIENT_OPTIONS},
           **{o.name.lower(): o.name for o in CLIENT_OPTIONS}}


def _convert(option: Option, raw: str) -> Any:
    text = raw.strip()
    if option.type is int:
        try:
            value: Any = int(text)
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
        for name in ("login", "passcode"):
            if self.values[name] is not None:
                keywords[name] = self.values[name]
        return url, keywords


def parse(options: Mapping[str, str], *, batch: bool = False) -> SourceOptions:
    """Check every option (any case). `batch`: a batch read, whose default start is earliest.

    The servers URL and client options are checked here too, on the driver, so a bad one
    fails the query at once with its name instead of failing every task."""
    values: dict[str, Any] = {o.name: o.default for o in OPTIONS}
    if batch:
        values["startingOffset"] = "earliest"
    client: dict[str, str] = {}
    for key, raw in options.items():
        lowered = key.lower()
        if lowered in SPARK_KEYS:  # set by Spark itself, not by the user for us
            continue
        option = _OURS.get(lowered)
        if option is not None:
            values[option.name] = _convert(option, str(raw))
        elif lowered in _CLIENT:
            client[_CLIENT[lowered]] = str(raw)
        else:
            raise PairmqOptionError(
                f"unknown option {key!r} for format pairmq; known: "
                + ", ".join(o.name for o in OPTIONS)
                + ", and the client's options (" + ", ".join(o.url_name for o in CLIENT_OPTIONS)
                + ")")
    parsed = SourceOptions(values, client)
    if values["servers"] is not None:
        url, keywords = parsed.connect_arguments()
        try:
            parse_options(url, keywords)
        except ClientError as e:
            raise PairmqOptionError(f"option servers or a client option: {e}") from None
    return parsed


def options_table() -> str:
    """docs/spark.md's table of options, from OPTIONS (tests check the two agree)."""
    rows = ["| option | used by | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        default = "" if o.default is None else str(o.default).lower() \
            if isinstance(o.default, bool) else str(o.default)
        rows.append(f"| `{o.name}` | {o.used_by} | {default} | {o.help} |")
    return "\n".join(rows)
