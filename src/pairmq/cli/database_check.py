"""`pairmq journal check --url URL --group GROUP`: the database's journal, checked."""

from __future__ import annotations

import asyncio
import os

import click

from pairmq.cli.admin import echo_json
from pairmq.store.database.check import DatabaseCheck, check_database
from pairmq.store.database.schema import redacted, schema_name


def check_database_journal(url: str, group: str, as_json: bool) -> int:
    """Print the check; the exit status (0: intact, 1: damaged, 2: not reachable)."""
    if not group:
        raise click.UsageError("--url needs --group: the pair's [ha] group (or, for a server "
                               "alone, its name), which names the schema")
    try:
        report = asyncio.run(_check(url, schema_name(group)))
    except Exception as e:
        click.echo(f"database {redacted(url)}: {e}", err=True)
        return 2
    if as_json:
        echo_json({"schema": report.schema, "version": report.version, "rows": report.rows,
                   "lease": report.lease, "ok": report.ok, "problems": report.problems,
                   "segments": [{"records": scan.records, "first_seq": scan.first_seq,
                                 "last_seq": scan.last_seq, "problem": scan.problem}
                                for scan in (report.journal.scans if report.journal else [])]})
        return 0 if report.ok else 1
    click.echo(f"schema {report.schema}: layout version {report.version}, {report.rows} rows")
    if report.lease:
        click.echo(f"lease: epoch {report.lease.get('epoch')}, holder "
                   f"{report.lease.get('holder') or 'nobody yet'}")
    for problem in report.problems:
        click.echo(f"DAMAGED: {problem}")
    journal = report.journal
    if journal is not None:
        for scan in journal.scans:
            if scan.problem is not None:
                click.echo(f"DAMAGED at seq {scan.last_seq + 1}: {scan.problem}")
    click.echo("journal is intact" if report.ok else "the journal is damaged")
    return 0 if report.ok else 1


async def _check(url: str, schema: str) -> DatabaseCheck:
    import asyncpg

    conn = await asyncpg.connect(url, password=os.environ.get("PAIRMQ_STORE_PASSWORD"),
                                 timeout=10)
    try:
        return await check_database(conn, schema)
    finally:
        await conn.close()
