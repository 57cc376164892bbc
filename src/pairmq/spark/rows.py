"""Rows: the reader's schema and the Arrow record batches that carry it, and what the
writer takes from its input's rows. Pure (pyarrow only), so tested without Spark.

Arrow batches handed to Spark must match the schema exactly (names, int64, `string` not
`large_string`, timestamps in microseconds, UTC), or Spark refuses them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

SCHEMA_DDL = ("stream string, offset bigint, timestamp timestamp, message_id string, "
              "headers map<string,string>, body binary")
# without option includeHeaders (as Kafka's source, the default): no headers column
SCHEMA_DDL_NO_HEADERS = ("stream string, offset bigint, timestamp timestamp, "
                         "message_id string, body binary")

ARROW_SCHEMA = pa.schema([
    ("stream", pa.string()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("message_id", pa.string()),
    ("headers", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()),
])
ARROW_SCHEMA_NO_HEADERS = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))


def schema_ddl(include_headers: bool) -> str:
    """The reader's schema: the headers column only with option includeHeaders."""
    return SCHEMA_DDL if include_headers else SCHEMA_DDL_NO_HEADERS


# headers that are columns of their own, or belong to one delivery rather than the message
NOT_IN_HEADERS = frozenset({"x-stream-offset", "timestamp", "message-id", "destination",
                            "subscription", "ack", "content-length", "redelivered"})

Record = tuple[int, int | None, str, dict[str, str], bytes]  # offset, ms, id, headers, body


def record_of(headers: Mapping[str, str], body: bytes) -> Record:
    """A stream MESSAGE's frame headers and body -> the values of one row (but `stream`)."""
    stamp = headers.get("timestamp")
    return (int(headers["x-stream-offset"]),
            int(stamp) if stamp is not None and stamp.isdigit() else None,
            headers.get("message-id", ""),
            {k: v for k, v in headers.items() if k not in NOT_IN_HEADERS},
            body)


def record_batch(stream: str, records: list[Record], include_headers: bool = True
                 ) -> pa.RecordBatch:
    """Rows of one stream as one Arrow record batch of ARROW_SCHEMA (without the headers
    column, ARROW_SCHEMA_NO_HEADERS, unless `include_headers`)."""
    columns = [
        pa.array([stream] * len(records), pa.string()),
        pa.array([r[0] for r in records], pa.int64()),
        pa.array([None if r[1] is None else r[1] * 1000 for r in records],
                 pa.timestamp("us", tz="UTC")),
        pa.array([r[2] for r in records], pa.string()),
    ]
    if include_headers:
        columns.append(_headers_column(records))
    columns.append(pa.array([r[4] for r in records], pa.binary()))
    return pa.RecordBatch.from_arrays(
        columns, schema=ARROW_SCHEMA if include_headers else ARROW_SCHEMA_NO_HEADERS)


def _headers_column(records: list[Record]) -> pa.Array:
    """The headers maps, built from flat keys and values (no list of pairs per row)."""
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    for record in records:
        headers = record[3]
        keys.extend(headers)
        values.extend(headers.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()))


class InputSchemaError(ValueError):
    """The DataFrame written cannot be sent: the message says which column is wrong."""


def check_input(fields: Iterable[tuple[str, str]]) -> None:
    """(column name, Spark type name) of the written DataFrame: `body` (binary or string) is
    required, `headers` (map<string,string>) optional; other columns are ignored."""
    types = {name.lower(): type_name for name, type_name in fields}
    body = types.get("body")
    if body is None:
        raise InputSchemaError("format pairmq writes a column 'body' (binary or string); "
                               f"the DataFrame has {', '.join(types) or 'no columns'}")
    if body not in ("binary", "string"):
        raise InputSchemaError(f"column body must be binary or string, not {body}")
    headers = types.get("headers")
    if headers is not None and headers != "map<string,string>":
        raise InputSchemaError(f"column headers must be map<string,string>, not {headers}")


def body_bytes(value: Any) -> bytes:
    """A body cell: binary as is, a string in UTF-8, null as empty."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


# headers a row may not set: the writer and the client own them
RESERVED_HEADERS = frozenset({"dup-id", "receipt", "destination", "content-length",
                              "transaction", "persistent", "pairmq-producer",
                              "pairmq-producer-epoch", "pairmq-seq", "pairmq-batch"})


def row_headers(value: Any) -> dict[str, str]:
    """A headers cell (a map as a list of pairs, a dict, or null) -> the row's own headers
    of its message (the writer numbers the rows itself); reserved headers of the row are
    dropped."""
    pairs = value.items() if isinstance(value, Mapping) else (value or [])
    return {str(k): str(v) for k, v in pairs
            if k is not None and v is not None and str(k).lower() not in RESERVED_HEADERS}
