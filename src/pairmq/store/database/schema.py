"""The database's tables, in a schema of their own per pair, and their version.

One schema per pair (named from `[ha] group`, or the server's name when it has no pair), so
several pairs share one database. Three tables:

- `pairmq_schema (version)`: the layout's version; a server refuses a newer one by name.
- `lease (id, holder, epoch, expires_ms)`: one row, the fenced lease (store/database/lease.py).
  `expires_ms` is a BIGINT computed with the database's own clock, never a server's, never
  a TIMESTAMP (which daylight-saving and time zones move).
- `journal (seq, data)`: the journal's records, framed as in the segment files
  (store/records.py), one row each; rows below the journal's oldest live record are deleted.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

SCHEMA_VERSION = 1
# the database's clock in ms: clock_timestamp() moves within a transaction, now() does not
DB_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
_NAME_RE = re.compile(r"[^a-z0-9_]")


class SchemaError(Exception):
    """The database holds what this server cannot use (a newer layout, another program's)."""


def schema_name(group: str) -> str:
    """`pairmq_` and the group (or server) name in lower case, other characters as `_`: an
    identifier PostgreSQL takes without quoting surprises (at most 63 bytes)."""
    return ("pairmq_" + _NAME_RE.sub("_", group.lower()))[:63]


def create_statements(schema: str) -> list[str]:
    """Idempotent: run by every server at start, inside one transaction."""
    return [
        f"CREATE SCHEMA IF NOT EXISTS {schema}",
        f"CREATE TABLE IF NOT EXISTS {schema}.pairmq_schema (version INTEGER NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {schema}.lease (id INTEGER PRIMARY KEY CHECK (id = 1), "
        "holder TEXT NOT NULL, epoch BIGINT NOT NULL, expires_ms BIGINT NOT NULL)",
        f"INSERT INTO {schema}.lease VALUES (1, '', 0, 0) ON CONFLICT (id) DO NOTHING",
        f"CREATE TABLE IF NOT EXISTS {schema}.journal (seq BIGINT PRIMARY KEY, "
        "data BYTEA NOT NULL)",
        # the journal's rows are written once and deleted in order: no fill-factor room kept
        f"ALTER TABLE {schema}.journal ALTER COLUMN data SET STORAGE EXTERNAL",
    ]


def version_problem(found: list[int], schema: str) -> str | None:
    """Why the schema's recorded versions forbid using it (None: it may be used)."""
    if len(found) > 1:
        return f"schema {schema} records {len(found)} versions in pairmq_schema: it is damaged"
    if found and found[0] > SCHEMA_VERSION:
        return (f"schema {schema} has layout version {found[0]}, newer than this pairmq's "
                f"{SCHEMA_VERSION}: upgrade this server, or point it at another database")
    return None


def redacted(url: str) -> str:
    """The URL without its password, for logs and /status."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))
