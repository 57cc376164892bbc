"""`pairmq journal check --url`: the database's journal checked offline, as a file journal
is: every row written out from one snapshot (store/database/restore.py) and scanned record
by record (store/check.py), each row's key matched against its record's own sequence
number, and the schema's version and lease reported."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pairmq.store.check import CheckReport, check_journal
from pairmq.store.database.restore import LocalCopy
from pairmq.store.database.schema import version_problem
from pairmq.store.records import RECORD_HEADER


@dataclass
class DatabaseCheck:
    schema: str
    version: int | None
    lease: dict[str, Any]
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    journal: CheckReport | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and (self.journal is None or self.journal.damage is None)


async def check_database(conn: Any, schema: str, segment_bytes: int = 64 << 20
                         ) -> DatabaseCheck:
    found = await conn.fetchval("SELECT count(*) FROM information_schema.tables WHERE "
                                "table_schema = $1 AND table_name = 'journal'", schema)
    if not found:
        return DatabaseCheck(schema, None, {}, problems=[f"schema {schema} holds no journal"])
    versions = [r[0] for r in await conn.fetch(f"SELECT version FROM {schema}.pairmq_schema")]
    lease = await conn.fetchrow(f"SELECT holder, epoch, expires_ms FROM {schema}.lease")
    report = DatabaseCheck(schema, versions[0] if versions else None,
                           dict(lease) if lease is not None else {})
    problem = version_problem(versions, schema)
    if problem:
        report.problems.append(problem)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        async for seq, data in conn.cursor(f"SELECT seq, data FROM {schema}.journal "
                                           "ORDER BY seq", prefetch=2000):
            report.rows += 1
            if len(data) < RECORD_HEADER.size:
                report.problems.append(f"row {seq} is {len(data)} bytes: not a record")
            elif RECORD_HEADER.unpack_from(data)[2] != seq:
                report.problems.append(f"row {seq} holds record "
                                       f"{RECORD_HEADER.unpack_from(data)[2]}")
            if len(report.problems) >= 10:
                return report
    with tempfile.TemporaryDirectory(prefix="pairmq-check-") as where:
        copy = LocalCopy(Path(where) / "journal", segment_bytes)
        await copy.fill(conn, schema)
        await copy.seal()
        report.journal = check_journal(Path(where) / "journal")
    return report
